package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Kind is a kind of fault.
type Kind int

// The faults a schedule draws from.
const (
	KillLeader      Kind = iota // SIGKILL the leader, restart it after the pause
	StopLeader                  // SIGSTOP the leader for the duration, then SIGCONT
	CutLeaderEtcd               // drop every packet between the leader and the etcd members
	CutLeaderAgents             // drop every packet between the leader and every agent
	LoseEtcdMember              // SIGKILL one etcd member, restart it after the duration
	RestartDriver               // SIGKILL the fence-driver and start it again at once
	KillNode                    // a node dies: SIGKILL its agent for good (the node must be fenced)
	kinds
)

func (k Kind) String() string {
	return [...]string{"kill-leader", "stop-leader", "cut-leader-etcd", "cut-leader-agents", "lose-etcd-member",
		"restart-driver", "kill-node"}[k]
}

// Step is one fault of a schedule: injected, held for For, undone, then Pause before the next.
type Step struct {
	Kind  Kind
	For   time.Duration
	Pause time.Duration
	// Pick chooses among candidates (an etcd member, a node), as an index modulo their number.
	Pick int
}

func (s Step) String() string {
	return fmt.Sprintf("%s for %s (pick %d), then %s", s.Kind, s.For, s.Pick, s.Pause)
}

// Schedule draws n steps from seed: the same seed gives the same steps. maxDead of them (if n allows)
// kill a node, the first within the first third of the schedule, so that the other faults strike
// while fences are in flight (the fence budget and the storm guard allow only a few automatic fences).
func Schedule(seed uint64, n, maxDead int) []Step {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	step := func(k Kind) Step {
		return Step{Kind: k, For: time.Duration(1000+r.IntN(5000)) * time.Millisecond,
			Pause: time.Duration(500+r.IntN(2000)) * time.Millisecond, Pick: r.IntN(1 << 16)}
	}
	var out []Step
	for len(out) < n-min(maxDead, n) {
		out = append(out, step(Kind(r.IntN(int(KillNode))))) // every kind but KillNode
	}
	for d := 0; d < min(maxDead, n); d++ {
		at := r.IntN(len(out) + 1)
		if d == 0 {
			at = r.IntN(len(out)/3 + 1)
		}
		out = append(out[:at], append([]Step{step(KillNode)}, out[at:]...)...)
	}
	return out
}

// Apply injects one step's fault into c, holds it, and undoes it. dead collects the nodes killed.
func (c *Cluster) Apply(ctx context.Context, s Step, dead map[string]bool) error {
	hold := func() {
		select {
		case <-ctx.Done():
		case <-time.After(s.For):
		}
	}
	switch s.Kind {
	case KillLeader, StopLeader, CutLeaderEtcd, CutLeaderAgents:
		l, ok, err := c.CurrentLeader(ctx)
		if err != nil || !ok {
			c.opts.Log("%s: no leader to act on (%v)", s.Kind, err)
			return nil
		}
		p := c.Coord[l.Index]
		c.opts.Log("%s: %s (epoch %d) for %s", s.Kind, p.Name, l.Epoch, s.For)
		switch s.Kind {
		case KillLeader:
			if err := p.Signal(syscall.SIGKILL); err != nil {
				return err
			}
			hold()
			return p.Start()
		case StopLeader:
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				return err
			}
			hold()
			return p.Signal(syscall.SIGCONT)
		case CutLeaderEtcd:
			return c.cutFor(p.Member, c.members(c.Etcd), hold)
		case CutLeaderAgents:
			return c.cutFor(p.Member, c.members(c.Agents), hold)
		}
	case LoseEtcdMember:
		p := c.Etcd[s.Pick%len(c.Etcd)]
		c.opts.Log("%s: %s for %s", s.Kind, p.Name, s.For)
		if err := p.Signal(syscall.SIGKILL); err != nil {
			return err
		}
		hold()
		return p.Start()
	case RestartDriver:
		c.opts.Log("%s", s.Kind)
		if err := c.Driver.Signal(syscall.SIGKILL); err != nil {
			return err
		}
		return c.Driver.Start()
	case KillNode:
		var alive []int
		for i, n := range c.Nodes {
			if !dead[n] {
				alive = append(alive, i)
			}
		}
		if len(alive) <= 1 {
			return nil
		}
		i := alive[s.Pick%len(alive)]
		c.opts.Log("%s: %s", s.Kind, c.Nodes[i])
		dead[c.Nodes[i]] = true
		return c.Agents[i].Signal(syscall.SIGKILL)
	}
	return nil
}

