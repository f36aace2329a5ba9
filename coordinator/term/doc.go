// Package term is the pure core of what a leadership term decides beside the engine (issue 23,
// item 1), in the style of coordinator/engine: coordinator/app Steps it, persists what its Ready
// says, and only then acts. It reads no clock and does no I/O; its callers hand it the time, the
// records they read and the fencing policy's verdict.
//
// Its rules: the admission of the engine's automatic fence requests (Admit: whether the Kubernetes
// fencing policy holds a request back, what the policy adds to its evidence, the record created),
// the wrong-machine alarm on a record (fencing.WrongMachine, on the engine's proof verdict), and the
// would-release note on an observed record (fencing.WouldRelease). The fence runner's writes and
// the API's (operator fences, acknowledgements) are not yet the core's.
//
// # The Ready contract
//
// One goroutine owns a Core (in coordinator/app, the term's record writer); it is the one writer
// of the records and audit entries the core decides.
//
//  1. Start: New(epoch) with the term's epoch; every Write carries it.
//  2. Feed: Step each input — Verdict, WouldRelease, Request (after asking the fencing policy).
//  3. Collect: call Ready. If it is Empty, go back to step 2.
//  4. Persist: read the records of Ready.Reads; write Ready.Writes, each under its Epoch, an
//     update compare-and-swapped on its Revision; append Ready.Audit under the epoch. If a write is
//     refused because the epoch is no longer the leader's, Step Deposed and stop: act on nothing,
//     do not Advance.
//  5. Act: hand Ready.Acts on. An Act is only ever made of writes persisted in an earlier round
//     (or of none needed), so nothing acts before its record is persisted.
//  6. Acknowledge: Advance, then Step the outcomes of step 4 — RecordRead for each record read,
//     Persisted for each write, and for a write that lost its compare-and-swap the record read
//     again (Conflict), on which the core decides again (at most MaxConflicts times). No Step may
//     run between Ready and Advance. Go back to step 3.
package term
