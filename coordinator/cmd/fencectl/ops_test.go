//lint:file-ignore SA1019 the tests check that the deprecated GetNodeRequest.name is still accepted

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// rig is a real coordinator (embedded etcd, mutual TLS) with a real IPMI fence-driver (mutual TLS)
// in front of real ipmi_sim BMCs, and the certificates of an operator, a viewer and an agent.
//
//	good:  its BMC, with the right credentials
//	bad:   the same BMC, with a wrong password
//	stuck: its own BMC, which accepts power-off and never applies it
type rig struct {
	addr                     string
	good, stuck              *ipmisim.BMC
	operator, viewer, agentC tlsfiles.Files
}

const secretPassword = "s3cret-bmc-pw"

func startRig(t *testing.T) *rig {
	t.Helper()
	ca, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := func(role identity.Role, name string) tlsfiles.Files {
		f, err := ca.Files(role, name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	r := &rig{operator: files(identity.Operator, "alice"), viewer: files(identity.Viewer, "vera"), agentC: files(identity.Agent, "good")}
	coordTLS, driverTLS := files(identity.Coordinator, "c1"), files(identity.Driver, "ipmi")

	log := slog.New(slog.DiscardHandler)
	svc, err := kit.NewService(ipmi.New(), kit.Options{StateDir: t.TempDir(), DefaultTimeout: 5 * time.Second, PollInterval: 50 * time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	dsrv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: driverTLS, DrainTimeout: time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	driverv1.RegisterFenceDriverServiceServer(dsrv.GRPC, svc)
	go func() { _ = dsrv.Serve() }()
	t.Cleanup(dsrv.Stop)

	if r.good, err = ipmisim.Start(filepath.Join(t.TempDir(), "good"), 0, "admin", secretPassword); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.good.Stop() })
	if r.stuck, err = ipmisim.Start(filepath.Join(t.TempDir(), "stuck"), 0, "admin", secretPassword); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.stuck.Stop() })
	if err := r.stuck.SetFault(ipmisim.FaultStuck); err != nil {
		t.Fatal(err)
	}
	method := func(port int, password string) string {
		return fmt.Sprintf("{bmc: {template: bmc, parameters: {ipport: %q, password: %q}}}", fmt.Sprint(port), password)
	}
	cfgPath := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`drivers:
  ipmi: {endpoint: %q}
templates:
  bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, username: admin, cipher: "3"}}
nodes:
  good:  {zone: a, methods: %s, steps: {power_management: [bmc]}}
  bad:   {zone: a, methods: %s, steps: {power_management: [bmc]}}
  stuck: {zone: a, methods: %s, steps: {power_management: [bmc]}}
`, dsrv.Addr(), method(r.good.Port, secretPassword), method(r.good.Port, "wrong-password"), method(r.stuck.Port, secretPassword))), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(app.Config{
		Server: server.Config{Listen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second}, DriverTLS: coordTLS,
		FenceConfig: cfgPath, DataDir: t.TempDir(), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0",
		EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second, FenceOpTimeout: 4 * time.Second,
		Fencing: fencing.Policy{Retries: 0, Backoff: 100 * time.Millisecond, Polls: 1, PollInterval: 100 * time.Millisecond},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r.addr = a.Addr()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := r.run(t, r.operator, "nodes") // answered by the leader only
		if res.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %+v", res)
		}
		time.Sleep(200 * time.Millisecond) // the coordinator elects itself
	}
	return r
}

type result struct {
	code        int
	out, errOut string
}

// run runs fencectl as who, with the global flags after the command, as an operator may type them.
func (r *rig) run(t *testing.T, who tlsfiles.Files, args ...string) result {
	t.Helper()
	return r.runCtx(context.Background(), who, nil, args...)
}

func (r *rig) runCtx(ctx context.Context, who tlsfiles.Files, out *syncbuf.Buffer, args ...string) result {
	if out == nil {
		out = &syncbuf.Buffer{}
	}
	var errb bytes.Buffer
	args = append(args, append(pki.Args("", who), "--coordinator", r.addr, "--timeout", "60s")...)
	code := run(ctx, args, out, &errb)
	return result{code, out.String(), errb.String()}
}

