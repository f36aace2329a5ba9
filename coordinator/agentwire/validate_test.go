package agentwire

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/services/identity"
)

func TestValidateHello(t *testing.T) {
	ok := &agentv1.Hello{NodeName: "worker-1", BootId: "3f2a-11", Zone: "rack-1", Region: "dc.1",
		Labels: map[string]string{"kubernetes.io/hostname": "worker-1", "tier": "db"}}
	if err := ValidateHello(ok); err != nil {
		t.Fatalf("valid hello: %v", err)
	}
	for name, mod := range map[string]func(h *agentv1.Hello){
		"hello.node_name":     func(h *agentv1.Hello) { h.NodeName = strings.Repeat("a", 300*1024) },
		"hello.zone":          func(h *agentv1.Hello) { h.Zone = strings.Repeat("z", 64) },
		"hello.region":        func(h *agentv1.Hello) { h.Region = "a/b" },
		"hello.boot_id":       func(h *agentv1.Hello) { h.BootId = "a\nb" },
		"hello.agent_version": func(h *agentv1.Hello) { h.AgentVersion = strings.Repeat("v", 129) },
		"hello.labels":        func(h *agentv1.Hello) { h.Labels = map[string]string{"bad key!": "v"} },
		"hello.capacity":      func(h *agentv1.Hello) { h.Capacity = &agentv1.Capacity{MemoryBytes: -1} },
	} {
		h := proto.CloneOf(ok)
		mod(h)
		if err := ValidateHello(h); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want a problem naming it", name, err)
		}
	}
}

func TestValidateEvent(t *testing.T) {
	cond := func(c *agentv1.ConditionChange) *agentv1.ConnectRequest {
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Condition{Condition: c}}
	}
	shut := func(s *agentv1.ShutdownEvent) *agentv1.ConnectRequest {
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: s}}
	}
	evicted := func(mod func(r *agentv1.EvictionReport)) *agentv1.ConnectRequest {
		r := &agentv1.EvictionReport{Namespace: "default", Name: "web-7f9c.x", Uid: "8d3c0c1e-1f0b-4c53-9d1a-1c2b3d4e5f60",
			Signal: "memory.available", Kind: agentv1.EvictionKind_EVICTION_KIND_HARD, GracePeriod: durationpb.New(time.Second),
			Message: "The node was low on resource: memory.", At: timestamppb.New(time.Unix(1e9, 0))}
		if mod != nil {
			mod(r)
		}
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Eviction{Eviction: r}}
	}
	for _, ok := range []*agentv1.ConnectRequest{cond(&agentv1.ConditionChange{Type: 1, Status: 1, Reason: "r"}), evicted(nil)} {
		if err := ValidateEvent(ok); err != nil {
			t.Fatal(err)
		}
	}
	for field, m := range map[string]*agentv1.ConnectRequest{
		"condition.type":        cond(&agentv1.ConditionChange{Type: 42, Status: 1}),
		"condition.status":      cond(&agentv1.ConditionChange{Type: 1}),
		"condition.message":     cond(&agentv1.ConditionChange{Type: 1, Status: 1, Message: strings.Repeat("m", MaxText+1)}),
		"shutdown.phase":        shut(&agentv1.ShutdownEvent{Phase: 9}),
		"shutdown.grace_period": shut(&agentv1.ShutdownEvent{Phase: 1, GracePeriod: durationpb.New(-time.Second)}),
		"eviction.namespace":    evicted(func(r *agentv1.EvictionReport) { r.Namespace = "kube-system\naudit: forged" }),
		"eviction.name":         evicted(func(r *agentv1.EvictionReport) { r.Name = strings.Repeat("p", 300) }),
		"eviction.uid":          evicted(func(r *agentv1.EvictionReport) { r.Uid = "u\x1b[2J" }),
		"eviction.signal":       evicted(func(r *agentv1.EvictionReport) { r.Signal = strings.Repeat("s", 129) }),
		"eviction.kind":         evicted(func(r *agentv1.EvictionReport) { r.Kind = 0 }),
		"eviction.grace_period": evicted(func(r *agentv1.EvictionReport) { r.GracePeriod = durationpb.New(-time.Second) }),
		"eviction.message":      evicted(func(r *agentv1.EvictionReport) { r.Message = strings.Repeat("m", MaxText+1) }),
		"eviction.at":           evicted(func(r *agentv1.EvictionReport) { r.At = &timestamppb.Timestamp{Seconds: -1 << 62} }),
	} {
		if err := ValidateEvent(m); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want a problem naming it", field, err)
		}
	}
}

