package pdu_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/conformance"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	"github.com/nodefence/nodefence/fence-drivers/pdu"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/snmpsim"
)

// outlets per simulated PDU: every test takes fresh outlets, so no state leaks between tests.
const outlets = 60

var (
	sim      *snmpsim.Sim
	nextPlug = map[snmpsim.Profile]*atomic.Int64{}
	opSeq    atomic.Int64
)

func TestMain(m *testing.M) {
	var err error
	sim, err = snmpsim.Start(snmpsim.Config{Outlets: outlets})
	if err != nil {
		fmt.Fprintf(os.Stderr, "snmpsim: %v\n", err) // no skipping: the tests need the real snmpsim
		os.Exit(1)
	}
	for _, p := range snmpsim.Profiles {
		nextPlug[p] = new(atomic.Int64)
	}
	code := m.Run()
	if err := sim.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop snmpsim: %v\n", err)
	}
	os.Exit(code)
}

// plug takes a fresh outlet of profile p.
func plug(t *testing.T, p snmpsim.Profile) int {
	t.Helper()
	// Outlet 1 is never taken: a walk of the name column ends by reading the next column's
	// first row, so that outlet must always answer.
	n := int(nextPlug[p].Add(1)) + 1
	if n > outlets {
		t.Fatalf("out of simulated outlets on %s", p)
	}
	return n
}

// versions are the SNMP versions and security levels, as ClusterLabs parameters.
var versions = map[string]map[string]string{
	"v1":              {"snmp_version": "1", "community": snmpsim.CommunityRW},
	"v2c":             {"snmp-version": "2c", "community": snmpsim.CommunityRW},
	"v3-noAuthNoPriv": {"snmp-version": "3", "username": snmpsim.UserNoAuth, "snmp-sec-level": "noAuthNoPriv"},
	"v3-authNoPriv": {"snmp-version": "3", "username": snmpsim.UserAuthNoPriv, "password": snmpsim.AuthPass,
		"snmp-auth-prot": "SHA", "snmp-sec-level": "authNoPriv"},
	"v3-authPriv-SHA-AES": {"snmp-version": "3", "login": snmpsim.UserAuthPriv, "passwd": snmpsim.AuthPass,
		"snmp-auth-prot": "SHA", "snmp-sec-level": "authPriv", "snmp-priv-prot": "AES", "snmp-priv-passwd": snmpsim.PrivPass},
	"v3-authPriv-SHA256-AES256": {"snmp-version": "3", "username": snmpsim.UserAuthPriv256, "password": snmpsim.AuthPass,
		"snmp-auth-prot": "SHA256", "snmp-sec-level": "authPriv", "snmp-priv-prot": "AES256", "snmp-priv-passwd": snmpsim.PrivPass},
}

func target(p snmpsim.Profile, version string, plug string, extra ...string) *driverv1.Target {
	params := map[string]string{"ip": "127.0.0.1", "ipport": strconv.Itoa(sim.Port(p)), "plug": plug}
	for k, v := range versions[version] {
		params[k] = v
	}
	aliases := map[string][]string{"password": {"passwd"}, "username": {"login"}}
	for i := 0; i+1 < len(extra); i += 2 {
		for _, a := range aliases[extra[i]] {
			delete(params, a)
		}
		if extra[i+1] == "" {
			delete(params, extra[i])
		} else {
			params[extra[i]] = extra[i+1]
		}
	}
	return &driverv1.Target{Name: fmt.Sprintf("%s-%s", p, strings.ReplaceAll(plug, " ", "_")), Parameters: params}
}

func truthFunc(p snmpsim.Profile, n int) func(context.Context) (driverv1.PowerState, error) {
	return func(context.Context) (driverv1.PowerState, error) {
		on, err := sim.On(p, n)
		if err != nil {
			return driverv1.PowerState_POWER_STATE_UNKNOWN, err
		}
		if on {
			return driverv1.PowerState_POWER_STATE_ON, nil
		}
		return driverv1.PowerState_POWER_STATE_OFF, nil
	}
}

