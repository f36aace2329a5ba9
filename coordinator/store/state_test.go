package store_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/store"
)

// The engine's writes are saved and restored through the store: a node written twice in one batch
// keeps its last record, a forgotten node is gone, and unreadable records are skipped.
func TestEngineStateRoundTrip(t *testing.T) {
	ctx, cli, st, term := setup(t)
	halted := true
	ops := st.StateOps([]store.StateWrite{
		{Node: "a", Record: engine.NodeRecord{Name: "a", Zone: "z1"}},
		{Node: "b", Record: engine.NodeRecord{Name: "b", Zone: "z1"}},
		{Zone: "z1", Record: engine.ZoneRecord{Key: "z1", At: time.Now()}},
		{Node: "a", Record: engine.NodeRecord{Name: "a", Zone: "z2"}},
		{Forget: "b"},
		{Halted: &halted},
	})
	if len(ops) != 4 {
		t.Fatalf("%d operations, want 4 (a, b, z1, halted): a key twice in one transaction is refused", len(ops))
	}
	if _, err := term.Txn(ctx, nil, ops...); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, prefix+"/state/nodes/broken", "{"); err != nil {
		t.Fatal(err)
	}
	got, err := st.LoadEngineState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Nodes) != 1 || got.Paused {
		t.Fatalf("restored %d records (paused %v), want only a's, not paused", len(got.Nodes), got.Paused)
	}
	var a engine.NodeRecord
	if err := json.Unmarshal(got.Nodes[0], &a); err != nil || a.Name != "a" || a.Zone != "z2" {
		t.Fatalf("restored %s (%v), want a in z2", got.Nodes[0], err)
	}
}

// The pause flag is set and cleared under the term, and read back by the next term's restore.
func TestPauseFlag(t *testing.T) {
	ctx, _, st, term := setup(t)
	if err := st.SetPaused(ctx, term, true, "paused by ops: maintenance"); err != nil {
		t.Fatal(err)
	}
	if got, err := st.LoadEngineState(ctx); err != nil || !got.Paused || got.PauseNote != "paused by ops: maintenance" {
		t.Fatalf("after pause: %+v, %v", got, err)
	}
	if err := st.SetPaused(ctx, term, false, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := st.LoadEngineState(ctx); err != nil || got.Paused {
		t.Fatalf("after resume: %+v, %v", got, err)
	}
	info, epoch, ok, err := st.CurrentLeader(ctx)
	if err != nil || !ok || info.ID != "one" || epoch != term.Epoch {
		t.Fatalf("current leader %+v epoch %d ok %v err %v; want one at %d", info, epoch, ok, err, term.Epoch)
	}
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.SetPaused(ctx, term, true, "late"); err == nil {
		t.Fatal("a resigned term set the pause flag")
	}
}
