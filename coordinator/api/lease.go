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
	g := ls.l.Request(node, hb.GetLeaseEpoch(), hb.GetLeaseGrantId(), at)
	ls.mu.Unlock()
	return &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Lease{Lease: &agentv1.LeaseGrant{
		Epoch: g.Epoch, GrantId: g.ID, Duration: durationpb.New(g.Duration), RequestSeq: seq,
	}}}
}
