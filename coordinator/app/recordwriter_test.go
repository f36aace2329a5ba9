package app

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"
	termcore "github.com/nodefence/nodefence/coordinator/term"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestRecordWriterOwnsTheWrites drives the term's record writer against real etcd. A write that
// loses its compare-and-swap (the record changed since it was read) is answered by reading the
// record again and deciding again on it: both changes stand. Once the term is over, a write of its
// core is refused for the epoch: nothing is written, nothing acts, the core is deposed.
func TestRecordWriterOwnsTheWrites(t *testing.T) {
	a, _ := startLeader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.mu.Lock()
	l := a.leading
	a.mu.Unlock()
	term := l.Term
	tp := &termParts{a: a, term: term, loop: l.Loop, audit: a.storeG.writer(term)}
	record := func(id string) (*coordv1.NodeFence, int64) {
		t.Helper()
		v, err := a.store.GetFence(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return v.Fence, v.Revision
	}
	rec := &coordv1.NodeFence{Id: "node-1-test", Node: "node-1", Status: coordv1.FenceStatus_FENCE_STATUS_DONE,
		Epoch: term.Epoch, FinishedAt: timestamppb.New(a.now())}
	got, _, created, err := a.store.CreateFence(ctx, term, rec)
	if err != nil || !created {
		t.Fatalf("create: %v (created %v)", err, created)
	}
	verdict := termcore.Verdict{Result: engine.ProofResult{Node: "node-1", Fence: got.Id, Verdict: fencing.ProofWrongMachine, Why: "agent heard", At: a.now()}}

	w := newRecordWriter(tp)
	w.core.Step(verdict)
	w.core.Advance() // the read is made by hand: the record changes after it
	stale, rev := record(got.Id)
	changed := fencing.WrongMachine(stale, a.now(), "x") // any change by another writer
	changed.WrongMachineAt, changed.Retries = nil, 3
	if _, err := a.store.UpdateFence(ctx, term, changed, rev); err != nil {
		t.Fatal(err)
	}
	w.core.Step(termcore.RecordRead{Record: stale, Revision: rev})
	if !w.drive(ctx) {
		t.Fatal("the writer stopped on a conflict")
	}
	if now, _ := record(got.Id); now.GetWrongMachineAt() == nil || now.GetRetries() != 3 {
		t.Fatalf("after the conflict: alarm %v, retries %d: the re-read was not decided again", now.GetWrongMachineAt(), now.GetRetries())
	}
	if w.core.Pending() != 0 {
		t.Fatalf("%d decisions still pending", w.core.Pending())
	}

	// A second record, then the term ends: its alarm is never written.
	other := &coordv1.NodeFence{Id: "node-2-test", Node: "node-2", Status: coordv1.FenceStatus_FENCE_STATUS_DONE, Epoch: term.Epoch,
		FinishedAt: timestamppb.New(a.now())}
	if _, _, _, err := a.store.CreateFence(ctx, term, other); err != nil {
		t.Fatal(err)
	}
	w = newRecordWriter(tp)
	w.core.Step(termcore.Verdict{Result: engine.ProofResult{Node: "node-2", Fence: other.Id, Verdict: fencing.ProofWrongMachine, Why: "agent heard", At: a.now()}})
	w.core.Advance()
	fresh, rev := record(other.Id)
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	w.core.Step(termcore.RecordRead{Record: fresh, Revision: rev})
	if w.drive(ctx) {
		t.Fatal("the writer went on after the term's epoch was refused")
	}
	if now, _ := record(other.Id); now.GetWrongMachineAt() != nil {
		t.Fatal("a deposed term's write was persisted")
	}
	if !w.core.Deposed() || !w.core.Ready().Empty() {
		t.Fatal("the core was not told its term ended")
	}
}
