// Package conformance is the test suite every fence driver passes against its simulator, run as a
// real server: the same promises, checked the same way, for every protocol.
//
// A driver's test builds a Harness (a client of its driver service over gRPC and a way to make
// simulated devices in each Condition, with an independent way to read their true power state)
// and calls Run. The suite checks that a driver never lies: power off twice is OK twice; on after
// off works; status follows the device; a stale epoch is refused; a hanging device gives
// DeadlineExceeded inside the deadline; a stuck or flapping device is never reported off; wrong
// credentials give a clear error without the secret; an unknown plug is InvalidArgument, never off.
package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Condition is how the simulated device behind a target behaves.
type Condition int

const (
	// Healthy devices obey: commands change the power state, status reads it. They start on.
	Healthy Condition = iota
	// Stuck devices accept power commands but never change state. They start on.
	Stuck
	// Hanging devices never answer.
	Hanging
	// Flapping devices answer status reads alternately on and off.
	Flapping
	// WrongCredentials is a healthy device (on) addressed with credentials it refuses.
	WrongCredentials
	// UnknownPlug names a plug or outlet the device does not have.
	UnknownPlug
)

// String names the condition.
func (c Condition) String() string {
	switch c {
	case Healthy:
		return "healthy"
	case Stuck:
		return "stuck"
	case Hanging:
		return "hanging"
	case Flapping:
		return "flapping"
	case WrongCredentials:
		return "wrong credentials"
	case UnknownPlug:
		return "unknown plug"
	}
	return fmt.Sprintf("Condition(%d)", int(c))
}

// Device is one simulated device (or plug) made by the harness.
type Device struct {
	// Target addresses the device through the driver under test.
	Target *driverv1.Target
	// Power reads the true power state independently of the driver (from the simulator's own
	// state, or with another client). Nil when the condition has no state to read (a device
	// that never answers, a plug that does not exist).
	Power func(ctx context.Context) (driverv1.PowerState, error)
}

// Harness is what a driver's test provides.
type Harness struct {
	// Client calls the driver service under test, over real gRPC.
	Client driverv1.FenceDriverServiceClient
	// NewDevice makes a fresh device in condition c: its own device key (so epochs and state
	// from other cases do not leak in), powered on unless c says otherwise. It calls t.Skip for
	// a condition the driver's simulator cannot produce, and t.Fatal when it fails.
	NewDevice func(t *testing.T, c Condition) Device
	// Timeout is the request timeout of the failure cases (hanging, stuck, flapping). Default 1 s.
	Timeout time.Duration
	// OKTimeout is the request timeout of the cases expected to succeed. Default 15 s.
	OKTimeout time.Duration
	// Slack is how far past Timeout a failure may return. Default 500 ms.
	Slack time.Duration
	// CredentialCodes are the codes accepted for wrong credentials. Default Unauthenticated
	// only; a runner of reference agents, whose failures do not say why, may add Unavailable.
	CredentialCodes []codes.Code
}

func (h *Harness) setDefaults() {
	if h.Timeout == 0 {
		h.Timeout = time.Second
	}
	if h.OKTimeout == 0 {
		h.OKTimeout = 15 * time.Second
	}
	if h.Slack == 0 {
		h.Slack = 500 * time.Millisecond
	}
	if len(h.CredentialCodes) == 0 {
		h.CredentialCodes = []codes.Code{codes.Unauthenticated}
	}
}

var seq atomic.Int64

func opID(c string) string {
	return fmt.Sprintf("conformance-%s-%d-%d", strings.ReplaceAll(c, " ", "-"), time.Now().UnixNano(), seq.Add(1))
}

const (
	on  = driverv1.PowerState_POWER_STATE_ON
	off = driverv1.PowerState_POWER_STATE_OFF
)

