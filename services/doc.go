// Package services holds the gRPC plumbing shared by every nodefence binary: server bootstrap
// (server), client dialing (dial), certificate loading (tlsfiles) and the single mapping of domain
// errors to gRPC status codes (fault). It contains no domain logic.
package services
