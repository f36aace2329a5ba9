// Package kit is the shared fence-driver kit: it implements the nodefence.driver.v1
// FenceDriverService over a small Driver interface, so that a driver is only its protocol.
//
// The kit owns everything that must behave the same for every device:
//   - request validation and parameter canonicalisation (ClusterLabs aliases, defaults, types),
//     driven by the driver's own parameter descriptions;
//   - the fencing token: a mutating call whose epoch is lower than the highest seen for the same
//     device is rejected with fault.ErrStaleEpoch; a higher epoch is persisted atomically in the
//     state directory BEFORE the device is touched, so it survives restarts;
//   - operation_id de-duplication: a repeat of a completed operation returns the first result
//     without touching the device, and a repeat of a running one waits for it;
//   - one mutating operation at a time per device;
//   - the deadline (request timeout or the default), enforced even if a driver ignores its context;
//   - verification by read-back: an action succeeds only once Status has read the wanted state
//     several times in a row (a flapping device is never confirmed);
//   - one audit log line per operation, with secret parameters masked.
package kit

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Target is one fenceable thing as a driver sees it.
type Target struct {
	// Name is a human label (usually the node name) for logs.
	Name string
	// Params are the target parameters, canonicalised: names are the canonical names of the
	// driver's Describe (aliases resolved, lower case, '-' read as '_'), defaults filled in,
	// booleans "1" or "0". Parameters the driver does not describe are passed through unchanged.
	Params map[string]string
	// Parsed is the driver's typed form of Params, as its Parse returned it: the kit parses a
	// target once per request and every driver method reads the result through ParsedAs. Nil in
	// a Target built outside the kit (or by a TargetResolver that leaves it out): ParsedAs then
	// parses Params.
	Parsed any
}

// ParsedAs returns t's parameters in the driver's typed form P: t.Parsed when it holds a P, else
// what parse makes of t.Params.
func ParsedAs[P any](t Target, parse func(map[string]string) (P, error)) (P, error) {
	if p, ok := t.Parsed.(P); ok {
		return p, nil
	}
	return parse(t.Params)
}

// Driver is a fence device protocol. The kit calls it only with validated, canonical targets and
// a context carrying the operation's deadline; the driver must honour that context.
type Driver interface {
	// Name is the driver name as given to `fence-driver --driver`.
	Name() string
	// Describe lists the parameters the driver accepts, like a fence agent's metadata. The kit
	// uses it to resolve aliases, fill defaults, check required and typed values and mask secrets.
	Describe() []*driverv1.Parameter
	// Parse checks canonical parameters and returns them in the driver's typed form, which the
	// kit keeps in Target.Parsed, or a fault.Invalid naming each bad one.
	Parse(params map[string]string) (any, error)
	// DeviceKey identifies the physical device and plug: the scope of epochs and locking.
	DeviceKey(t Target) string
	// PowerOff asks the device to turn the target off. It need not wait for the effect.
	PowerOff(ctx context.Context, t Target) error
	// PowerOn asks the device to turn the target on. It need not wait for the effect.
	PowerOn(ctx context.Context, t Target) error
	// Status reads the power state. It returns POWER_STATE_UNKNOWN (or an error) whenever the
	// answer is in doubt, and never POWER_STATE_OFF unless the device said so.
	Status(ctx context.Context, t Target) (driverv1.PowerState, error)
}

// TargetResolver is implemented by drivers whose targets can name one device in ways DeviceKey
// cannot tell apart without asking the device (a PDU outlet by its name or by its number). Before
// a mutation's epoch check the kit calls ResolveTarget, with the operation's deadline, and uses the
// target it returns, which names the device the canonical way, for the epoch, the device lock and
// the action (its Parsed must match its Params, or be nil): a deposed leader cannot reach a device under another of its names, and what is locked
// is what is switched. Only mutations resolve; Status and Monitor read whatever the target names.
type TargetResolver interface {
	ResolveTarget(ctx context.Context, t Target) (Target, error)
}

// Lister is implemented by drivers whose devices have plugs or ports to enumerate.
type Lister interface {
	// List returns the plugs of the target's device.
	List(ctx context.Context, t Target) ([]*driverv1.Plug, error)
}

// Monitorer is implemented by drivers that can check a device without changing power.
type Monitorer interface {
	// Monitor returns nil when the device answered and accepted the credentials; otherwise an
	// error wrapping fault.ErrUnreachable, fault.ErrUnauthenticated or the context's error.
	Monitor(ctx context.Context, t Target) error
}

// Documented is implemented by drivers that describe their devices in words for Describe.
type Documented interface {
	// Description says what devices the driver controls.
	Description() string
}

// Options configures a Service. Zero fields take the defaults documented on each field.
type Options struct {
	// StateDir holds the persisted epochs and the answers of recent operations (de-duplication
	// across restarts). Required; created if missing.
	StateDir string
	// DefaultTimeout bounds an operation whose request has no timeout. Default 20 s.
	DefaultTimeout time.Duration
	// PollInterval is the pause between status reads while verifying an action. Default 100 ms.
	PollInterval time.Duration
	// ConfirmReads is how many consecutive status reads must see the wanted state before an
	// action is confirmed; the confirming reads follow each other without a pause. A device
	// whose status flaps is never confirmed. Default 2.
	ConfirmReads int
	// Log receives the audit lines. Default slog.Default().
	Log *slog.Logger
	// Metrics receives per-device results and latencies; nil records none.
	Metrics *Metrics
	// Resolver looks up a device's host name for its key (ResolvedKey). Default net.DefaultResolver.
	Resolver Resolver
}

// SetDefaults fills the zero fields.
func (o *Options) SetDefaults() {
	if o.DefaultTimeout == 0 {
		o.DefaultTimeout = 20 * time.Second
	}
	if o.PollInterval == 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.ConfirmReads == 0 {
		o.ConfirmReads = 2
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
}

// TargetDescriber is an optional capability: a driver whose parameters depend on the target (the
// fence-agent runner describes the agent a target names) answers Describe for a given target.
type TargetDescriber interface {
	DescribeTarget(params map[string]string) ([]*driverv1.Parameter, string, error)
}

// KeyPart canonicalizes one part of a device key: trimmed, and a decimal number written by its
// value ("07" and "7" name one outlet or port), so spellings of one device share its lock and epoch.
func KeyPart(s string) string {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseUint(s, 10, 63); err == nil {
		return strconv.FormatUint(n, 10)
	}
	return s
}

// ParseSeconds reads a driver timeout the way the ClusterLabs agents write it, a number of seconds
// ("2", "0.5"), or as a Go duration ("500ms"), and requires it within [minD, maxD].
func ParseSeconds(v string, minD, maxD time.Duration) (time.Duration, error) {
	v = strings.TrimSpace(v)
	var inRange bool
	var d time.Duration
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		// Compared as seconds before converting: NaN, ±Inf and huge values have no Duration.
		inRange = f >= minD.Seconds() && f <= maxD.Seconds()
		d = time.Duration(f * float64(time.Second))
	} else if d, err = time.ParseDuration(v); err != nil {
		return 0, fmt.Errorf("must be seconds (e.g. 2 or 0.5) or a duration (e.g. 500ms), got %q", v)
	} else {
		inRange = d >= minD && d <= maxD
	}
	if !inRange {
		return 0, fmt.Errorf("must be between %s and %s, got %q", minD, maxD, v)
	}
	return d, nil
}