// Run runs every case as a subtest of t. Cases run one after another.
func Run(t *testing.T, h Harness) {
	h.setDefaults()
	cases := []struct {
		name string
		fn   func(*testing.T, *Harness)
	}{
		{"OffTwiceIsOKTwice", offTwice},
		{"OnAfterOff", onAfterOff},
		{"StatusFollows", statusFollows},
		{"RebootEndsOn", reboot},
		{"StaleEpochRefused", staleEpoch},
		{"HangingDeviceDeadlineExceeded", hanging},
		{"StuckDeviceNeverOff", stuck},
		{"FlappingDeviceNeverConfirmed", flapping},
		{"WrongCredentialsClearError", wrongCredentials},
		{"UnknownPlugInvalidArgument", unknownPlug},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, &h) })
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// truth reads the true state and fails the test when it differs from want.
func truth(t *testing.T, d Device, want driverv1.PowerState, when string) {
	t.Helper()
	if d.Power == nil {
		return
	}
	ctx := ctxFor(t, 10*time.Second)
	got, err := d.Power(ctx)
	if err != nil {
		t.Fatalf("%s: reading the true state: %v", when, err)
	}
	if got != want {
		t.Fatalf("%s: the device is really %v, want %v", when, got, want)
	}
}

func wantCode(t *testing.T, what string, err error, want ...codes.Code) {
	t.Helper()
	if got := status.Code(err); !slices.Contains(want, got) {
		t.Fatalf("%s: error %v (code %s); want code %v", what, err, got, want)
	}
}

func (h *Harness) off(ctx context.Context, d Device, epoch int64, timeout time.Duration) (*driverv1.PowerOffResponse, error) {
	return h.Client.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID("off"), Epoch: epoch, Target: d.Target, Timeout: durationpb.New(timeout)})
}

func (h *Harness) on(ctx context.Context, d Device, epoch int64, timeout time.Duration) (*driverv1.PowerOnResponse, error) {
	return h.Client.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID("on"), Epoch: epoch, Target: d.Target, Timeout: durationpb.New(timeout)})
}

func (h *Harness) status(ctx context.Context, d Device, timeout time.Duration) (*driverv1.StatusResponse, error) {
	return h.Client.Status(ctx, &driverv1.StatusRequest{Target: d.Target, Timeout: durationpb.New(timeout)})
}

func (h *Harness) mustOff(t *testing.T, ctx context.Context, d Device, epoch int64, what string) {
	t.Helper()
	resp, err := h.off(ctx, d, epoch, h.OKTimeout)
	if err != nil {
		t.Fatalf("%s: PowerOff: %v", what, err)
	}
	if resp.GetState() != off || resp.GetPolls() < 1 || resp.GetConfirmedAt() == nil {
		t.Fatalf("%s: PowerOff = %v; want OFF confirmed by a read-back", what, resp)
	}
	truth(t, d, off, what+": after PowerOff")
}

func (h *Harness) mustOn(t *testing.T, ctx context.Context, d Device, epoch int64, what string) {
	t.Helper()
	resp, err := h.on(ctx, d, epoch, h.OKTimeout)
	if err != nil {
		t.Fatalf("%s: PowerOn: %v", what, err)
	}
	if resp.GetState() != on || resp.GetConfirmedAt() == nil {
		t.Fatalf("%s: PowerOn = %v; want ON confirmed by a read-back", what, resp)
	}
	truth(t, d, on, what+": after PowerOn")
}

func (h *Harness) mustStatus(t *testing.T, ctx context.Context, d Device, want driverv1.PowerState, what string) {
	t.Helper()
	resp, err := h.status(ctx, d, h.OKTimeout)
	if err != nil {
		t.Fatalf("%s: Status: %v", what, err)
	}
	if resp.GetState() != want {
		t.Fatalf("%s: Status = %v; want %v", what, resp.GetState(), want)
	}
}

