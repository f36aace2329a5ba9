package wdlease

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// The world the checker drives: n agents, each on a node with a watchdog, one leader at a time, a
// network that loses, delays and partitions, all on real time in steps. Every process reads its
// own drifting clock; the watchdog has its own too. Nothing here decides: the agents and leaders
// call the package's rule and the world only carries messages and time.

const step = 10 * time.Millisecond

var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is a process's clock: it advances at rate (within [1-ρ, 1+ρ]) per real step.
type clock struct {
	local float64 // ns since epoch0
	rate  float64
}

func (c *clock) now() time.Time { return epoch0.Add(time.Duration(c.local)) }
func (c *clock) tick()          { c.local += float64(step) * c.rate }

// world parameters, drawn per schedule.
type params struct {
	b          Bounds
	n          int
	liars      int
	duration   time.Duration
	heartbeat  time.Duration
	loss       float64
	longDelayP float64
	maxDelay   time.Duration
	restartP   float64 // per agent per step: the agent process restarts
	crashP     float64 // per node per step: the node loses power
	partitionP float64 // per step: the partition changes
	oneWay     bool    // partitions may block one direction only
	leaderP    float64 // per step: the leader's term ends
}

type msgKind int

const (
	heartbeat msgKind = iota
	grantMsg
	query
	answer
)

type msg struct {
	at       int // step of delivery
	kind     msgKind
	from, to int // agent index; n is the leader
	inc      int // the receiving incarnation (agent) or term (leader) it was sent to
	finc     int // the sender's incarnation, for the answer
	seq      uint64
	echoE    int64
	echoID   uint64
	grant    Grant
	qid      uint64
	noLease  bool
	fromName string
}

type agentSim struct {
	name     string
	liar     bool
	alive    bool // the node is up
	fed      bool // the watchdog was fed in this boot: the node may run pods
	inc      int  // incarnation of the agent process (new on restart and on boot)
	bootAt   int  // step the node boots again when !alive
	clk, wdc clock
	wdArmed  bool
	wdLast   float64 // watchdog clock at the last feed
	lease    *Agent
	seq      uint64
	sent     map[uint64]time.Time
	nextHB   time.Time
	nextQ    time.Time
	qid      uint64
	confs    [2]Confirmation // the current and the previous query
	feedAt   int             // step of a decided, pending feed (-1: none)
	feedInc  int
}

type leaderSim struct {
	up   bool
	term int
	clk  clock
	l    *Leader
	next int // step the next term starts when !up
}

type world struct {
	p      params
	r      *rand.Rand
	now    int
	agents []*agentSim
	leader leaderSim
	group  []int
	block  map[[2]int]bool
	inbox  []msg
	spare  []msg
	viol   string
	stats  stats
}

type stats struct{ declared, peerFeeds, resets int }

func (w *world) rate() float64 {
	rho := float64(w.p.b.RatePPM) / ppm
	switch w.r.IntN(5) {
	case 0:
		return 1 + (2*w.r.Float64()-1)*rho
	case 1, 2:
		return 1 - rho
	}
	return 1 + rho
}

func newWorld(p params, seed uint64) *world {
	w := &world{p: p, r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), block: map[[2]int]bool{}}
	w.group = make([]int, p.n+1)
	for i := range p.n {
		a := &agentSim{name: fmt.Sprintf("n%d", i), liar: i < p.liars, alive: true}
		a.clk = clock{local: w.r.Float64() * 1e12, rate: w.rate()}
		a.wdc = clock{local: w.r.Float64() * 1e12, rate: w.rate()}
		w.agents = append(w.agents, a)
		w.startAgent(a)
	}
	w.leader.clk = clock{local: w.r.Float64() * 1e12, rate: w.rate()}
	w.startTerm()
	return w
}

func (w *world) startAgent(a *agentSim) {
	a.inc++
	now := a.clk.now()
	a.lease = NewAgent(w.p.b, now)
	a.seq, a.sent, a.qid = 0, map[uint64]time.Time{}, 0
	a.confs = [2]Confirmation{}
	a.nextHB, a.nextQ = now, now
	a.feedAt = -1
}

func (w *world) startTerm() {
	w.leader.up = true
	w.leader.term++
	w.leader.l = NewLeader(w.p.b, int64(w.leader.term), w.leader.clk.now())
}

