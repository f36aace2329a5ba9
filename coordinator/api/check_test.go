package api

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/leader"
	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/testbed/etcdtest"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// CheckNode reaches a device only under a live term: the request is audited under the epoch first,
// so a deposed leader (its guard no longer holds) is refused before any driver call.
func TestCheckNodeIsEpochGuarded(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	elector := func(id string) *leader.Term {
		term, err := leader.NewElector(cli, "/t/leader", leader.Info{ID: id}, 1, log).Campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return term
	}
	cfg, err := fenceconfig.Parse([]byte("drivers: {ipmi: {endpoint: \"127.0.0.1:1\"}}\nnodes:\n  n1:\n    methods: {bmc: {driver: ipmi, parameters: {ip: 127.0.0.1}}}\n    steps: {power_management: [bmc]}\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(cli, "/t")
	calls := 0
	term := elector("one")
	deps := &Deps{
		Leadership: fixedLeader{&Leading{Term: term}}, Store: st,
		Config: func() *fenceconfig.Config { return cfg },
		CheckDevices: func(_ context.Context, l *Leading, node string) ([]*coordv1.DeviceCheck, error) {
			calls++
			return []*coordv1.DeviceCheck{{Method: "bmc", Driver: "ipmi", Reachable: true}}, nil
		},
	}
	s := &ClusterServer{Deps: deps}

	resp, err := s.CheckNode(ctx, &coordv1.CheckNodeRequest{Node: "n1"})
	if err != nil || calls != 1 || resp.Ok {
		t.Fatalf("live term: %v, %d calls, %v (credentials not ok must not be ok)", err, calls, resp)
	}
	entries, err := st.ListAudit(ctx, "n1", 0, 10)
	if err != nil || len(entries) != 2 || entries[0].Kind != "device-check" || entries[0].Epoch != term.Epoch ||
		!strings.Contains(entries[1].Text, "bmc (ipmi) credentials rejected") {
		t.Fatalf("audit: %v %v", entries, err)
	}

	if _, err := s.CheckNode(ctx, &coordv1.CheckNodeRequest{Node: "n2"}); fault.Code(err).String() != "NotFound" {
		t.Fatalf("unknown node: %v", err)
	}

	// At most maxConcurrentChecks run at once: another waits for a slot, within its deadline.
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	deps.CheckDevices = func(ctx context.Context, _ *Leading, _ string) ([]*coordv1.DeviceCheck, error) {
		started <- struct{}{}
		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	errs := make(chan error, maxConcurrentChecks)
	for range maxConcurrentChecks {
		go func() { _, err := s.CheckNode(ctx, &coordv1.CheckNodeRequest{Node: "n1"}); errs <- err }()
		<-started
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := s.CheckNode(short, &coordv1.CheckNodeRequest{Node: "n1"}); err == nil || len(started) != 0 {
		t.Fatalf("a check beyond the bound: %v, %d started", err, len(started))
	}
	stop()
	close(release)
	for range maxConcurrentChecks {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	deps.CheckDevices = func(context.Context, *Leading, string) ([]*coordv1.DeviceCheck, error) {
		calls++
		return nil, nil
	}

	term.Abandon() // deposed: its lease runs out and another replica leads
	next := elector("two")
	defer next.Resign(context.Background())
	if _, err := s.CheckNode(ctx, &coordv1.CheckNodeRequest{Node: "n1"}); err == nil || calls != 1 {
		t.Fatalf("deposed leader: %v, %d driver calls, want refused before any", err, calls)
	}
}
