package attack

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/store"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/wait"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// TestAgentHelloLoopCannotSpendTheStore: node-a's agent certificate reconnects in a loop over real
// mTLS streams, a new boot id at every hello. Each hello used to rewrite node-a's registration in
// etcd (one revision per hello, as fast as streams open). Now node-a's registration is written at
// most its node's burst plus what the rate refills, whatever the number of hellos.
func TestAgentHelloLoopCannotSpendTheStore(t *testing.T) {
	s := start(t, "")
	operator := dialWith(t, s.coord.Addr(), s.files(t, identity.Operator, "alice"))
	wait.Until(t, 30*time.Second, "leader elected", func() error {
		_, err := coordv1.NewClusterServiceClient(operator).ListNodes(context.Background(), &coordv1.ListNodesRequest{})
		return err
	})
	agentA := dialWith(t, s.coord.Addr(), s.files(t, identity.Agent, "node-a"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	accepted := 0
	for i := 0; accepted < 200 && time.Since(began) < 30*time.Second; i++ {
		h := &agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
			NodeName: "node-a", BootId: fmt.Sprintf("boot-loop-%d", i), Zone: "z", Region: "r"}}}
		if err := openStream(ctx, agentA, h); err == nil {
			accepted++ // the server took the hello and sent its configuration
		}
	}
	took := time.Since(began)
	if accepted < 100 {
		t.Fatalf("only %d hellos accepted in %s: not a loop", accepted, took)
	}
	resp, err := s.etcd.Get(ctx, "/nodefence/nodes/node-a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node-a's registration: %v, %v", resp, err)
	}
	writes := resp.Kvs[0].Version // how many times the key was written since it was created
	bound := int64(store.DefaultRegistrationBurst) + int64(took.Seconds()*store.DefaultRegistrationRate) + 1
	t.Logf("%d hellos with new boot ids in %s wrote node-a's registration %d times (bound %d)", accepted, took.Round(time.Millisecond), writes, bound)
	if writes > bound {
		t.Fatalf("%d hellos wrote node-a's registration %d times, more than its limit allows (%d)", accepted, writes, bound)
	}
}