// FuzzValidateHello: any bytes decoded as a ConnectRequest; an accepted hello or event is within
// every bound, and nothing panics.
func FuzzValidateHello(f *testing.F) {
	seed, _ := proto.Marshal(&agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
		NodeName: "n-1", Zone: "z", Region: "r", BootId: "b", Labels: map[string]string{"a": "b"}}}})
	f.Add(seed)
	seed, _ = proto.Marshal(&agentv1.ConnectRequest{Seq: 2, Msg: &agentv1.ConnectRequest_Shutdown{Shutdown: &agentv1.ShutdownEvent{Phase: 1, GracePeriod: durationpb.New(time.Second)}}})
	f.Add(seed)
	seed, _ = proto.Marshal(&agentv1.ConnectRequest{Seq: 3, Msg: &agentv1.ConnectRequest_Eviction{Eviction: &agentv1.EvictionReport{
		Namespace: "default", Name: "p", Uid: "u", Signal: "memory.available", Kind: 2, Message: "m"}}})
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		var m agentv1.ConnectRequest
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		if h := m.GetHello(); h != nil && ValidateHello(h) == nil {
			if identity.ValidName(h.NodeName) != nil || len(h.Zone) > 63 || len(h.Region) > 63 || len(h.BootId) > 128 || len(h.Labels) > MaxLabels {
				t.Fatalf("accepted %v", h)
			}
		}
		if ValidateEvent(&m) == nil {
			if c := m.GetCondition(); c != nil && (len(c.Reason) > MaxText || len(c.Message) > MaxText || c.Type == 0 || c.Type > 3) {
				t.Fatalf("accepted %v", c)
			}
			if s := m.GetShutdown(); s != nil && s.GracePeriod != nil && s.GracePeriod.AsDuration() < 0 {
				t.Fatalf("accepted %v", s)
			}
			if r := m.GetEviction(); r != nil && (identity.ValidName(r.Name) != nil || len(r.Namespace) > 63 || len(r.Uid) > 128 ||
				len(r.Signal) > 128 || len(r.Message) > MaxText || r.Kind == 0 || r.Kind > 5) {
				t.Fatalf("accepted %v", r)
			}
		}
	})
}

// A watchdog report (in a hello or on its own) is bounded: an armed watchdog has a timeout from 1 s
// to MaxWatchdogTimeout; a disarmed report needs none.
func TestValidateWatchdog(t *testing.T) {
	report := func(w *agentv1.WatchdogState) *agentv1.ConnectRequest {
		return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Watchdog{Watchdog: w}}
	}
	for _, tc := range []struct {
		w    *agentv1.WatchdogState
		want string
	}{
		{&agentv1.WatchdogState{Armed: true, Timeout: durationpb.New(15 * time.Second)}, ""},
		{&agentv1.WatchdogState{Armed: false}, ""},
		{&agentv1.WatchdogState{Armed: true}, "watchdog.timeout"},
		{&agentv1.WatchdogState{Armed: true, Timeout: durationpb.New(time.Hour)}, "watchdog.timeout"},
		{&agentv1.WatchdogState{Armed: true, Timeout: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "watchdog.timeout"},
	} {
		err := ValidateEvent(report(tc.w))
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.w, err, tc.want)
		}
	}
	h := &agentv1.Hello{NodeName: "n1", BootId: "b", Watchdog: &agentv1.WatchdogState{Armed: true, Timeout: durationpb.New(time.Hour)}}
	if err := ValidateHello(h); err == nil || !strings.Contains(err.Error(), "hello.watchdog.timeout") {
		t.Errorf("hello with a 1h watchdog: %v", err)
	}
}