// send queues m if the link is up now; it arrives after a random delay unless lost.
func (w *world) send(m msg) {
	if w.r.Float64() < w.p.loss {
		return
	}
	d := time.Duration(w.r.Int64N(int64(60 * time.Millisecond)))
	if w.r.Float64() < w.p.longDelayP {
		d = time.Duration(w.r.Int64N(int64(w.p.maxDelay)))
	}
	m.at = w.now + int(d/step) + 1
	w.inbox = append(w.inbox, m)
}

func (w *world) linked(from, to int) bool {
	return w.group[from] == w.group[to] && !w.block[[2]int{from, to}]
}

// repartition draws a new shape: one to three groups over the agents and the leader, and with
// oneWay some links that carry only one direction.
func (w *world) repartition() {
	g := 1 + w.r.IntN(3)
	for i := range w.group {
		w.group[i] = w.r.IntN(g)
	}
	if w.r.IntN(2) == 0 {
		// Half the shapes keep the leader with a majority of the agents: the rest, in one or two
		// groups that see themselves, are the minority the rule is about.
		perm := w.r.Perm(w.p.n)
		for k, i := range perm {
			if k < Majority(w.p.n) {
				w.group[i] = 0
			} else {
				w.group[i] = 1 + w.r.IntN(2)
			}
		}
		w.group[w.p.n] = 0
	}
	clear(w.block)
	if w.p.oneWay && w.r.IntN(2) == 0 {
		for range 1 + w.r.IntN(w.p.n) {
			a, b := w.r.IntN(w.p.n+1), w.r.IntN(w.p.n+1)
			if a != b {
				w.block[[2]int{a, b}] = true
			}
		}
	}
}

// run plays the schedule to its end or to the first violation of the invariant.
func (w *world) run() {
	steps := int(w.p.duration / step)
	for ; w.now < steps && w.viol == ""; w.now++ {
		w.runStep()
	}
}

// runStep is one step of real time: faults, clocks, due feeds, watchdogs, messages, every agent's
// turn, and the leader's judgement last.
func (w *world) runStep() {
	w.faults()
	w.tick()
	w.feeds()
	w.watchdogs()
	w.deliver()
	for i := range w.agents {
		w.act(i)
	}
	w.judge()
}

func (w *world) faults() {
	if w.r.Float64() < w.p.partitionP {
		w.repartition()
	}
	if w.leader.up && w.r.Float64() < w.p.leaderP {
		w.leader.up, w.leader.next = false, w.now+w.r.IntN(200)
	} else if !w.leader.up && w.now >= w.leader.next {
		w.leader.clk.rate = w.rate()
		w.startTerm()
	}
	for _, a := range w.agents {
		switch {
		case !a.alive && w.now >= a.bootAt:
			a.alive = true
			w.startAgent(a)
		case a.alive && w.r.Float64() < w.p.crashP:
			w.down(a, w.now+50+w.r.IntN(300))
		case a.alive && w.r.Float64() < w.p.restartP:
			w.startAgent(a) // the process restarts; the watchdog stays armed
		}
	}
}

// down takes a node down (a reset or a power loss) until the step it boots again.
func (w *world) down(a *agentSim, boot int) {
	a.alive, a.fed, a.wdArmed, a.bootAt = false, false, false, boot
	a.inc++
}

func (w *world) tick() {
	w.leader.clk.tick()
	if w.r.IntN(500) == 0 {
		w.leader.clk.rate = w.rate()
	}
	for _, a := range w.agents {
		a.clk.tick()
		a.wdc.tick()
		if w.r.IntN(500) == 0 {
			a.clk.rate, a.wdc.rate = w.rate(), w.rate()
		}
	}
}

// feeds writes the decided feeds that are due: the write reaches the device, arming it in a boot.
func (w *world) feeds() {
	for _, a := range w.agents {
		if a.feedAt >= 0 && w.now >= a.feedAt {
			if a.alive && a.feedInc == a.inc {
				a.wdArmed, a.wdLast, a.fed = true, a.wdc.local, true
			}
			a.feedAt = -1
		}
	}
}

// watchdogs resets every node whose armed watchdog went unfed for T by its own timer.
func (w *world) watchdogs() {
	for _, a := range w.agents {
		if a.alive && a.wdArmed && a.wdc.local-a.wdLast >= float64(w.p.b.Watchdog) {
			w.stats.resets++
			w.down(a, w.now+50+w.r.IntN(250))
		}
	}
}

