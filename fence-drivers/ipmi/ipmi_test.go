package ipmi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/ipmisim"
)

const (
	user     = "admin"
	password = "password"
)

var (
	stateOff = driverv1.PowerState_POWER_STATE_OFF
	stateOn  = driverv1.PowerState_POWER_STATE_ON
	opSeq    atomic.Int64
)

func startBMC(t *testing.T) *ipmisim.BMC {
	t.Helper()
	b, err := ipmisim.Start(t.TempDir(), 0, user, password)
	if err != nil {
		t.Fatalf("ipmisim.Start: %v", err) // no skipping: the tests need the real ipmi_sim
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("stop BMC: %v", err)
		}
	})
	return b
}

func target(port int, extra ...string) *driverv1.Target {
	p := map[string]string{"ip": "127.0.0.1", "ipport": strconv.Itoa(port), "username": user, "password": password, "cipher": "3"}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			delete(p, extra[i])
		} else {
			p[extra[i]] = extra[i+1]
		}
	}
	return &driverv1.Target{Name: "node-" + strconv.Itoa(port), Parameters: p}
}

func opID() string { return fmt.Sprintf("op-%d-%d", time.Now().UnixNano(), opSeq.Add(1)) }

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ipmitool(t *testing.T, ctx context.Context, b *ipmisim.BMC) string {
	t.Helper()
	got, err := ipmisim.IpmitoolPower(ctx, b.Port, b.User, b.Password)
	if err != nil {
		t.Fatalf("ipmitool: %v", err)
	}
	return got
}

func calls(t *testing.T, b *ipmisim.BMC) []string {
	t.Helper()
	c, err := b.Calls()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func wantCode(t *testing.T, err error, want ...codes.Code) {
	t.Helper()
	if !slices.Contains(want, status.Code(err)) {
		t.Fatalf("error = %v (code %s); want code %v", err, status.Code(err), want)
	}
}

func TestPowerOffOnRebootStatus(t *testing.T) {
	b := startBMC(t)
	c := serve(t, t.TempDir())
	ctx := testCtx(t, 60*time.Second)

	for i := range 2 { // PowerOff twice is OK twice
		resp, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(b.Port)})
		if err != nil {
			t.Fatalf("PowerOff #%d: %v", i+1, err)
		}
		if resp.GetState() != stateOff || resp.GetPolls() < 1 || resp.GetConfirmedAt() == nil {
			t.Fatalf("PowerOff #%d = %v; want OFF confirmed by a read-back", i+1, resp)
		}
		if got := ipmitool(t, ctx, b); got != "off" {
			t.Fatalf("ipmitool after PowerOff #%d says %q", i+1, got)
		}
	}
	if on, err := b.Power(); err != nil || on {
		t.Fatalf("BMC state file after PowerOff: on=%v err=%v", on, err)
	}
	// ClusterLabs' own agent agrees (its status action exits 2 for "off").
	out, err := exec.CommandContext(ctx, "fence_ipmilan", "--ip=127.0.0.1", "--ipport="+strconv.Itoa(b.Port),
		"--username="+user, "--password="+password, "--lanplus", "--cipher=3", "--action=status").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "Status: OFF") {
		t.Fatalf("fence_ipmilan status after PowerOff: %v: %s", err, out)
	}
	st, err := c.Status(ctx, &driverv1.StatusRequest{Target: target(b.Port)})
	if err != nil || st.GetState() != stateOff {
		t.Fatalf("Status after PowerOff = %v, %v; want OFF", st, err)
	}

	on, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 1, Target: target(b.Port)})
	if err != nil || on.GetState() != stateOn {
		t.Fatalf("PowerOn = %v, %v; want ON", on, err)
	}
	if got := ipmitool(t, ctx, b); got != "on" {
		t.Fatalf("ipmitool after PowerOn says %q", got)
	}
	st, err = c.Status(ctx, &driverv1.StatusRequest{Target: target(b.Port)})
	if err != nil || st.GetState() != stateOn {
		t.Fatalf("Status after PowerOn = %v, %v; want ON", st, err)
	}

	before := len(calls(t, b))
	rb, err := c.Reboot(ctx, &driverv1.RebootRequest{OperationId: opID(), Epoch: 1, Target: target(b.Port)})
	if err != nil || rb.GetState() != stateOn {
		t.Fatalf("Reboot = %v, %v; want ON", rb, err)
	}
	if !rb.GetOffConfirmedAt().AsTime().Before(rb.GetOnConfirmedAt().AsTime()) {
		t.Errorf("Reboot off confirmed at %v, not before on at %v", rb.GetOffConfirmedAt().AsTime(), rb.GetOnConfirmedAt().AsTime())
	}
	// The device must have been turned off, read back, then turned on.
	during := calls(t, b)[before:]
	off := slices.Index(during, "set power 0")
	onIdx := slices.Index(during, "set power 1")
	if off < 0 || onIdx < off || !slices.Contains(during[off+1:onIdx], "get power") {
		t.Errorf("chassis calls during Reboot = %q; want set power 0, get power, ..., set power 1", during)
	}
	if got := ipmitool(t, ctx, b); got != "on" {
		t.Fatalf("ipmitool after Reboot says %q", got)
	}
}

