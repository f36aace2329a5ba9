package term

import (
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

var t0 = time.Date(2026, 11, 28, 3, 30, 0, 0, time.UTC)

func wrongMachine(fence string) Verdict {
	return Verdict{Result: engine.ProofResult{Node: "n1", Fence: fence, Verdict: fencing.ProofWrongMachine, Why: "agent heard", At: t0}}
}

func plan(step string) ([]fenceconfig.Resolved, error) {
	if step == fenceconfig.StepPowerManagement {
		return []fenceconfig.Resolved{{Name: "bmc", Driver: "d"}}, nil
	}
	return nil, nil
}

// settle returns the core's Ready and advances it.
func settle(c *Core) Ready {
	rd := c.Ready()
	c.Advance()
	return rd
}

// TestCoreConflictReDecided: the alarm's write carries the revision the record was read at; when
// it loses its compare-and-swap, the record read again is decided again (the runner's change kept,
// the new revision carried), and the alarm acts only once the second write is persisted. Past
// MaxConflicts the decision is given up, saying so.
func TestCoreConflictReDecided(t *testing.T) {
	c := New(7)
	c.Step(wrongMachine("f1"))
	if rd := settle(c); len(rd.Reads) != 1 || rd.Reads[0] != "f1" || len(rd.Writes)+len(rd.Acts) != 0 {
		t.Fatalf("a verdict must ask for the record and nothing else: %+v", rd)
	}
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f1", Node: "n1"}, Revision: 10})
	rd := settle(c)
	if len(rd.Writes) != 1 || rd.Writes[0].Revision != 10 || rd.Writes[0].Record.GetWrongMachineAt() == nil || len(rd.Acts) != 0 {
		t.Fatalf("first write: %+v", rd)
	}
	// The runner wrote the record meanwhile: the write loses its compare-and-swap, the owner reads
	// the record again and Steps it in. A stale read answer changes nothing.
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f1", Node: "n1"}, Revision: 10})
	if rd := c.Ready(); !rd.Empty() {
		t.Fatalf("a read answer while the write is out decided again: %+v", rd)
	}
	c.Step(Conflict{ID: rd.Writes[0].ID, Record: &coordv1.NodeFence{Id: "f1", Node: "n1", Retries: 2}, Revision: 12})
	rd = settle(c)
	if len(rd.Writes) != 1 || rd.Writes[0].Revision != 12 || rd.Writes[0].Record.GetRetries() != 2 ||
		rd.Writes[0].Record.GetWrongMachineAt() == nil || len(rd.Acts) != 0 {
		t.Fatalf("the conflict was not decided again on the fresh record: %+v", rd)
	}
	c.Step(Persisted{ID: rd.Writes[0].ID, Record: rd.Writes[0].Record})
	rd = settle(c)
	if len(rd.Acts) != 1 || rd.Acts[0].Kind != ActAlarm || rd.Acts[0].Record.GetRetries() != 2 || rd.Acts[0].Err != "" || c.Pending() != 0 {
		t.Fatalf("the persisted alarm must act once: %+v (pending %d)", rd, c.Pending())
	}

	c.Step(wrongMachine("f2"))
	settle(c)
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f2", Node: "n1"}, Revision: 20})
	rd = settle(c)
	for i := 0; i <= MaxConflicts; i++ { // one conflict more than allowed
		c.Step(Conflict{ID: rd.Writes[0].ID, Record: &coordv1.NodeFence{Id: "f2", Node: "n1"}, Revision: int64(21 + i)})
		rd = settle(c)
	}
	if len(rd.Writes) != 0 || len(rd.Acts) != 1 || rd.Acts[0].Err == "" || c.Pending() != 0 {
		t.Fatalf("past %d conflicts the decision must be given up, saying so: %+v", MaxConflicts, rd)
	}
}

// TestCoreEpochOnEveryWrite: every write the core decides carries the term's epoch, and a deposed
// term's core hands nothing more out — not what it had decided, nor anything after.
func TestCoreEpochOnEveryWrite(t *testing.T) {
	c := New(7)
	c.Step(Request{Req: engine.FenceRequest{Node: "n1", Evidence: []string{"silent"}}, Plan: plan, At: t0})
	c.Step(Request{Req: engine.FenceRequest{Node: "n2", Observe: true}, Plan: plan, At: t0})
	c.Step(wrongMachine("f1"))
	c.Step(WouldRelease{Node: "n3", Fence: "f3", Why: "would release", At: t0, Ref: 1})
	settle(c)
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f1", Node: "n1"}, Revision: 3})
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f3", Node: "n3", Status: coordv1.FenceStatus_FENCE_STATUS_OBSERVED}, Revision: 4})
	rd := c.Ready()
	if len(rd.Writes) != 2 {
		t.Fatalf("writes: %+v", rd.Writes)
	}
	for _, w := range rd.Writes {
		if w.Epoch != 7 {
			t.Errorf("write %d under epoch %d, want the term's 7", w.ID, w.Epoch)
		}
	}
	c.Advance()
	c2 := New(9)
	c2.Step(Request{Req: engine.FenceRequest{Node: "n1"}, Plan: plan, At: t0})
	for _, w := range c2.Ready().Writes {
		if w.Epoch != 9 || w.Record.GetEpoch() != 9 {
			t.Errorf("create under epoch %d (record %d), want 9", w.Epoch, w.Record.GetEpoch())
		}
	}
	c2.Step(Deposed{})
	if rd := c2.Ready(); !rd.Empty() {
		t.Fatalf("a deposed core still hands out %+v", rd)
	}
	c2.Step(wrongMachine("f9"))
	c2.Step(Request{Req: engine.FenceRequest{Node: "n2"}, Plan: plan, At: t0})
	if rd := c2.Ready(); !rd.Empty() || c2.Pending() != 0 || !c2.Deposed() {
		t.Fatalf("a deposed core decided %+v", rd)
	}
}

// TestCoreNothingActsBeforePersisted: for each decision that writes (the alarm, would release, an
// automatic fence, a would-fence record), the Ready that carries its write carries none of its
// acts or audit entries; they come after its Persisted. A held-back request writes nothing and is
// only audited.
func TestCoreNothingActsBeforePersisted(t *testing.T) {
	c := New(7)
	c.Step(wrongMachine("f1"))
	c.Step(WouldRelease{Node: "n3", Fence: "f3", Why: "would release", At: t0, Ref: 4})
	c.Step(WouldRelease{Node: "n3", Fence: "f3", Why: "would release", At: t0, Ref: 5}) // a second caller
	c.Step(Request{Req: engine.FenceRequest{Node: "n4", Evidence: []string{"silent"}}, Plan: plan, At: t0})
	c.Step(Request{Req: engine.FenceRequest{Node: "n5", Observe: true}, Plan: plan, At: t0})
	c.Step(Request{Req: engine.FenceRequest{Node: "n6"}, Policy: Policy{Asked: true, Why: "no stateful pods"}, Plan: plan, At: t0})
	rd := settle(c)
	if len(rd.Writes) != 2 || len(rd.Acts) != 0 || len(rd.Audit) != 1 || rd.Audit[0].Kind != KindHeldBack {
		t.Fatalf("creates out, the held request audited, nothing acting: %+v", rd)
	}
	writes := rd.Writes
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f1", Node: "n1"}, Revision: 3})
	c.Step(RecordRead{Record: &coordv1.NodeFence{Id: "f3", Node: "n3", Status: coordv1.FenceStatus_FENCE_STATUS_OBSERVED}, Revision: 4})
	rd = settle(c)
	if len(rd.Writes) != 3 || len(rd.Acts) != 0 || len(rd.Audit) != 0 {
		t.Fatalf("updates out (both callers' on one record), nothing acting: %+v", rd)
	}
	writes = append(writes, rd.Writes...)
	kinds := map[ActKind]bool{}
	refs := map[uint64]bool{}
	var f3 *coordv1.NodeFence
	for _, w := range writes {
		if w.Record.GetId() == "f3" && f3 != nil {
			// the second caller's write lost to the first: on the record read again, nothing to write
			c.Step(Conflict{ID: w.ID, Record: f3, Revision: 5})
		} else {
			c.Step(Persisted{ID: w.ID, Record: w.Record, Created: w.Create})
		}
		if w.Record.GetId() == "f3" {
			f3 = w.Record
		}
		rd = settle(c)
		if len(rd.Acts) != 1 || len(rd.Writes) != 0 {
			t.Fatalf("write %d persisted: acts %+v, writes %+v", w.ID, rd.Acts, rd.Writes)
		}
		kinds[rd.Acts[0].Kind] = true
		if rd.Acts[0].Kind == ActWouldRelease {
			refs[rd.Acts[0].Ref] = true
		}
	}
	if len(refs) != 2 {
		t.Fatalf("would release answered %v, want both callers", refs)
	}
	if len(kinds) != 4 {
		t.Fatalf("acts after the writes: %v", kinds)
	}
	if c.Pending() != 0 {
		t.Fatalf("%d decisions still pending", c.Pending())
	}
}