// TestConformance runs the conformance suite for every PDU model, each over another SNMP version.
func TestConformance(t *testing.T) {
	runs := []struct {
		profile snmpsim.Profile
		version string
	}{
		{snmpsim.APCRPDU, "v2c"},
		{snmpsim.APCRPDU2, "v3-authPriv-SHA-AES"},
		{snmpsim.APCMasterSwitch, "v1"},
		{snmpsim.EatonG3, "v3-authPriv-SHA256-AES256"},
		{snmpsim.EatonManaged, "v3-authNoPriv"},
		{snmpsim.Pulizzi, "v3-noAuthNoPriv"},
	}
	for _, r := range runs {
		t.Run(string(r.profile)+"/"+r.version, func(t *testing.T) {
			t.Parallel()
			conformance.Run(t, conformance.Harness{
				Client: serve(t),
				NewDevice: func(t *testing.T, c conformance.Condition) conformance.Device {
					return device(t, r.profile, r.version, c)
				},
				Timeout:   time.Second,
				OKTimeout: 10 * time.Second,
			})
		})
	}
}

func device(t *testing.T, p snmpsim.Profile, version string, c conformance.Condition) conformance.Device {
	if c == conformance.UnknownPlug {
		return conformance.Device{Target: target(p, version, strconv.Itoa(outlets+1))}
	}
	n := plug(t, p)
	d := conformance.Device{Target: target(p, version, strconv.Itoa(n)), Power: truthFunc(p, n)}
	var o snmpsim.Outlet
	switch c {
	case conformance.Stuck:
		o.Stuck = true
	case conformance.Hanging:
		o.Drop = true
	case conformance.Flapping:
		o.Flap = true
		d.Power = nil
	case conformance.WrongCredentials:
		if !strings.HasPrefix(version, "v3-auth") {
			t.Skipf("%s: the simulator does not answer a wrong community, and user %s has no passphrase to get wrong", version, snmpsim.UserNoAuth)
		}
		d.Target = target(p, version, strconv.Itoa(n), "password", "Wr0ng-passphrase")
	}
	if err := sim.SetOutlet(p, n, o); err != nil {
		t.Fatal(err)
	}
	return d
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func opID() string { return fmt.Sprintf("op-%d-%d", time.Now().UnixNano(), opSeq.Add(1)) }

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: error %v (code %s); want %s", what, err, got, want)
	}
}

// TestEveryProfileAndVersion switches one outlet of every model off and on over every SNMP
// version and security level, by number and by name, and checks the simulator's true state.
func TestEveryProfileAndVersion(t *testing.T) {
	c := serve(t)
	ctx := testCtx(t, 60*time.Second)
	for _, p := range snmpsim.Profiles {
		for v := range versions {
			n := plug(t, p)
			plugs := []string{strconv.Itoa(n), snmpsim.OutletName(n)}
			for i, pl := range plugs {
				tg := target(p, v, pl)
				if i == 1 {
					tg = target(p, v, pl, "device_type", map[snmpsim.Profile]string{
						snmpsim.APCRPDU: "apc-rpdu", snmpsim.APCRPDU2: "apc-rpdu2", snmpsim.APCMasterSwitch: "apc-masterswitch",
						snmpsim.EatonG3: "eaton-epdu", snmpsim.EatonManaged: "eaton-managed", snmpsim.Pulizzi: "eaton-pulizzi"}[p])
				}
				if _, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tg}); err != nil {
					t.Fatalf("%s %s plug %q: PowerOff: %v", p, v, pl, err)
				}
				if on, err := sim.On(p, n); err != nil || on {
					t.Fatalf("%s %s plug %q: after PowerOff the outlet is on=%v (%v)", p, v, pl, on, err)
				}
				st, err := c.Status(ctx, &driverv1.StatusRequest{Target: tg})
				if err != nil || st.GetState() != driverv1.PowerState_POWER_STATE_OFF {
					t.Fatalf("%s %s plug %q: Status after off = %v, %v", p, v, pl, st, err)
				}
				if _, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 1, Target: tg}); err != nil {
					t.Fatalf("%s %s plug %q: PowerOn: %v", p, v, pl, err)
				}
				if on, err := sim.On(p, n); err != nil || !on {
					t.Fatalf("%s %s plug %q: after PowerOn the outlet is on=%v (%v)", p, v, pl, on, err)
				}
			}
		}
	}
}

