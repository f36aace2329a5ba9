// Package services holds the gRPC plumbing shared by every nodefence binary: server bootstrap with
// authorization (server), caller identities and who may call what (identity), client dialing (dial),
// certificate loading (tlsfiles), the flow-control windows and reusing codec of busy streams (wire),
// what every main does alike (cli: logging, signals, startup errors; gctune: GC target and memory
// limit), the build's version (buildinfo), the single mapping of errors to gRPC status codes
// (fault), and which names hold secrets and how their values are masked (redact: used by the
// drivers, the coordinator and fencectl). It contains no domain logic but one rule both sides must
// apply alike: wdlease, when an agent may feed its watchdog and when the leader may take a silent
// node as self-fenced. cli.EnumWord, which names protobuf enum values for people, is the one piece
// of cli that is not about a main.
package services