// TestTestNodeReportsDevicesAsTheyAre checks test NODE against a real ipmi_sim BMC: good credentials
// pass with the power state read; a wrong password is reported as rejected credentials and the
// command fails; nothing is switched; the check is audited; no secret is shown.
func TestTestNodeReportsDevicesAsTheyAre(t *testing.T) {
	r := startRig(t)

	res := r.run(t, r.operator, "test", "good")
	if res.code != 0 || !strings.Contains(res.out, "every fence device of good is reachable") {
		t.Fatalf("test good: %+v", res)
	}
	var resp struct {
		Ok     bool
		Checks []struct {
			Method, Driver, State    string
			Reachable, CredentialsOk bool
		}
	}
	res = r.run(t, r.operator, "test", "good", "-o", "json")
	if err := json.Unmarshal([]byte(res.out), &resp); err != nil || res.code != 0 {
		t.Fatalf("test good -o json: %v: %+v", err, res)
	}
	if !resp.Ok || len(resp.Checks) != 1 || !resp.Checks[0].Reachable || !resp.Checks[0].CredentialsOk || resp.Checks[0].State != "POWER_STATE_ON" {
		t.Fatalf("test good: %+v", resp)
	}

	res = r.run(t, r.operator, "test", "bad", "-o", "json")
	resp.Ok, resp.Checks = false, nil
	if err := json.Unmarshal([]byte(res.out), &resp); err != nil {
		t.Fatalf("test bad -o json: %v: %+v", err, res)
	}
	if res.code != 1 || resp.Ok || len(resp.Checks) != 1 || resp.Checks[0].CredentialsOk || resp.Checks[0].State == "POWER_STATE_ON" {
		t.Fatalf("test bad: a wrong password must be reported as bad: exit %d, %+v (stderr %s)", res.code, resp, res.errOut)
	}
	res = r.run(t, r.operator, "test", "bad")
	if res.code != 1 || !strings.Contains(res.out, "FAILED") || strings.Contains(res.out, "every fence device") {
		t.Fatalf("test bad: %+v", res)
	}
	if strings.Contains(res.out+res.errOut, "wrong-password") || strings.Contains(res.out+res.errOut, secretPassword) {
		t.Fatalf("test bad shows a password: %+v", res)
	}

	calls, err := r.good.Calls()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if strings.HasPrefix(c, "set power") {
			t.Fatalf("a device check switched the BMC: %q", calls)
		}
	}
	if on, _ := r.good.Power(); !on {
		t.Fatal("a device check powered the node off")
	}

	res = r.run(t, r.viewer, "audit", "--node", "bad")
	if res.code != 0 || !strings.Contains(res.out, "operator/alice asked to check the fence devices of bad") ||
		!strings.Contains(res.out, "bmc (ipmi) credentials rejected") {
		t.Fatalf("audit: %+v", res)
	}
	for _, s := range []string{secretPassword, "wrong-password"} {
		if strings.Contains(res.out, s) {
			t.Fatalf("the audit trail shows a password: %s", res.out)
		}
	}
}

