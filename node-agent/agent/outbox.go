package agent

import (
	"slices"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Outbox is the agent's bookkeeping of sequence numbers and unacknowledged messages. It does no I/O
// and holds no clock or lock: the Agent owns one and serialises access to it.
//
// Rules:
//  1. Push assigns seq = previous + 1 (the first message is 1), for the life of the Outbox.
//  2. Messages stay until a coordinator acks a seq >= theirs; then Ack removes them.
//  3. A new heartbeat replaces older unacked heartbeats: only the newest proves anything.
//  4. Past the limit, Push drops the oldest heartbeat, then the oldest sample. Conditions, shutdown
//     events and eviction candidates are never dropped, so an outbox full of them grows past its limit.
type Outbox struct {
	limit int
	last  uint64
	msgs  []*agentv1.ConnectRequest // unacked, ascending seq
}

// NewOutbox returns an empty outbox that keeps at most limit unacked droppable messages (see rule 4).
func NewOutbox(limit int) *Outbox {
	return &Outbox{limit: max(limit, 1)}
}

// Push assigns m the next seq (writing m.Seq), keeps it until acked and returns the seq, together
// with the seqs of unacked samples and heartbeats dropped to stay within the limit.
func (o *Outbox) Push(m *agentv1.ConnectRequest) (seq uint64, dropped []uint64) {
	o.last++
	m.Seq = o.last
	if isHeartbeat(m) {
		o.msgs = slices.DeleteFunc(o.msgs, isHeartbeat)
	}
	o.msgs = append(o.msgs, m)
	for len(o.msgs) > o.limit {
		i := slices.IndexFunc(o.msgs, isHeartbeat)
		if i < 0 {
			i = slices.IndexFunc(o.msgs, isSample)
		}
		if i < 0 {
			break // only events left: never dropped
		}
		dropped = append(dropped, o.msgs[i].Seq)
		o.msgs = slices.Delete(o.msgs, i, i+1)
	}
	return m.Seq, dropped
}

// Ack removes every message with seq <= acked and returns how many it removed.
func (o *Outbox) Ack(acked uint64) int {
	n := slices.IndexFunc(o.msgs, func(m *agentv1.ConnectRequest) bool { return m.Seq > acked })
	if n < 0 {
		n = len(o.msgs)
	}
	o.msgs = slices.Delete(o.msgs, 0, n)
	return n
}

// After returns the unacked messages with seq > seq, in seq order. The slice is a copy; the messages
// are shared and must not be modified.
func (o *Outbox) After(seq uint64) []*agentv1.ConnectRequest {
	i := slices.IndexFunc(o.msgs, func(m *agentv1.ConnectRequest) bool { return m.Seq > seq })
	if i < 0 {
		return nil
	}
	return slices.Clone(o.msgs[i:])
}

// Resume returns the seq a new stream's Hello carries and its ResumeFromSeq.
//
// ResumeFromSeq is the lowest unacked seq (0 when nothing is unacked). The Hello itself carries the
// seq just below the first message the stream will (re)send — the highest seq the agent knows to be
// done with — so that a coordinator acking the Hello's seq, as it acks every message, never
// acknowledges messages it has not received yet, and every stream's seqs strictly increase.
func (o *Outbox) Resume() (helloSeq, resumeFrom uint64) {
	if len(o.msgs) == 0 {
		return o.last, 0
	}
	return o.msgs[0].Seq - 1, o.msgs[0].Seq
}

// AckedThrough reports whether every message up to seq was acknowledged (seq was assigned).
func (o *Outbox) AckedThrough(seq uint64) bool {
	return seq <= o.last && (len(o.msgs) == 0 || o.msgs[0].Seq > seq)
}

// Len is the number of unacked messages.
func (o *Outbox) Len() int { return len(o.msgs) }

// Last is the highest seq assigned so far (0 before the first Push).
func (o *Outbox) Last() uint64 { return o.last }

func isHeartbeat(m *agentv1.ConnectRequest) bool { return m.GetHeartbeat() != nil }
func isSample(m *agentv1.ConnectRequest) bool    { return m.GetSample() != nil }
