package term

import (
	"time"

	"github.com/nodefence/nodefence/coordinator/engine"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Input is what Step takes: Verdict, WouldRelease, Request, RecordRead, ReadFailed, Persisted,
// Conflict, Deposed.
type Input interface{ termInput() }

// Verdict is one of the engine's proof verdicts (Ready.Proofs); a wrong-machine verdict raises the
// alarm on its record.
type Verdict struct{ Result engine.ProofResult }

// WouldRelease is the release reconciler's finding that it would have released the pods of an
// observed record's node now (observe mode), at At, for Why. Ref names the caller waiting for the
// outcome (Act.Ref).
type WouldRelease struct {
	Node, Fence, Why string
	At               time.Time
	Ref              uint64
}

// Request is one of the engine's automatic fence requests with the fencing policy's verdict
// (Policy; the zero Policy in standalone mode), the node's delay (its random part drawn by the
// caller; none for an observed request), its configured steps and the time.
type Request struct {
	Req    engine.FenceRequest
	Policy Policy
	Delay  time.Duration
	Plan   func(string) ([]fenceconfig.Resolved, error)
	At     time.Time
}

// RecordRead is a fence record's current version, read for Ready.Reads: every decision waiting
// for the record is made on it.
type RecordRead struct {
	Record   *coordv1.NodeFence
	Revision int64
}

// Conflict is the record read again after write ID lost its compare-and-swap (the record
// changed since it was read): the decision is made again on it.
type Conflict struct {
	ID       uint64
	Record   *coordv1.NodeFence
	Revision int64
}

// ReadFailed says a record asked for in Ready.Reads could not be read.
type ReadFailed struct{ Fence, Err string }

// Persisted is the outcome of a write (Write.ID): the record as stored and, for a create, whether
// it was created (false: the node's active record stands and was returned), or the error that
// refused it (not a conflict, which is answered with a Conflict, and not a deposed epoch, which
// is answered with Deposed).
type Persisted struct {
	ID      uint64
	Record  *coordv1.NodeFence
	Created bool
	Err     string
}

// Deposed says the term ended (a write was refused for its epoch, or the term's lease was lost):
// nothing the core decided is persisted or acted on any more.
type Deposed struct{}

func (Verdict) termInput()      {}
func (WouldRelease) termInput() {}
func (Request) termInput()      {}
func (RecordRead) termInput()   {}
func (ReadFailed) termInput()   {}
func (Conflict) termInput()     {}
func (Persisted) termInput()    {}
func (Deposed) termInput()      {}

// Ready is what the core decided: records to read, writes to persist under Epoch (BEFORE anything
// else of this Ready leaves the process), acts whose writes were persisted, and audit entries.
type Ready struct {
	Reads  []string
	Writes []Write
	Acts   []Act
	Audit  []Entry
}

// Empty says whether there is nothing to do.
func (r Ready) Empty() bool {
	return len(r.Reads) == 0 && len(r.Writes) == 0 && len(r.Acts) == 0 && len(r.Audit) == 0
}

// Write is one record version to persist: a create (of a new record; the store returns the node's
// active record instead when one stands), or an update compare-and-swapped on Revision, the
// revision the record was read at. Epoch is the term's: a write under any other is refused.
type Write struct {
	ID       uint64
	Create   bool
	Record   *coordv1.NodeFence
	Revision int64
	Epoch    int64
}

// ActKind says what an Act is.
type ActKind int

const (
	// ActAlarm raises the wrong-machine alarm outside the record: the metric, the log, the
	// Kubernetes Event; Record (when written) goes to the engine.
	ActAlarm ActKind = iota + 1
	// ActWouldRelease answers the reconciler waiting as Ref: Record is the version written (nil
	// when the record said so already), Err the failure.
	ActWouldRelease
	// ActStartFence hands an automatic fence's record to the runner.
	ActStartFence
	// ActWouldFence follows an observed record's create: counted, mirrored, told to the engine.
	ActWouldFence
)

// Act is one decision to hand on, made after its write was persisted (or when none was needed).
type Act struct {
	Kind        ActKind
	Node, Fence string
	Record      *coordv1.NodeFence
	Created     bool
	Req         engine.FenceRequest
	Proof       engine.ProofResult
	Why         string
	Ref         uint64
	Err         string
}

// Entry is one audit-trail entry, written by the core's owner under the term's epoch.
type Entry struct {
	At               time.Time
	Node, Kind, Text string
}
