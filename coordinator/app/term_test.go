package app

import (
	"log/slog"
	"reflect"
	"testing"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/prometheus/client_golang/prometheus"
)

// newTerm builds every part of a term before start runs any: the loop's OnReady hands automatic
// fences to the runner and the runner's Facts query the loop, so a part assigned after the loop
// started (the runner once was, and only the loop's first tick 100 ms later hid it) would be nil
// when the other uses it.
func TestNewTermBuildsEveryPartBeforeStart(t *testing.T) {
	a := &App{cfg: DefaultConfig(), log: slog.New(slog.DiscardHandler), storeG: newStoreGuard(prometheus.NewRegistry())}
	a.fenceCf.Store(&fenceconfig.Config{Nodes: map[string]fenceconfig.Node{"n1": {Zone: "z"}}})
	parts := a.newTerm(&leader.Term{Epoch: 7})
	v := reflect.ValueOf(parts).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Name == "secrets" {
			continue // nil in standalone mode: there are no Secrets to read
		}
		if v.Field(i).IsNil() {
			t.Errorf("termParts.%s is nil after newTerm: it would be built while the term already runs", f.Name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if parts.runner.Facts == nil || parts.runner.OnChange == nil || parts.runner.Term != parts.term {
		t.Errorf("the runner is not wired to the term: %+v", parts.runner)
	}
	select {
	case <-parts.loop.Done():
		t.Error("the loop ran before start")
	default:
	}
}