func (c *Cluster) members(ps []*Proc) []string {
	var out []string
	for _, p := range ps {
		if p.Running() || p.Name[0] == 'e' {
			out = append(out, p.Member)
		}
	}
	return out
}

// cutFor cuts member from every peer, holds, and heals.
func (c *Cluster) cutFor(member string, peers []string, hold func()) error {
	for _, p := range peers {
		if err := c.Net.Cut(member, p); err != nil {
			return err
		}
	}
	hold()
	for _, p := range peers {
		if err := c.Net.Heal(member, p); err != nil {
			return err
		}
	}
	return nil
}

// Run applies the steps in order. After each it waits (at most recover) for a leader that every
// live agent is connected to; at the end (at most settle) for every killed node to be fenced. It
// then checks the invariants. Recovery failures are reported as problems too.
func (c *Cluster) Run(ctx context.Context, steps []Step, recover, settle time.Duration) Report {
	dead := map[string]bool{}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	seen := c.Watch(rctx, 500*time.Millisecond)
	var problems []string
	for i, s := range steps {
		if ctx.Err() != nil {
			break
		}
		c.opts.Log("step %d/%d: %s", i+1, len(steps), s)
		seen.during(fmt.Sprintf("step %d (%s)", i+1, s.Kind), dead)
		err := c.Apply(ctx, s, dead)
		// A killed node's agent is dead from here on: its fence comes a grace period later.
		seen.during(fmt.Sprintf("step %d (%s)", i+1, s.Kind), dead)
		if err != nil {
			problems = append(problems, fmt.Sprintf("step %d (%s): %v", i+1, s.Kind, err))
			break
		}
		start := time.Now()
		if err := c.waitLive(ctx, recover, dead); err != nil {
			problems = append(problems, fmt.Sprintf("step %d (%s): not recovered: %v", i+1, s.Kind, err))
		} else {
			c.opts.Log("step %d: leader and every live agent back after %s", i+1, time.Since(start).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
		case <-time.After(s.Pause):
		}
	}
	if err := poll(ctx, settle, "every killed node fenced", func() error {
		fs, err := c.ListFences(ctx)
		if err != nil {
			return err
		}
		done := map[string]bool{}
		for _, f := range fs {
			if f.Status == coordv1.FenceStatus_FENCE_STATUS_DONE && f.ConfirmedOffAt != nil {
				done[f.Node] = true
			}
		}
		for n := range dead {
			if !done[n] {
				return fmt.Errorf("node %s has no confirmed fence", n)
			}
		}
		return nil
	}); err != nil {
		problems = append(problems, err.Error())
	}
	seen.during("the settling after the last step", dead)
	seen.look(ctx)
	stop()
	r := c.Verify(ctx, dead, seen)
	r.Looks = seen.Looks()
	if r.Looks == 0 {
		problems = append(problems, "the invariants were never checked while the run went: no observation could be taken whole")
	}
	r.Problems = append(append(problems, seen.Violations()...), r.Problems...)
	return r
}

// waitLive waits for a leader to which every live node's agent is connected.
func (c *Cluster) waitLive(ctx context.Context, timeout time.Duration, dead map[string]bool) error {
	var want []string
	for _, n := range c.Nodes {
		if !dead[n] {
			want = append(want, n)
		}
	}
	return poll(ctx, timeout, "leader with every live agent", func() error {
		l, ok, err := c.CurrentLeader(ctx)
		if err != nil || !ok {
			return fmt.Errorf("no leader (%v)", err)
		}
		got, err := c.ConnectedNodes(ctx, l.Index)
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, n := range got {
			have[n] = true
		}
		for _, n := range want {
			if !have[n] {
				return fmt.Errorf("%s not connected to leader %s", n, l.ID)
			}
		}
		return nil
	})
}