func TestStaleEpochSurvivesRestart(t *testing.T) {
	b := startBMC(t)
	stateDir := t.TempDir()
	ctx := testCtx(t, 60*time.Second)

	c := serve(t, stateDir)
	if _, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 7, Target: target(b.Port)}); err != nil {
		t.Fatalf("PowerOff epoch 7: %v", err)
	}
	n := len(calls(t, b))
	_, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 6, Target: target(b.Port)})
	wantCode(t, err, codes.FailedPrecondition)

	// A new service (a restarted driver) on the same state directory still knows epoch 7.
	c2 := serve(t, stateDir)
	_, err = c2.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 6, Target: target(b.Port)})
	wantCode(t, err, codes.FailedPrecondition)
	// The same device under an alias spelling is the same device.
	_, err = c2.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 3,
		Target: target(b.Port, "ip", "", "ipaddr", "127.0.0.1")})
	wantCode(t, err, codes.FailedPrecondition)
	if got := calls(t, b)[n:]; len(got) != 0 {
		t.Errorf("stale calls touched the device: %q", got)
	}
	if got := ipmitool(t, ctx, b); got != "off" {
		t.Fatalf("ipmitool after rejected PowerOn says %q", got)
	}
	for _, epoch := range []int64{7, 8} { // equal and higher epochs are accepted
		if _, err := c2.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: epoch, Target: target(b.Port)}); err != nil {
			t.Fatalf("PowerOn epoch %d after restart: %v", epoch, err)
		}
	}
	// Epochs are per device: another BMC has not seen epoch 8.
	other := startBMC(t)
	if _, err := c2.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 2, Target: target(other.Port)}); err != nil {
		t.Fatalf("PowerOff epoch 2 on another device: %v", err)
	}
}

func TestOperationIDDeduplicates(t *testing.T) {
	b := startBMC(t)
	c := serve(t, t.TempDir())
	ctx := testCtx(t, 60*time.Second)

	id := opID()
	first, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: id, Epoch: 1, Target: target(b.Port)})
	if err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	n := len(calls(t, b))
	again, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: id, Epoch: 1, Target: target(b.Port)})
	if err != nil {
		t.Fatalf("repeated PowerOff: %v", err)
	}
	if diff := cmp.Diff(first, again, protocmp.Transform()); diff != "" {
		t.Errorf("repeated PowerOff result differs (-first +again):\n%s", diff)
	}
	if got := calls(t, b)[n:]; len(got) != 0 {
		t.Errorf("repeated PowerOff touched the device: %q", got)
	}

	// A reused id for another action is a caller bug.
	_, err = c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: id, Epoch: 1, Target: target(b.Port)})
	wantCode(t, err, codes.InvalidArgument)

	// Concurrent repeats of a running operation share one execution.
	if err := b.SetDelay(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	n = len(calls(t, b))
	id = opID()
	results := make([]*driverv1.PowerOnResponse, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			results[i], errs[i] = c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: id, Epoch: 1, Target: target(b.Port)})
		})
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("concurrent PowerOn #%d: %v", i, errs[i])
		}
		if diff := cmp.Diff(results[0], results[i], protocmp.Transform()); diff != "" {
			t.Errorf("concurrent PowerOn #%d differs (-first +this):\n%s", i, diff)
		}
	}
	var sets int
	for _, call := range calls(t, b)[n:] {
		if strings.HasPrefix(call, "set power") {
			sets++
		}
	}
	if sets != 1 {
		t.Errorf("3 concurrent PowerOn with one operation_id made %d power changes, want 1", sets)
	}
}