// TestFaultHooks covers the simulator's SET errors, the read-only community, unknown outlet
// names and a wrong privacy passphrase.
func TestFaultHooks(t *testing.T) {
	c := serve(t)
	ctx := testCtx(t, 60*time.Second)
	for _, p := range []snmpsim.Profile{snmpsim.APCRPDU, snmpsim.EatonG3} {
		for _, v := range []string{"v1", "v2c", "v3-authPriv-SHA-AES"} {
			n := plug(t, p)
			if err := sim.SetOutlet(p, n, snmpsim.Outlet{Error: "commitFailed"}); err != nil {
				t.Fatal(err)
			}
			_, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(p, v, strconv.Itoa(n))})
			wantCode(t, fmt.Sprintf("%s %s PowerOff of an outlet failing its SETs", p, v), err, codes.Unavailable)
			if on, _ := sim.On(p, n); !on {
				t.Fatalf("%s %s: outlet failing its SETs is off", p, v)
			}
		}
		for _, v := range []string{"v1", "v2c"} {
			n := plug(t, p)
			_, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1,
				Target: target(p, v, strconv.Itoa(n), "community", snmpsim.CommunityRO)})
			wantCode(t, fmt.Sprintf("%s %s PowerOff with the read-only community", p, v), err, codes.Unauthenticated)
			if on, _ := sim.On(p, n); !on {
				t.Fatalf("%s %s: outlet switched with the read-only community", p, v)
			}
		}
	}

	// A wrong community gets no answer: a deadline, with a hint.
	start := time.Now()
	_, err := c.Status(ctx, &driverv1.StatusRequest{Target: target(snmpsim.APCRPDU, "v2c", "1", "community", "n0t-the-community"),
		Timeout: durationpb.New(500 * time.Millisecond)})
	wantCode(t, "Status with a wrong community", err, codes.DeadlineExceeded)
	if el := time.Since(start); el > time.Second {
		t.Errorf("Status with a wrong community took %s with a 500ms timeout", el)
	}
	if msg := status.Convert(err).Message(); strings.Contains(msg, "n0t-the-community") {
		t.Errorf("message %q contains the community", msg)
	}

	_, err = c.Status(ctx, &driverv1.StatusRequest{Target: target(snmpsim.APCRPDU2, "v3-authPriv-SHA-AES", "1", "snmp-priv-passwd", "Wr0ng-privpass"),
		Timeout: durationpb.New(time.Second)})
	if code := status.Code(err); code == codes.OK {
		t.Errorf("Status with a wrong privacy passphrase succeeded")
	}
	t.Logf("wrong privacy passphrase: %v", err)
	_, err = c.Status(ctx, &driverv1.StatusRequest{Target: target(snmpsim.APCRPDU2, "v3-authPriv-SHA-AES", "1", "username", "nobody-here"),
		Timeout: durationpb.New(time.Second)})
	if code := status.Code(err); code != codes.Unauthenticated && code != codes.DeadlineExceeded {
		t.Errorf("Status of an unknown SNMPv3 user: %v; want Unauthenticated or (no answer) DeadlineExceeded", err)
	}

	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(snmpsim.EatonG3, "v2c", "No Such Outlet")})
	wantCode(t, "PowerOff of an unknown outlet name", err, codes.InvalidArgument)
}