func offTwice(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Healthy)
	ctx := ctxFor(t, 4*h.OKTimeout)
	truth(t, d, on, "before")
	h.mustOff(t, ctx, d, 1, "first")
	h.mustOff(t, ctx, d, 1, "second (already off)")
}

func onAfterOff(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Healthy)
	ctx := ctxFor(t, 4*h.OKTimeout)
	h.mustOff(t, ctx, d, 1, "off")
	h.mustOn(t, ctx, d, 1, "on after off")
	h.mustOn(t, ctx, d, 1, "on again (already on)")
}

func statusFollows(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Healthy)
	ctx := ctxFor(t, 6*h.OKTimeout)
	h.mustStatus(t, ctx, d, on, "initially")
	h.mustOff(t, ctx, d, 1, "off")
	h.mustStatus(t, ctx, d, off, "after off")
	h.mustOn(t, ctx, d, 1, "on")
	h.mustStatus(t, ctx, d, on, "after on")

	if resp, err := h.Client.Monitor(ctx, &driverv1.MonitorRequest{Target: d.Target, Timeout: durationpb.New(h.OKTimeout)}); status.Code(err) != codes.Unimplemented {
		if err != nil || !resp.GetReachable() || !resp.GetCredentialsOk() {
			t.Fatalf("Monitor of a healthy device = %v, %v; want reachable with credentials ok", resp, err)
		}
		truth(t, d, on, "after Monitor")
	}
}

func reboot(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Healthy)
	ctx := ctxFor(t, 4*h.OKTimeout)
	resp, err := h.Client.Reboot(ctx, &driverv1.RebootRequest{OperationId: opID("reboot"), Epoch: 1, Target: d.Target, Timeout: durationpb.New(2 * h.OKTimeout)})
	if err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	if resp.GetState() != on || resp.GetOffConfirmedAt() == nil || resp.GetOnConfirmedAt() == nil {
		t.Fatalf("Reboot = %v; want ON with off and on confirmed", resp)
	}
	truth(t, d, on, "after Reboot")
}

func staleEpoch(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Healthy)
	ctx := ctxFor(t, 4*h.OKTimeout)
	h.mustOff(t, ctx, d, 7, "off with epoch 7")
	_, err := h.on(ctx, d, 6, h.OKTimeout)
	wantCode(t, "PowerOn with epoch 6 after 7", err, codes.FailedPrecondition)
	truth(t, d, off, "after the stale PowerOn")
	h.mustStatus(t, ctx, d, off, "after the stale PowerOn")
	h.mustOn(t, ctx, d, 8, "on with epoch 8")
}

// failing runs call on a device that must not succeed in time and checks the common promises:
// an error, no OFF, and an answer inside the deadline.
func failing(t *testing.T, h *Harness, what string, call func(ctx context.Context) (driverv1.PowerState, error)) error {
	t.Helper()
	ctx := ctxFor(t, h.Timeout+10*time.Second)
	start := time.Now()
	state, err := call(ctx)
	elapsed := time.Since(start)
	t.Logf("%s: %v after %s", what, err, elapsed.Round(time.Millisecond))
	if err == nil {
		t.Fatalf("%s succeeded (state %v); want an error", what, state)
	}
	if state == off {
		t.Fatalf("%s reported OFF", what)
	}
	if elapsed > h.Timeout+h.Slack {
		t.Fatalf("%s took %s with a %s timeout", what, elapsed, h.Timeout)
	}
	if status.Code(err) == codes.Internal || status.Code(err) == codes.Unknown {
		t.Fatalf("%s: code %s; want a code that says what happened", what, status.Code(err))
	}
	return err
}

func hanging(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Hanging)
	err := failing(t, h, "PowerOff of a hanging device", func(ctx context.Context) (driverv1.PowerState, error) {
		r, err := h.off(ctx, d, 1, h.Timeout)
		return r.GetState(), err
	})
	wantCode(t, "PowerOff of a hanging device", err, codes.DeadlineExceeded)
	err = failing(t, h, "Status of a hanging device", func(ctx context.Context) (driverv1.PowerState, error) {
		r, err := h.status(ctx, d, h.Timeout)
		return r.GetState(), err
	})
	wantCode(t, "Status of a hanging device", err, codes.DeadlineExceeded)
	truth(t, d, on, "after the calls")
}

