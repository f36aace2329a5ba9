// Package services holds the gRPC plumbing shared by every nodefence binary: server bootstrap with
// authorization (server), caller identities and who may call what (identity), client dialing (dial),
// certificate loading (tlsfiles), the flow-control windows and reusing codec of busy streams (wire),
// what every main does alike (cli: logging, signals, GC target) and the single mapping of errors to
// gRPC status codes (fault). It contains no domain logic.
package services