func TestSilentBMCNeverOff(t *testing.T) {
	port, closeHole, err := ipmisim.Blackhole()
	if err != nil {
		t.Fatal(err)
	}
	defer closeHole()
	c := serve(t, t.TempDir())
	ctx := testCtx(t, 30*time.Second)
	timeout := durationpb.New(time.Second)

	tests := []struct {
		name string
		call func() (driverv1.PowerState, error)
	}{
		{"PowerOff", func() (driverv1.PowerState, error) {
			r, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(port), Timeout: timeout})
			return r.GetState(), err
		}},
		{"Reboot", func() (driverv1.PowerState, error) {
			r, err := c.Reboot(ctx, &driverv1.RebootRequest{OperationId: opID(), Epoch: 1, Target: target(port), Timeout: timeout})
			return r.GetState(), err
		}},
		{"Status", func() (driverv1.PowerState, error) {
			r, err := c.Status(ctx, &driverv1.StatusRequest{Target: target(port), Timeout: timeout})
			return r.GetState(), err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			state, err := tt.call()
			elapsed := time.Since(start)
			wantCode(t, err, codes.DeadlineExceeded, codes.Unavailable)
			if state == stateOff {
				t.Errorf("silent BMC reported OFF")
			}
			if elapsed > 1500*time.Millisecond {
				t.Errorf("took %s with a 1s timeout", elapsed)
			}
		})
	}

	mon, err := c.Monitor(ctx, &driverv1.MonitorRequest{Target: target(port), Timeout: timeout})
	if err != nil || mon.GetReachable() || mon.GetCredentialsOk() {
		t.Errorf("Monitor of a silent BMC = %v, %v; want unreachable", mon, err)
	}
}

func TestFaultyBMCNeverOff(t *testing.T) {
	tests := []struct {
		name  string
		fault ipmisim.Fault
	}{
		{"stuck", ipmisim.FaultStuck},
		{"fail", ipmisim.FaultFail},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := startBMC(t)
			c := serve(t, t.TempDir())
			ctx := testCtx(t, 30*time.Second)
			if err := b.SetFault(tt.fault); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			resp, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(b.Port),
				Timeout: durationpb.New(time.Second)})
			if err == nil || resp.GetState() == stateOff {
				t.Fatalf("PowerOff on a %s BMC = %v, %v; want an error", tt.name, resp, err)
			}
			t.Logf("PowerOff on a %s BMC: %v (after %s)", tt.name, err, time.Since(start))
			if tt.fault == ipmisim.FaultFail {
				// The BMC answers with an error: the device's failure, not ours (never Internal).
				wantCode(t, err, codes.Unavailable)
			}
			if el := time.Since(start); el > 1500*time.Millisecond {
				t.Errorf("took %s with a 1s timeout", el)
			}
			st, err := c.Status(ctx, &driverv1.StatusRequest{Target: target(b.Port), Timeout: durationpb.New(5 * time.Second)})
			if st.GetState() == stateOff {
				t.Errorf("Status on a %s BMC = OFF", tt.name)
			}
			if tt.fault == ipmisim.FaultStuck && (err != nil || st.GetState() != stateOn) {
				t.Errorf("Status on a stuck BMC = %v, %v; want ON", st, err)
			}
			if err := b.SetFault(ipmisim.FaultNone); err != nil {
				t.Fatal(err)
			}
			if got := ipmitool(t, ctx, b); got != "on" {
				t.Errorf("ipmitool after the failed PowerOff says %q, want on", got)
			}
		})
	}
}