// CheckNode and GetConfig are authorized by the caller's certificate: a viewer and an agent may not
// check devices (a device login); a viewer may read the configuration, an agent may not. Bad input
// is refused naming the field, before any device is touched.
func TestNewRPCsAuthorizationAndBounds(t *testing.T) {
	r := startRig(t)
	for _, tc := range []struct {
		who  tlsfiles.Files
		args []string
		want codes.Code
	}{
		{r.viewer, []string{"test", "good"}, codes.PermissionDenied},
		{r.agentC, []string{"test", "good"}, codes.PermissionDenied},
		{r.agentC, []string{"config", "show"}, codes.PermissionDenied},
		{r.operator, []string{"test", "Not_A_Name!"}, codes.InvalidArgument},
		{r.operator, []string{"test", strings.Repeat("a", 300)}, codes.InvalidArgument},
		{r.operator, []string{"test", "nosuchnode"}, codes.NotFound},
		{r.viewer, []string{"pause", "--reason", "x"}, codes.PermissionDenied},
		{r.viewer, []string{"reboot", "good"}, codes.PermissionDenied},
		{r.agentC, []string{"reboot", "good"}, codes.PermissionDenied},
		{r.operator, []string{"reboot", "nosuchnode"}, codes.NotFound},
		{r.operator, []string{"reboot", "Bad_Name"}, codes.InvalidArgument},
		// Maintenance: operators change it, viewers read it, agents neither; Kubernetes mode only.
		{r.viewer, []string{"maintenance", "start", "good", "--reason", "x"}, codes.PermissionDenied},
		{r.viewer, []string{"maintenance", "stop", "good"}, codes.PermissionDenied},
		{r.agentC, []string{"maintenance", "status", "good"}, codes.PermissionDenied},
		{r.operator, []string{"maintenance", "start", "Bad_Name", "--reason", "x"}, codes.InvalidArgument},
		{r.operator, []string{"maintenance", "start", "good", "--reason", strings.Repeat("x", 5000)}, codes.InvalidArgument},
		{r.operator, []string{"maintenance", "start", "good", "--reason", "x"}, codes.FailedPrecondition},
		{r.viewer, []string{"maintenance", "status", "good"}, codes.FailedPrecondition},
	} {
		res := r.run(t, tc.who, tc.args...)
		if res.code != 1 || !strings.Contains(res.errOut, tc.want.String()) {
			t.Errorf("%q: exit %d, stderr %q, want %s", tc.args, res.code, res.errOut, tc.want)
		}
	}
	if res := r.run(t, r.operator, "maintenance", "start", "good"); res.code != 2 || !strings.Contains(res.errOut, "--reason is required") {
		t.Errorf("maintenance start without --reason: %+v", res)
	}
	if res := r.run(t, r.operator, "maintenance", "start", "good", "--reason", "x"); !strings.Contains(res.errOut, "Kubernetes mode") {
		t.Errorf("maintenance outside Kubernetes mode does not say why: %+v", res)
	}
	if res := r.run(t, r.viewer, "config", "show"); res.code != 0 {
		t.Errorf("viewer config show: %+v", res)
	}
	// A viewer's status shows the node and says the device check was not allowed.
	if res := r.run(t, r.viewer, "status", "good"); res.code != 0 || !strings.Contains(res.out, "device check:") || !strings.Contains(res.out, "may not call") {
		t.Errorf("viewer status: %+v", res)
	}

	// GetNode takes node (as Fence does) and still the deprecated name; both differing is refused.
	conn, err := dial.New(r.addr, r.viewer)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc := coordv1.NewClusterServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, req := range []*coordv1.GetNodeRequest{{Node: "good"}, {Name: "good"}, {Node: "good", Name: "good"}} {
		if n, err := cc.GetNode(ctx, req); err != nil || n.Node.Name != "good" {
			t.Errorf("GetNode(%v): %v", req, err)
		}
	}
	if _, err := cc.GetNode(ctx, &coordv1.GetNodeRequest{Node: "good", Name: "bad"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("GetNode with node and name differing: %v, want InvalidArgument", err)
	}
	if _, err := cc.GetNode(ctx, &coordv1.GetNodeRequest{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "node") {
		t.Errorf("GetNode without a node: %v, want InvalidArgument naming node", err)
	}
}

// config show prints the live settings and fence configuration with every secret redacted.
func TestConfigShowRedactsSecrets(t *testing.T) {
	r := startRig(t)
	res := r.run(t, r.viewer, "config", "show")
	if res.code != 0 {
		t.Fatalf("%+v", res)
	}
	// Each method names the identity its driver service must present (the coordinator refuses any
	// other server at the endpoint).
	for _, want := range []string{"FenceOpTimeout", "4s", "password=***", "username=admin", "power_management", "good", "IDENTITY", "spiffe://nodefence/driver/ipmi"} {
		if !strings.Contains(res.out, want) {
			t.Errorf("config show lacks %q:\n%s", want, res.out)
		}
	}
	res = r.run(t, r.viewer, "config", "show", "-o", "yaml")
	if res.code != 0 || !strings.Contains(res.out, "replicaId:") || !strings.Contains(res.out, "password: '***'") || !strings.Contains(res.out, "peerIdentity: spiffe://nodefence/driver/ipmi") {
		t.Fatalf("config show -o yaml: %+v", res)
	}
	for _, out := range []string{res.out, r.run(t, r.viewer, "config", "show", "-o", "json").out} {
		if strings.Contains(out, secretPassword) || strings.Contains(out, "wrong-password") {
			t.Fatalf("config show prints a password:\n%s", out)
		}
	}
}

// fence prints each change of the record once; reboot powers the node off and on again, each
// confirmed; pause and resume are read back; status shows the last fence and the device check.
func TestFenceRebootPauseStatus(t *testing.T) {
	r := startRig(t)
	res := r.run(t, r.operator, "fence", "good", "--reason", "test")
	if res.code != 0 || !strings.Contains(res.out, "power_management done") {
		t.Fatalf("fence: %+v", res)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(res.out), "\n") {
		_, rest, _ := strings.Cut(l, "  ") // the timestamp
		if seen[rest] {
			t.Errorf("progress line printed twice: %q\n%s", rest, res.out)
		}
		seen[rest] = true
	}
	if on, _ := r.good.Power(); on {
		t.Fatal("fence exit 0 but the BMC is on")
	}
	res = r.run(t, r.operator, "reboot", "good")
	if res.code != 0 || !strings.Contains(res.out, "bmc off via ipmi") || !strings.Contains(res.out, "bmc on via ipmi") ||
		!strings.Contains(res.out, "power_management done") {
		t.Fatalf("reboot: %+v", res)
	}
	if strings.Index(res.out, "bmc off -> confirmed") > strings.Index(res.out, "bmc on via ipmi") {
		t.Fatalf("reboot powered on before the power-off was confirmed:\n%s", res.out)
	}
	if on, _ := r.good.Power(); !on {
		t.Fatal("reboot exit 0 but the BMC is off")
	}
	calls, _ := r.good.Calls()
	var sets []string
	for _, c := range calls {
		if strings.HasPrefix(c, "set power") {
			sets = append(sets, c)
		}
	}
	if n := len(sets); n < 3 || !strings.HasPrefix(sets[n-2], "set power 0") || !strings.HasPrefix(sets[n-1], "set power 1") {
		t.Fatalf("reboot: the BMC's power calls were %q, want off then on last", sets)
	}
	res = r.run(t, r.viewer, "list", "--node", "good", "--limit", "1", "-o", "json")
	var page struct {
		Fences []struct{ Id, Action, ConfirmedOffAt string }
	}
	if err := json.Unmarshal([]byte(res.out), &page); err != nil || len(page.Fences) != 1 {
		t.Fatalf("list: %v %+v", err, res)
	}
	if rec := page.Fences[0]; rec.Action != "FENCE_ACTION_REBOOT" || rec.ConfirmedOffAt != "" {
		t.Fatalf("the reboot record: %+v (a reboot must never be proof that the node is off)", rec)
	}

	res = r.run(t, r.viewer, "status", "good", "--no-check")
	if res.code != 0 || !strings.Contains(res.out, "last fence:") || !strings.Contains(res.out, "reboot good-") || strings.Contains(res.out, "fence devices:") {
		t.Fatalf("status --no-check: %+v", res)
	}
	res = r.run(t, r.operator, "status", "good")
	if res.code != 0 || !strings.Contains(res.out, "fence devices:") || !strings.Contains(res.out, "readiness:") {
		t.Fatalf("status: %+v", res)
	}

	var st struct {
		Node        struct{ Name string }
		LastFence   struct{ Id, Action, Status string }
		DeviceCheck struct {
			Ok     bool
			Checks []struct{ State string }
		}
	}
	res = r.run(t, r.operator, "status", "good", "-o", "json")
	if err := json.Unmarshal([]byte(res.out), &st); err != nil || res.code != 0 || st.Node.Name != "good" || st.LastFence.Action != "FENCE_ACTION_REBOOT" ||
		st.LastFence.Status != "FENCE_STATUS_DONE" || !st.DeviceCheck.Ok || len(st.DeviceCheck.Checks) != 1 || st.DeviceCheck.Checks[0].State != "POWER_STATE_ON" {
		t.Fatalf("status -o json: %v %+v\n%s", err, st, res.out)
	}

	// -o json follows a record as one JSON document per change.
	res = r.run(t, r.operator, "unfence", "good", "-o", "json")
	lines := strings.Split(strings.TrimSpace(res.out), "\n")
	if res.code != 0 || len(lines) < 2 {
		t.Fatalf("unfence -o json: %+v", res)
	}
	for _, l := range lines {
		var rec struct{ Node, Action string }
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Node != "good" || rec.Action != "FENCE_ACTION_ON" {
			t.Fatalf("unfence -o json line %q: %v", l, err)
		}
	}

	if res = r.run(t, r.operator, "pause", "--reason", "maintenance"); res.code != 0 || !strings.HasPrefix(res.out, "paused") {
		t.Fatalf("pause: %+v", res)
	}
	if res = r.run(t, r.viewer, "zones"); !strings.Contains(res.out, "PAUSED") {
		t.Fatalf("zones after pause: %+v", res)
	}
	if res = r.run(t, r.operator, "resume", "-o", "json"); res.code != 0 || !strings.Contains(res.out, `"evictionsPaused": false`) {
		t.Fatalf("resume: %+v", res)
	}
}

// Ctrl-C while a fence runs stops following only: fencectl says the fence continues on the
// coordinator and how to follow it, and the record goes on to its end.
func TestInterruptSaysTheFenceContinues(t *testing.T) {
	r := startRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncbuf.Buffer{}
	done := make(chan result, 1)
	go func() { done <- r.runCtx(ctx, r.operator, out, "fence", "stuck") }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), " sent") {
		if time.Now().After(deadline) {
			t.Fatalf("no progress: %q", out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling fencectl's output
	}
	cancel() // Ctrl-C
	res := <-done
	res.out = out.String()
	if res.code != exitInterrupted || !strings.Contains(res.errOut, "continues on the coordinator") || !strings.Contains(res.errOut, "fencectl watch stuck-") {
		t.Fatalf("after Ctrl-C: %+v", res)
	}
	id := res.errOut[strings.Index(res.errOut, "fencectl watch ")+len("fencectl watch "):]
	id = strings.TrimSpace(id)
	// The record went on without fencectl: following it again sees it end (in error: the BMC is stuck).
	res = r.run(t, r.viewer, "watch", id)
	if res.code != 1 || !strings.Contains(res.errOut, "ended in ERROR") {
		t.Fatalf("watch %s: %+v", id, res)
	}
}
