package term

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fencing"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// MaxConflicts bounds how often one decision is re-made on a fresher record after its write lost
// a compare-and-swap; past it the decision is given up and its act says so.
const MaxConflicts = 5

// Core is the term's record writer as a pure state machine (doc.go has its Ready contract). One
// goroutine owns it. It reads no clock and does no I/O.
type Core struct {
	epoch   int64
	deposed bool
	// updates are the decisions waiting for a record version (a read) or for their write's outcome,
	// by fence id and kind.
	updates map[updateKey]*update
	// creates are the admitted requests whose record's create is out, by write id.
	creates map[uint64]Request
	seq     uint64
	ready   Ready
}

type updateKey struct {
	fence string
	kind  ActKind
	ref   uint64 // the waiting caller of a would release (0 for an alarm: the first one stands)
}

// update is one decision to change an existing record: the wrong-machine alarm or would release.
type update struct {
	Node, Fence string
	At          time.Time
	Why         string
	Ref         uint64
	proof       engine.ProofResult
	conflicts   int
	// write is the id of the write out for it (0: waiting for a read).
	write uint64
}

// New returns the core of the term elected at epoch: every write it decides carries that epoch.
func New(epoch int64) *Core {
	return &Core{epoch: epoch, updates: map[updateKey]*update{}, creates: map[uint64]Request{}}
}

// Epoch is the term's epoch.
func (c *Core) Epoch() int64 { return c.epoch }

// Step feeds one input to the core.
func (c *Core) Step(in Input) {
	if c.deposed {
		return
	}
	switch in := in.(type) {
	case Verdict:
		if in.Result.Verdict != fencing.ProofWrongMachine {
			return
		}
		r := in.Result
		c.want(&update{Node: r.Node, Fence: r.Fence, At: r.At, Why: r.Why, proof: r}, ActAlarm)
	case WouldRelease:
		c.want(&update{Node: in.Node, Fence: in.Fence, At: in.At, Why: in.Why, Ref: in.Ref}, ActWouldRelease)
	case Request:
		c.admit(in)
	case RecordRead:
		for _, k := range c.keysOf(in.Record.GetId()) {
			if c.updates[k].write == 0 {
				c.decide(k, in.Record, in.Revision)
			}
		}
	case Conflict:
		c.conflict(in)
	case ReadFailed:
		for _, k := range c.keysOf(in.Fence) {
			if c.updates[k].write == 0 {
				c.finish(k, nil, in.Err)
			}
		}
	case Persisted:
		c.persisted(in)
	case Deposed:
		c.deposed = true
		c.ready = Ready{}
		clear(c.updates)
		clear(c.creates)
	}
}

// want records an update decision and asks for the record's current version. A decision already
// waiting for the same fence and kind keeps its place (the first alarm stands).
func (c *Core) want(u *update, kind ActKind) {
	k := updateKey{u.Fence, kind, u.Ref}
	if _, ok := c.updates[k]; ok {
		return
	}
	c.updates[k] = u
	c.ready.Reads = appendOnce(c.ready.Reads, u.Fence)
}

// admit applies the admission rule to an automatic fence request: held back (an audit entry), or
// the record's create goes out.
func (c *Core) admit(in Request) {
	ad := Admit(in.Req, in.Policy, in.Plan, in.Delay, c.epoch, in.At)
	if ad.Record == nil {
		c.ready.Audit = append(c.ready.Audit, Entry{At: in.At, Node: in.Req.Node, Kind: KindHeldBack, Text: ad.Held})
		return
	}
	c.seq++
	c.creates[c.seq] = in
	c.ready.Writes = append(c.ready.Writes, Write{ID: c.seq, Create: true, Record: ad.Record, Epoch: c.epoch})
}

// conflict decides again, on the record read again, the update whose write lost its
// compare-and-swap — at most MaxConflicts times.
func (c *Core) conflict(in Conflict) {
	for k, u := range c.updates {
		if u.write != in.ID {
			continue
		}
		u.conflicts++
		if u.conflicts > MaxConflicts {
			c.finish(k, nil, fmt.Sprintf("gave up after %d write conflicts", MaxConflicts))
			return
		}
		c.decide(k, in.Record, in.Revision)
	}
}

// decide makes an update's decision on the record's version read at revision.
func (c *Core) decide(k updateKey, rec *coordv1.NodeFence, revision int64) {
	u := c.updates[k]
	var next *coordv1.NodeFence
	if k.kind == ActAlarm {
		next = fencing.WrongMachine(rec, u.At, u.Why)
	} else {
		next = fencing.WouldRelease(rec, u.At, c.epoch)
	}
	if next == nil {
		c.finish(k, nil, "") // the record says so already: nothing to write
		return
	}
	c.seq++
	u.write = c.seq
	c.ready.Writes = append(c.ready.Writes, Write{ID: c.seq, Record: next, Revision: revision, Epoch: c.epoch})
}

// persisted follows a write's outcome: only now may what it decided act.
func (c *Core) persisted(in Persisted) {
	if req, ok := c.creates[in.ID]; ok {
		delete(c.creates, in.ID)
		c.created(req, in)
		return
	}
	for k, u := range c.updates {
		if u.write == in.ID {
			c.finish(k, in.Record, in.Err)
		}
	}
}

// created acts on an automatic fence's create: the runner starts it (an active record of the node
// that stood already runs instead), or an observed record is counted and audited as would fence.
func (c *Core) created(req Request, in Persisted) {
	a := Act{Kind: ActStartFence, Node: req.Req.Node, Record: in.Record, Created: in.Created, Req: req.Req, Err: in.Err}
	if req.Req.Observe {
		a.Kind = ActWouldFence
		if in.Err == "" && in.Created {
			c.ready.Audit = append(c.ready.Audit, Entry{At: req.At, Node: req.Req.Node, Kind: "would-fence",
				Text: fmt.Sprintf("fence %s recorded as would fence (observe mode): no driver was called", in.Record.GetId())})
		}
	}
	c.ready.Acts = append(c.ready.Acts, a)
}

// finish ends an update: its act goes out, with the record as written (nil when nothing was) or
// the error that stopped it.
func (c *Core) finish(k updateKey, rec *coordv1.NodeFence, err string) {
	u := c.updates[k]
	delete(c.updates, k)
	c.ready.Acts = append(c.ready.Acts, Act{Kind: k.kind, Node: u.Node, Fence: u.Fence, Record: rec, Proof: u.proof, Why: u.Why, Ref: u.Ref, Err: err})
	if k.kind == ActWouldRelease && rec != nil && err == "" {
		c.ready.Audit = append(c.ready.Audit, Entry{At: u.At, Node: u.Node, Kind: "would-release", Text: u.Why})
	}
}

// keysOf lists the updates of a fence, in a fixed order.
func (c *Core) keysOf(fence string) []updateKey {
	var ks []updateKey
	for k := range c.updates {
		if k.fence == fence {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, func(a, b updateKey) int {
		if a.kind != b.kind {
			return cmp.Compare(a.kind, b.kind)
		}
		return cmp.Compare(a.ref, b.ref)
	})
	return ks
}

// Ready returns what the core decided since the last Advance. A deposed core's Ready is empty.
func (c *Core) Ready() Ready { return c.ready }

// Advance acknowledges the last Ready: its writes were persisted (their outcomes are Stepped in
// after), its acts handed on.
func (c *Core) Advance() { c.ready = Ready{} }

// Pending says how many decisions wait for a read or a write's outcome.
func (c *Core) Pending() int { return len(c.updates) + len(c.creates) }

// Deposed says whether the core learned that its term ended.
func (c *Core) Deposed() bool { return c.deposed }

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}
