package api

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/services/wdlease"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Leases is a term's side of the agents' watchdog leases (services/wdlease): every agent stream
// asks it for a grant when a heartbeat asks for one. It is safe for concurrent use: the streams of
// all agents share it, because the proof that a majority holds leases is about all of them.
type Leases struct {
	mu sync.Mutex
	l  *wdlease.Leader
	// poisoned are the nodes told to stop feeding (a watchdog fence), by fence id: they get the
	// stop-feeding pill instead of a grant for as long as this term lasts.
	poisoned map[string]string
}

// NewLeases starts a term's leases at the term's start (its clock), for epoch.
func NewLeases(b wdlease.Bounds, epoch int64, start time.Time) *Leases {
	return &Leases{l: wdlease.NewLeader(b, epoch, start)}
}

// grant answers heartbeat seq of node when it asks for a lease (nil otherwise), at the stream's
// clock reading of its arrival. The grant is recorded before it is sent: the leader's record of
// its send time is never later than the real one.
func (ls *Leases) grant(node string, seq uint64, hb *agentv1.Heartbeat, at time.Time) *agentv1.ConnectResponse {
	if ls == nil || !hb.GetLeaseWanted() {
		return nil
	}
	ls.mu.Lock()
	if fence, ok := ls.poisoned[node]; ok {
		ls.mu.Unlock()
		return &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_StopFeeding{StopFeeding: &agentv1.StopFeeding{Epoch: ls.l.Epoch(), FenceId: fence}}}
	}
	g := ls.l.Request(node, hb.GetLeaseEpoch(), hb.GetLeaseGrantId(), at)
	ls.mu.Unlock()
	return &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Lease{Lease: &agentv1.LeaseGrant{
		Epoch: g.Epoch, GrantId: g.ID, Duration: durationpb.New(g.Duration), RequestSeq: seq,
	}}}
}

// Poison marks node for the stop-feeding pill of fence: the answer to each of its agent's next
// lease requests on this term's streams (its own stream only: the stream's node is its certificate's)
// is the pill, never a grant again in this term, so its last grant, and with it its safe time,
// stands still from here.
func (ls *Leases) Poison(node, fence string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.poisoned == nil {
		ls.poisoned = map[string]string{}
	}
	ls.poisoned[node] = fence
}

// SelfFenced applies the timing rule (wdlease.Leader.SelfFenced) to node, whose agent last reported
// w, in a cluster of n agents at now; it also returns the node's safe time.
func (ls *Leases) SelfFenced(node string, w wdlease.Watchdog, n int, now time.Time) (bool, wdlease.Refusal, time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ok, why := ls.l.SelfFenced(node, w, n, now)
	var safe time.Time
	if w.Armed && w.Timeout > 0 {
		safe = ls.l.SafeTimeFor(node, w)
	}
	return ok, why, safe
}

// SafeTime is node's safe time for its watchdog w now (wdlease.Leader.SafeTimeFor). After Poison
// it no longer moves: the node gets no grant in this term.
func (ls *Leases) SafeTime(node string, w wdlease.Watchdog) time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.l.SafeTimeFor(node, w)
}