func stuck(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Stuck)
	err := failing(t, h, "PowerOff of a stuck device", func(ctx context.Context) (driverv1.PowerState, error) {
		r, err := h.off(ctx, d, 1, h.Timeout)
		return r.GetState(), err
	})
	// Aborted: the read-back never confirmed; DeadlineExceeded: a driver (a fence agent) that
	// waits for the change itself ran out of time first.
	wantCode(t, "PowerOff of a stuck device", err, codes.Aborted, codes.DeadlineExceeded)
	truth(t, d, on, "after PowerOff")
	ctx := ctxFor(t, h.OKTimeout)
	h.mustStatus(t, ctx, d, on, "after PowerOff")
}

func flapping(t *testing.T, h *Harness) {
	d := h.NewDevice(t, Flapping)
	for i := range 3 {
		err := failing(t, h, fmt.Sprintf("PowerOff #%d of a flapping device", i+1), func(ctx context.Context) (driverv1.PowerState, error) {
			r, err := h.off(ctx, d, 1, h.Timeout)
			return r.GetState(), err
		})
		wantCode(t, "PowerOff of a flapping device", err, codes.Aborted, codes.DeadlineExceeded)
	}
}

// secrets returns the values of the target's secret parameters.
func secrets(tg *driverv1.Target) []string {
	var out []string
	for k, v := range tg.GetParameters() {
		if len(v) >= 4 && kit.IsSecret(k, nil) {
			out = append(out, v)
		}
	}
	return out
}

func wrongCredentials(t *testing.T, h *Harness) {
	d := h.NewDevice(t, WrongCredentials)
	ctx := ctxFor(t, 3*h.OKTimeout)
	check := func(what string, err error) {
		t.Helper()
		wantCode(t, what, err, h.CredentialCodes...)
		msg := status.Convert(err).Message()
		if len(msg) < 20 {
			t.Fatalf("%s: message %q does not say what went wrong", what, msg)
		}
		for _, s := range secrets(d.Target) {
			if strings.Contains(msg, s) {
				t.Fatalf("%s: message %q contains a secret", what, msg)
			}
		}
		t.Logf("%s: %s", what, msg)
	}
	_, err := h.off(ctx, d, 1, h.OKTimeout)
	check("PowerOff", err)
	_, err = h.status(ctx, d, h.OKTimeout)
	check("Status", err)
	truth(t, d, on, "after the refused calls")
	if resp, err := h.Client.Monitor(ctx, &driverv1.MonitorRequest{Target: d.Target, Timeout: durationpb.New(h.OKTimeout)}); status.Code(err) != codes.Unimplemented {
		if err != nil || resp.GetCredentialsOk() {
			t.Fatalf("Monitor with wrong credentials = %v, %v; want credentials not ok", resp, err)
		}
	}
}

func unknownPlug(t *testing.T, h *Harness) {
	d := h.NewDevice(t, UnknownPlug)
	ctx := ctxFor(t, 3*h.OKTimeout)
	r, err := h.off(ctx, d, 1, h.OKTimeout)
	if r.GetState() == off {
		t.Fatalf("PowerOff of an unknown plug reported OFF")
	}
	wantCode(t, "PowerOff of an unknown plug", err, codes.InvalidArgument)
	s, err := h.status(ctx, d, h.OKTimeout)
	if s.GetState() == off {
		t.Fatalf("Status of an unknown plug reported OFF")
	}
	wantCode(t, "Status of an unknown plug", err, codes.InvalidArgument)
	t.Logf("unknown plug: %s", status.Convert(err).Message())
}