func (w *world) deliver() {
	due := w.inbox
	w.inbox = w.spare[:0] // answers sent below join the undelivered here
	defer func() { w.spare = due }()
	for _, m := range due {
		if m.at > w.now {
			w.inbox = append(w.inbox, m)
			continue
		}
		if !w.linked(m.from, m.to) {
			continue
		}
		if m.to == w.p.n {
			if w.leader.up && m.inc == w.leader.term {
				w.atLeader(m)
			}
			continue
		}
		if a := w.agents[m.to]; a.alive && m.inc == a.inc {
			w.atAgent(a, m)
		}
	}
}

func (w *world) atLeader(m msg) {
	a := w.agents[m.from]
	g := w.leader.l.Request(a.name, m.echoE, m.echoID, w.leader.clk.now())
	w.send(msg{kind: grantMsg, from: w.p.n, to: m.from, inc: m.finc, seq: m.seq, grant: g})
}

func (w *world) atAgent(a *agentSim, m msg) {
	now := a.clk.now()
	switch m.kind {
	case grantMsg:
		if sent, ok := a.sent[m.seq]; ok {
			_ = a.lease.Grant(m.grant, sent, now) // a refused grant is simply not held
		}
	case query:
		no := a.liar || a.lease.AnswerNoLease(now)
		w.send(msg{kind: answer, from: m.to, to: m.from, inc: m.finc, qid: m.qid, noLease: no, fromName: a.name})
	case answer:
		for i := range a.confs {
			if m.noLease && a.confs[i].QueriedAt.UnixNano() == int64(m.qid) {
				a.confs[i].NoLease = append(a.confs[i].NoLease, m.fromName)
			}
		}
	}
}

// act is one agent's turn: heartbeat when due, query its peers while it holds no lease, and decide
// whether to feed (at every step: the latest feeds are the worst case).
func (w *world) act(i int) {
	a := w.agents[i]
	if !a.alive {
		return
	}
	now := a.clk.now()
	if !now.Before(a.nextHB) {
		a.seq++
		a.sent[a.seq] = now
		delete(a.sent, a.seq-32)
		e, id := a.lease.Echo()
		if w.leader.up && w.linked(i, w.p.n) {
			w.send(msg{kind: heartbeat, from: i, to: w.p.n, inc: w.leader.term, finc: a.inc, seq: a.seq, echoE: e, echoID: id})
		}
		a.nextHB = now.Add(w.p.heartbeat)
	}
	if !a.lease.Holds(now) && !now.Before(a.nextQ) {
		a.confs[1], a.confs[0] = a.confs[0], Confirmation{QueriedAt: now}
		for j := range w.agents {
			if j != i && w.linked(i, j) {
				w.send(msg{kind: query, from: i, to: j, inc: w.agents[j].inc, finc: a.inc, qid: uint64(now.UnixNano())})
			}
		}
		a.nextQ = now.Add(w.p.b.PeerAge / 3)
	}
	d := a.lease.MayFeed(now, a.name, w.p.n, a.confs[0])
	if d == Stop {
		d = a.lease.MayFeed(now, a.name, w.p.n, a.confs[1])
	}
	if d != Stop && a.feedAt < 0 {
		delay := w.r.IntN(int(w.p.b.Sched/step) + 1)
		if w.r.IntN(2) == 0 {
			delay = int(w.p.b.Sched / step)
		}
		a.feedAt, a.feedInc = w.now+delay, a.inc
		if d == FeedPeers {
			w.stats.peerFeeds++
		}
	}
}

// judge asks the leader's rule about every node and checks the invariant where it says
// "self-fenced": the node must not be running (up, in a boot whose watchdog was fed).
func (w *world) judge() {
	if !w.leader.up {
		return
	}
	now := w.leader.clk.now()
	for _, a := range w.agents {
		if ok, _ := w.leader.l.SelfFenced(a.name, Watchdog{Armed: true, Timeout: w.p.b.Watchdog}, w.p.n, now); ok {
			w.stats.declared++
			if a.alive && a.fed {
				w.viol = fmt.Sprintf("step %d (%s): term %d takes %s as self-fenced while it runs (liar %v)",
					w.now, time.Duration(w.now)*step, w.leader.term, a.name, a.liar)
			}
		}
	}
}