func TestCredentials(t *testing.T) {
	b := startBMC(t)
	c := serve(t, t.TempDir())
	ctx := testCtx(t, 30*time.Second)

	tests := []struct {
		name   string
		target *driverv1.Target
		want   string
	}{
		{"wrong password", target(b.Port, "password", "S3cr3t-wr0ng"), "rejected the password"},
		{"wrong user", target(b.Port, "username", "nobody"), `does not know user "nobody"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tt.target})
			wantCode(t, err, codes.Unauthenticated)
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tt.want) || strings.Contains(msg, "S3cr3t") {
				t.Errorf("message %q does not say %q", msg, tt.want)
			}
			mon, err := c.Monitor(ctx, &driverv1.MonitorRequest{Target: tt.target})
			if err != nil || !mon.GetReachable() || mon.GetCredentialsOk() {
				t.Errorf("Monitor = %v, %v; want reachable, credentials not ok", mon, err)
			}
		})
	}
	if got := ipmitool(t, ctx, b); got != "on" {
		t.Errorf("ipmitool after refused calls says %q", got)
	}
	mon, err := c.Monitor(ctx, &driverv1.MonitorRequest{Target: target(b.Port)})
	if err != nil || !mon.GetReachable() || !mon.GetCredentialsOk() {
		t.Errorf("Monitor with good credentials = %v, %v", mon, err)
	}
}

func TestInvalidRequests(t *testing.T) {
	c := serve(t, t.TempDir())
	ctx := testCtx(t, 30*time.Second)
	tests := []struct {
		name   string
		req    *driverv1.PowerOffRequest
		fields []string
	}{
		{"missing ip", &driverv1.PowerOffRequest{OperationId: "a", Epoch: 1, Target: target(9, "ip", "")}, []string{"target.parameters.ip"}},
		{"missing operation id and epoch", &driverv1.PowerOffRequest{Target: target(9)}, []string{"operation_id", "epoch"}},
		{"negative epoch", &driverv1.PowerOffRequest{OperationId: "a", Epoch: -1, Target: target(9)}, []string{"epoch"}},
		{"missing target", &driverv1.PowerOffRequest{OperationId: "a", Epoch: 1}, []string{"target"}},
		{"empty parameters", &driverv1.PowerOffRequest{OperationId: "a", Epoch: 1, Target: &driverv1.Target{Name: "x"}}, []string{"target.parameters"}},
		{"bad values", &driverv1.PowerOffRequest{OperationId: "a", Epoch: 1,
			Target: target(9, "ipport", "70000", "cipher", "0", "lanplus", "0", "privlvl", "root")},
			[]string{"ipport", "cipher", "lanplus", "privlvl"}},
		{"ip and ipaddr disagree", &driverv1.PowerOffRequest{OperationId: "a", Epoch: 1, Target: target(9, "ipaddr", "10.0.0.1")}, []string{"ip"}},
		{"negative timeout", &driverv1.PowerOffRequest{OperationId: "a", Epoch: 1, Target: target(9), Timeout: durationpb.New(-time.Second)}, []string{"timeout"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.PowerOff(ctx, tt.req)
			wantCode(t, err, codes.InvalidArgument)
			msg := status.Convert(err).Message()
			for _, f := range tt.fields {
				if !strings.Contains(msg, f+":") {
					t.Errorf("message %q does not name %q", msg, f)
				}
			}
			if strings.Contains(msg, password) {
				t.Errorf("message %q leaks the password", msg)
			}
		})
	}
}

func TestAliasesAndSeveralBMCs(t *testing.T) {
	c := serve(t, t.TempDir())
	ctx := testCtx(t, 60*time.Second)
	bmcs := make([]*ipmisim.BMC, 3)
	for i := range bmcs {
		bmcs[i] = startBMC(t)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(bmcs))
	for i, b := range bmcs {
		// fence_ipmilan's deprecated spellings work too.
		tgt := &driverv1.Target{Name: "node" + strconv.Itoa(i), Parameters: map[string]string{
			"ipaddr": "127.0.0.1", "ipport": strconv.Itoa(b.Port), "login": user, "passwd": password, "lanplus": "", "cipher": "3",
		}}
		wg.Go(func() {
			_, errs[i] = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tgt})
		})
	}
	wg.Wait()
	for i, b := range bmcs {
		if errs[i] != nil {
			t.Errorf("PowerOff BMC %d: %v", i, errs[i])
			continue
		}
		if got := ipmitool(t, ctx, b); got != "off" {
			t.Errorf("ipmitool on BMC %d says %q, want off", i, got)
		}
	}
}

func TestDescribe(t *testing.T) {
	c := serve(t, t.TempDir())
	resp, err := c.Describe(testCtx(t, 10*time.Second), &driverv1.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"off", "on", "reboot", "status", "monitor"}, resp.GetActions()); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	var names []string
	secret := map[string]bool{}
	for _, p := range resp.GetParameters() {
		names = append(names, p.GetName())
		secret[p.GetName()] = p.GetSecret()
	}
	want := []string{"cipher", "ip", "ipmitool_timeout", "ipport", "lanplus", "password", "privlvl", "username"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("parameters (-want +got):\n%s", diff)
	}
	if resp.GetDriver() != "ipmi" || !secret["password"] || secret["username"] {
		t.Errorf("Describe = %v", resp)
	}
	_, err = c.List(testCtx(t, 10*time.Second), &driverv1.ListRequest{Target: target(9)})
	wantCode(t, err, codes.Unimplemented)
}

// serve runs the IPMI driver service on 127.0.0.1 over real gRPC and returns a client for it.
func serve(t *testing.T, stateDir string) driverv1.FenceDriverServiceClient {
	t.Helper()
	_, c := kittest.Serve(t, ipmi.New(), kit.Options{StateDir: stateDir, Log: logger(t)})
	return c
}

func logger(t *testing.T) *slog.Logger { return kittest.Logger(t, slog.LevelDebug) }
