package kit

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// A failed call never records its epoch: one failed PowerOff at the largest epoch (a caller's bug,
// or a device that refused) must not make the device refuse every later epoch. Before the fix the
// epoch was recorded before acting and kept when the act failed.
func TestFailedCallNeverRecordsEpoch(t *testing.T) {
	d := &fakeDriver{on: true, failed: 1}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := offReq("at-max", time.Second)
	req.Epoch = math.MaxInt64
	if _, err := s.PowerOff(ctx, req); err == nil {
		t.Fatal("the failing PowerOff succeeded")
	}
	req = offReq("at-5", time.Second)
	req.Epoch = 5
	if resp, err := s.PowerOff(ctx, req); err != nil || resp.GetState() != driverv1.PowerState_POWER_STATE_OFF {
		t.Fatalf("PowerOff at epoch 5 after a failed call at MaxInt64 = %v, %v; want OFF", resp, err)
	}
	// A successful call still records its epoch.
	req = offReq("at-4", time.Second)
	req.Epoch = 4
	if _, err := s.PowerOff(ctx, req); !errors.Is(err, fault.ErrStaleEpoch) {
		t.Fatalf("PowerOff at 4 after a success at 5 = %v, want a stale epoch", err)
	}
}

// The epoch table keys a device by its resolved address: "localhost" and "127.0.0.1" (and the
// IPv4-mapped IPv6 spelling) are one device, so a deposed leader cannot act by re-spelling it.
func TestEpochKeyedByResolvedAddress(t *testing.T) {
	d := &fakeDriver{on: true}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	off := func(id, ip string, epoch int64) error {
		_, err := s.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: id, Epoch: epoch, Timeout: durationpb.New(time.Second),
			Target: &driverv1.Target{Name: "n", Parameters: map[string]string{"ip": ip}}})
		return err
	}
	if err := off("new-leader", "localhost", 10); err != nil {
		t.Fatal(err)
	}
	for i, ip := range []string{"127.0.0.1", "LOCALHOST", "localhost.", "::ffff:127.0.0.1", "[::ffff:127.0.0.1]"} {
		if err := off("old-leader-"+strconv.Itoa(i), ip, 9); !errors.Is(err, fault.ErrStaleEpoch) {
			t.Errorf("PowerOff at epoch 9 via %q after epoch 10 via localhost = %v, want a stale epoch", ip, err)
		}
	}
	if err := off("other-device", "127.0.0.2", 9); err != nil {
		t.Errorf("another device: %v", err)
	}
}

// Driver requests are bounded: target name, operation id, parameter count, names and values; no
// control character anywhere. Each is refused with InvalidArgument naming the field, before the
// device is touched.
func TestRequestBounds(t *testing.T) {
	d := &fakeDriver{on: true}
	s := newTestService(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	many := map[string]string{"ip": "h"}
	for i := range MaxParameters {
		many["x"+strconv.Itoa(i)] = "1"
	}
	for _, tc := range []struct {
		name, field, target, opID string
		params                    map[string]string
	}{
		{name: "long target", field: "target.name", target: strings.Repeat("n", MaxTargetName+1)},
		{name: "newline in target", field: "target.name", target: "n1\nfenced n2"},
		{name: "space in target", field: "target.name", target: "n1 n2"},
		{name: "long operation id", field: "operation_id", opID: strings.Repeat("o", MaxOperationID+1)},
		{name: "control in operation id", field: "operation_id", opID: "op\x1b[2J"},
		{name: "newline in a value", field: "target.parameters.password", params: map[string]string{"ip": "h", "password": "x\nip=other"}},
		{name: "NUL in a value", field: "target.parameters.ip", params: map[string]string{"ip": "h\x00"}},
		{name: "invalid UTF-8", field: "target.parameters.ip", params: map[string]string{"ip": "h\xff"}},
		{name: "long value", field: "target.parameters.ip", params: map[string]string{"ip": strings.Repeat("h", MaxParamValue+1)}},
		{name: "control in a name", field: "target.parameters", params: map[string]string{"ip": "h", "a\nb": "1"}},
		{name: "long name", field: "target.parameters", params: map[string]string{"ip": "h", strings.Repeat("k", MaxParamName+1): "1"}},
		{name: "too many", field: "target.parameters", params: many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, opID, params := tc.target, tc.opID, tc.params
			if target == "" {
				target = "n1"
			}
			if opID == "" {
				opID = "op-1"
			}
			if params == nil {
				params = map[string]string{"ip": "h"}
			}
			tg := &driverv1.Target{Name: target, Parameters: params}
			_, err := s.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID, Epoch: 1, Target: tg, Timeout: durationpb.New(time.Second)})
			assertInvalid(t, "PowerOff", err, tc.field)
			if tc.field != "operation_id" {
				_, err = s.Status(ctx, &driverv1.StatusRequest{Target: tg})
				assertInvalid(t, "Status", err, tc.field)
			}
		})
	}
	if d.offs != 0 {
		t.Errorf("the device was asked %d times", d.offs)
	}
}

func assertInvalid(t *testing.T, call string, err error, field string) {
	t.Helper()
	var inv fault.Invalid
	if !errors.As(err, &inv) {
		t.Fatalf("%s = %v, want fault.Invalid naming %s", call, err, field)
	}
	for _, fe := range inv {
		if fe.Field == field {
			return
		}
	}
	t.Fatalf("%s = %v, want a problem naming %s", call, err, field)
}
