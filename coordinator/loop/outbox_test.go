package loop

import (
	"errors"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

func grantMsg(id string) *agentv1.ConnectResponse {
	return &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Grant{Grant: &agentv1.EvictionGrant{Signal: id}}}
}

// An outbox sends in order from a goroutine that ends once the queue is empty, holds at most
// outboundQueue messages while a send blocks, and sends nothing more after close or a failed send.
func TestOutbox(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var sent []string
	o := &outbox{send: func(m *agentv1.ConnectResponse) error {
		<-release
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, m.GetGrant().GetSignal())
		return nil
	}}
	// The first message is taken by the sender, which blocks; outboundQueue more wait.
	if !o.offer(grantMsg("0")) {
		t.Fatal("first offer refused")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		o.mu.Lock()
		taken := len(o.queue) == 0
		o.mu.Unlock()
		if taken {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sender never took the first message")
		}
	}
	for i := 1; i <= outboundQueue; i++ {
		if !o.offer(grantMsg(string(rune('a' + i - 1)))) {
			t.Fatalf("offer %d of %d refused", i, outboundQueue)
		}
	}
	if o.offer(grantMsg("overflow")) {
		t.Fatal("a full outbox took one more")
	}
	close(release)
	idle := func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return !o.sending
	}
	for deadline := time.Now().Add(5 * time.Second); !idle(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sender did not end with the queue empty")
		}
	}
	mu.Lock()
	got := sent
	mu.Unlock()
	if len(got) != outboundQueue+1 || got[0] != "0" || got[1] != "a" || got[outboundQueue] != string(rune('a'+outboundQueue-1)) {
		t.Fatalf("sent %v, want 0 then a.. in order", got)
	}
	o.close()
	if o.offer(grantMsg("late")) {
		t.Fatal("a closed outbox took a message")
	}

	failing := &outbox{send: func(*agentv1.ConnectResponse) error { return errors.New("stream gone") }}
	failing.offer(grantMsg("x"))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		failing.mu.Lock()
		closed := failing.closed
		failing.mu.Unlock()
		if closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a failed send did not close the outbox")
		}
	}
	if failing.offer(grantMsg("y")) {
		t.Fatal("an outbox whose send failed took a message")
	}
}