// TestListAndDescribe lists a PDU's outlets and checks Describe names the ClusterLabs parameters.
func TestListAndDescribe(t *testing.T) {
	c := serve(t)
	ctx := testCtx(t, 30*time.Second)
	n := plug(t, snmpsim.APCRPDU2)
	if err := sim.SetOutlet(snmpsim.APCRPDU2, n, snmpsim.Outlet{State: "off"}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.List(ctx, &driverv1.ListRequest{Target: target(snmpsim.APCRPDU2, "v2c", "1", "snmp_timeout", "0.2")})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(resp.GetPlugs()) != outlets { // outlet 1 is healthy: a walk ends by reading it
		t.Fatalf("List returned %d plugs, want %d", len(resp.GetPlugs()), outlets)
	}
	var got *driverv1.Plug
	for _, p := range resp.GetPlugs() {
		if p.GetId() == strconv.Itoa(n) {
			got = p
		}
	}
	if got.GetId() != strconv.Itoa(n) || got.GetName() != snmpsim.OutletName(n) || got.GetState() != driverv1.PowerState_POWER_STATE_OFF {
		t.Errorf("plug %d = %v; want %q off (rPDU2 reports off as 1)", n, got, snmpsim.OutletName(n))
	}

	d, err := c.Describe(ctx, &driverv1.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range d.GetParameters() {
		names[p.GetName()] = true
		for _, a := range p.GetAliases() {
			names[a] = true
		}
	}
	for _, want := range []string{"ip", "ipaddr", "ipport", "community", "snmp_version", "username", "login", "password",
		"passwd", "snmp_auth_prot", "snmp_sec_level", "snmp_priv_prot", "snmp_priv_passwd", "plug", "port"} {
		if !names[want] {
			t.Errorf("Describe lacks parameter %q", want)
		}
	}
	mon, err := c.Monitor(ctx, &driverv1.MonitorRequest{Target: target(snmpsim.EatonManaged, "v3-authPriv-SHA-AES", "1")})
	if err != nil || !mon.GetReachable() || !mon.GetCredentialsOk() {
		t.Errorf("Monitor = %v, %v", mon, err)
	}
}

// TestInvalidParameters checks that bad parameters are all named at once.
func TestInvalidParameters(t *testing.T) {
	c := serve(t)
	ctx := testCtx(t, 10*time.Second)
	_, err := c.Status(ctx, &driverv1.StatusRequest{Target: &driverv1.Target{Parameters: map[string]string{
		"ip": "127.0.0.1", "plug": "0", "snmp_version": "4", "device_type": "acme",
	}}})
	wantCode(t, "bad parameters", err, codes.InvalidArgument)
	msg := status.Convert(err).Message()
	for _, want := range []string{"plug", "snmp_version", "device_type"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %s", msg, want)
		}
	}
	_, err = c.Status(ctx, &driverv1.StatusRequest{Target: target(snmpsim.APCRPDU, "v3-authPriv-SHA-AES", "1", "snmp-priv-prot", "ROT13")})
	wantCode(t, "unknown privacy protocol", err, codes.InvalidArgument)
}

// serve runs the PDU driver service on 127.0.0.1 over real gRPC and returns a client for it.
func serve(t *testing.T) driverv1.FenceDriverServiceClient {
	t.Helper()
	_, c := kittest.Serve(t, pdu.New(), kit.Options{PollInterval: 20 * time.Millisecond, Log: logger(t)})
	return c
}

func logger(t *testing.T) *slog.Logger { return kittest.Logger(t, slog.LevelInfo) }

// One outlet is one device however it is named: a deposed leader (older epoch) cannot switch
// outlet 7 by calling it "07" or by the outlet's name, and the epoch check happens before the
// outlet is switched.
func TestOutletNumberSpellingsAreOneDevice(t *testing.T) {
	c := serve(t)
	ctx := testCtx(t, 30*time.Second)
	n := plug(t, snmpsim.APCRPDU)
	if _, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 7, Target: target(snmpsim.APCRPDU, "v2c", strconv.Itoa(n))}); err != nil {
		t.Fatal(err)
	}
	_, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 6, Target: target(snmpsim.APCRPDU, "v2c", fmt.Sprintf("%03d", n))})
	wantCode(t, "PowerOn of the same outlet, zero-padded, by an older epoch", err, codes.FailedPrecondition)
	_, err = c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 6, Target: target(snmpsim.APCRPDU, "v2c", snmpsim.OutletName(n))})
	wantCode(t, "PowerOn of the same outlet, by its name, by an older epoch", err, codes.FailedPrecondition)
	if on, _ := sim.On(snmpsim.APCRPDU, n); on {
		t.Fatalf("outlet %d was switched on by a deposed epoch", n)
	}
	// The current epoch may use the name; a name no outlet has is refused, naming the parameter.
	if _, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: opID(), Epoch: 7, Target: target(snmpsim.APCRPDU, "v2c", snmpsim.OutletName(n))}); err != nil {
		t.Fatal(err)
	}
	if on, _ := sim.On(snmpsim.APCRPDU, n); !on {
		t.Fatalf("outlet %d is not on after PowerOn by its name", n)
	}
	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 7, Target: target(snmpsim.APCRPDU, "v2c", "no-such-outlet")})
	wantCode(t, "PowerOff of an outlet name the PDU does not have", err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "target.parameters.plug") {
		t.Errorf("error %v does not name target.parameters.plug", err)
	}
}

// A PDU that never answers, asked to switch an outlet given by name: finding the outlet runs out
// of the operation's time and says so (DeadlineExceeded), not "no such outlet", within the deadline.
func TestNamedOutletOfAHangingPDU(t *testing.T) {
	c := serve(t)
	ctx := testCtx(t, 30*time.Second)
	silent, err := net.ListenPacket("udp", "127.0.0.1:0") // bound, never read: requests time out
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	tg := target(snmpsim.APCRPDU, "v2c", "Outlet 1")
	tg.Parameters["ipport"] = strconv.Itoa(silent.LocalAddr().(*net.UDPAddr).Port)
	start := time.Now()
	_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 3, Target: tg, Timeout: durationpb.New(time.Second)})
	wantCode(t, "PowerOff of a named outlet on a PDU that never answers", err, codes.DeadlineExceeded)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %s with a 1 s timeout", took)
	}
}
