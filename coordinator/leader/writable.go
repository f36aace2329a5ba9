package leader

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A leader that cannot write serves nobody: no fence record, no pause, no new agent's state can be
// stored, while its lease (kept alive without writing) stops every other replica from trying. So
// a term also ends when etcd refuses its writes:
//
//   - at once when etcd says it will refuse every write until an operator acts: out of space
//     (the NOSPACE alarm, raised when the database reaches its quota) or a corrupt member;
//   - when every guarded write of the term failed, none succeeding, for four fifths of the lease
//     (writes time out while reads still work, a lost quorum say).
//
// The term's guard then resigns, logs an error and calls Elector.OnUnwritable (the coordinator's
// alarm: a metric and the log) with the reason. A replica keeps campaigning; while etcd is out of
// space no replica can (a campaign needs a new lease), and the alarm says why.

// writeState follows a term's guarded writes for its guard.
type writeState struct {
	failing  atomic.Int64 // guarded writes failed since the last success
	ok       atomic.Bool  // a guarded write succeeded since the guard last looked
	refusing chan string  // why etcd refuses every write from now on; buffered 1
}

// Reasons a term ends unwritable (Elector.OnUnwritable).
const (
	UnwritableNoSpace = "nospace"
	UnwritableCorrupt = "corrupt"
	UnwritableFailing = "writes-failing"
)

// noteWrite records the outcome of one guarded write.
func (w *writeState) noteWrite(ctx context.Context, err error) {
	switch {
	case err == nil:
		w.failing.Store(0)
		w.ok.Store(true)
	case ctx.Err() != nil:
		// The caller gave up or the term ended: says nothing about etcd.
	case NoSpace(err):
		w.refuse(UnwritableNoSpace)
	case errors.Is(err, rpctypes.ErrCorrupt) || status.Code(err) == codes.DataLoss || strings.Contains(err.Error(), "corrupt cluster"):
		w.refuse(UnwritableCorrupt)
	case requestFault(err):
		// etcd refuses this request (too large, too many operations), not writes.
	default:
		w.failing.Add(1)
	}
}

func (w *writeState) refuse(reason string) {
	select {
	case w.refusing <- reason:
	default:
	}
}

// NoSpace reports whether err is etcd's "database space exceeded": the NOSPACE alarm is raised and
// etcd refuses every write that adds data until an operator frees space and disarms it.
func NoSpace(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) ||
		strings.Contains(err.Error(), rpctypes.ErrNoSpace.Error()))
}

// requestFault reports an error etcd gives this request every time, whatever its state.
func requestFault(err error) bool {
	return errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) ||
		errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrGRPCTooManyOps) ||
		errors.Is(err, rpctypes.ErrDuplicateKey) || status.Code(err) == codes.InvalidArgument
}

// failingTicks counts the guard's consecutive ticks during which guarded writes failed and none
// succeeded; it returns the new count.
func (w *writeState) failingTicks(prev int) int {
	if w.ok.Swap(false) || w.failing.Load() == 0 {
		return 0
	}
	return prev + 1
}

// unwritableFor reports whether ticks ticks of every are four fifths of ttl.
func unwritableFor(ticks int, every, ttl time.Duration) bool {
	return ticks > 0 && time.Duration(ticks)*every >= ttl*4/5
}

// unwritable reports that term t ends because etcd refuses its writes.
func (e *Elector) unwritable(t *Term, reason string) {
	e.log.Error("stepping down: etcd refuses this leader's writes; no replica can fence until it takes writes again",
		"epoch", t.Epoch, "reason", reason)
	if e.OnUnwritable != nil {
		e.OnUnwritable(reason)
	}
}
