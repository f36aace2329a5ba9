package brocade_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/brocade"
	"github.com/nodefence/nodefence/fence-drivers/conformance"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/kit/kittest"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/brocadesim"
)

const (
	user     = "admin"
	password = "fibranne"
	ports    = 64
)

var opSeq atomic.Int64

func startSwitch(t *testing.T, n int) *brocadesim.Switch {
	t.Helper()
	sw, err := brocadesim.Start(brocadesim.Config{Ports: n, User: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return sw
}

// target addresses port plug of sw over transport ("telnet" or "ssh"); extra are key, value
// pairs overriding parameters ("" deletes). ClusterLabs aliases are used on purpose.
func target(sw *brocadesim.Switch, transport string, plug int, extra ...string) *driverv1.Target {
	p := map[string]string{"ipaddr": "127.0.0.1", "login": user, "passwd": password, "port": strconv.Itoa(plug)}
	if transport == "ssh" {
		p["ipport"] = strconv.Itoa(sw.SSHPort())
		p["ssh"] = "1"
		p["ssh_host_key"] = string(ssh.MarshalAuthorizedKey(sw.HostKey()))
	} else {
		p["ipport"] = strconv.Itoa(sw.TelnetPort())
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			delete(p, extra[i])
		} else {
			p[extra[i]] = extra[i+1]
		}
	}
	return &driverv1.Target{Name: "node-" + strconv.Itoa(plug), Parameters: p}
}

func stateOf(sw *brocadesim.Switch, plug int) func(context.Context) (driverv1.PowerState, error) {
	return func(context.Context) (driverv1.PowerState, error) {
		d, err := sw.Disabled(plug)
		if err != nil {
			return driverv1.PowerState_POWER_STATE_UNKNOWN, err
		}
		if d {
			return driverv1.PowerState_POWER_STATE_OFF, nil
		}
		return driverv1.PowerState_POWER_STATE_ON, nil
	}
}

// TestConformance runs the conformance suite over telnet and SSH against the simulated switch,
// reading each port's true state from the simulator.
func TestConformance(t *testing.T) {
	for _, transport := range []string{"telnet", "ssh"} {
		t.Run(transport, func(t *testing.T) {
			sw := startSwitch(t, ports)
			hung := startSwitch(t, 4)
			hung.SetHang(true)
			var next atomic.Int64
			c := serve(t, brocade.Config{})
			conformance.Run(t, conformance.Harness{
				Client: c,
				NewDevice: func(t *testing.T, cond conformance.Condition) conformance.Device {
					if cond == conformance.Hanging {
						return conformance.Device{Target: target(hung, transport, 1), Power: stateOf(hung, 1)}
					}
					plug := int(next.Add(1))
					if plug >= ports {
						t.Fatal("out of simulated ports")
					}
					d := conformance.Device{Target: target(sw, transport, plug), Power: stateOf(sw, plug)}
					switch cond {
					case conformance.Stuck:
						_ = sw.SetFault(plug, brocadesim.FaultStuck)
					case conformance.Flapping:
						_ = sw.SetFault(plug, brocadesim.FaultFlapping)
					case conformance.WrongCredentials:
						d.Target = target(sw, transport, plug, "passwd", "not-"+password)
					case conformance.UnknownPlug:
						d.Target, d.Power = target(sw, transport, ports+10), nil
					}
					return d
				},
				Timeout:   time.Second,
				OKTimeout: 10 * time.Second,
			})
		})
	}
}

func opID() string { return "test-" + strconv.FormatInt(opSeq.Add(1), 10) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestCommandErrorIsUnavailable(t *testing.T) {
	sw := startSwitch(t, 4)
	_ = sw.SetFault(2, brocadesim.FaultCommandError)
	c := serve(t, brocade.Config{})
	_, err := c.PowerOff(ctx(t), &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: target(sw, "telnet", 2), Timeout: durationpb.New(5 * time.Second)})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("PowerOff with a command error: %v; want Unavailable quoting the switch", err)
	}
	if d, _ := sw.Disabled(2); d {
		t.Fatal("port disabled")
	}
}

func TestListAndSessionReuse(t *testing.T) {
	sw := startSwitch(t, 6)
	_ = sw.SetDisabled(4, true)
	c := serve(t, brocade.Config{})
	for _, tr := range []string{"telnet", "ssh"} {
		resp, err := c.List(ctx(t), &driverv1.ListRequest{Target: target(sw, tr, 0)})
		if err != nil {
			t.Fatalf("%s: List: %v", tr, err)
		}
		if len(resp.GetPlugs()) != 6 {
			t.Fatalf("%s: List = %v; want 6 ports", tr, resp.GetPlugs())
		}
		for _, p := range resp.GetPlugs() {
			want := driverv1.PowerState_POWER_STATE_ON
			if p.GetId() == "4" {
				want = driverv1.PowerState_POWER_STATE_OFF
			}
			if p.GetState() != want {
				t.Fatalf("%s: port %s is %v, want %v", tr, p.GetId(), p.GetState(), want)
			}
		}
	}
	before := sw.Logins()
	for range 5 {
		if _, err := c.Status(ctx(t), &driverv1.StatusRequest{Target: target(sw, "telnet", 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := sw.Logins() - before; got > 1 {
		t.Fatalf("5 status reads logged in %d times; want the session reused", got)
	}
}

func TestHostKeyPolicies(t *testing.T) {
	sw := startSwitch(t, 4)
	dir := t.TempDir()
	kh := filepath.Join(dir, "sub", "known_hosts")
	c := serve(t, brocade.Config{IdleTimeout: -1})
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(other)
	otherKey := string(ssh.MarshalAuthorizedKey(otherSigner.PublicKey()))

	statusOf := func(tg *driverv1.Target) error {
		_, err := c.Status(ctx(t), &driverv1.StatusRequest{Target: tg, Timeout: durationpb.New(5 * time.Second)})
		return err
	}
	cases := []struct {
		name  string
		extra []string
		code  codes.Code
	}{
		{"pinned key", nil, codes.OK},
		{"pinned fingerprint", []string{"ssh_host_key", ssh.FingerprintSHA256(sw.HostKey())}, codes.OK},
		{"pinned other key", []string{"ssh_host_key", otherKey}, codes.Unauthenticated},
		{"pinned other fingerprint", []string{"ssh_host_key", ssh.FingerprintSHA256(otherSigner.PublicKey())}, codes.Unauthenticated},
		{"bad pinned key", []string{"ssh_host_key", "ssh-ed25519 garbage"}, codes.InvalidArgument},
		{"no policy", []string{"ssh_host_key", ""}, codes.InvalidArgument},
		{"accept-new first use", []string{"ssh_host_key", "", "ssh_known_hosts", kh}, codes.OK},
		{"accept-new known", []string{"ssh_host_key", "", "ssh_known_hosts", kh}, codes.OK},
		{"insecure", []string{"ssh_host_key", "", "ssh_insecure", "1"}, codes.OK},
		{"identity file unreadable", []string{"identity_file", filepath.Join(dir, "missing")}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		err := statusOf(target(sw, "ssh", 1, tc.extra...))
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v; want %s", tc.name, err, tc.code)
		}
	}
	data, err := os.ReadFile(kh)
	if err != nil || !strings.Contains(string(data), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sw.HostKey())))[:40]) {
		t.Fatalf("known_hosts after accept-new: %q, %v", data, err)
	}
	// The same address with another key (a replaced switch, or a man in the middle) is refused.
	sw2, err := brocadesim.Start(brocadesim.Config{Ports: 4, User: user, Password: password, HostKey: otherSigner})
	if err != nil {
		t.Fatal(err)
	}
	defer sw2.Close()
	line := strings.Replace(string(data), "]:"+strconv.Itoa(sw.SSHPort()), "]:"+strconv.Itoa(sw2.SSHPort()), 1)
	if err := os.WriteFile(kh, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	err = statusOf(target(sw2, "ssh", 1, "ssh_host_key", "", "ssh_known_hosts", kh))
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "man in the middle") {
		t.Fatalf("changed host key: %v; want Unauthenticated naming the risk", err)
	}
}

func TestIdentityFile(t *testing.T) {
	sw := startSwitch(t, 4)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	c := serve(t, brocade.Config{})
	// The simulator takes passwords only: a key login is refused, the password then accepted.
	_, err = c.Status(ctx(t), &driverv1.StatusRequest{Target: target(sw, "ssh", 1, "identity_file", path)})
	if err != nil {
		t.Fatalf("key then password: %v", err)
	}
	_, err = c.Status(ctx(t), &driverv1.StatusRequest{Target: target(sw, "ssh", 1, "identity_file", path, "passwd", "")})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("key refused and no password: %v; want Unauthenticated", err)
	}
}

func TestParse(t *testing.T) {
	d := brocade.New()
	cases := []struct {
		name   string
		params map[string]string
		bad    []string
	}{
		{"telnet ok", map[string]string{"ip": "sw1", "username": "a", "password": "p", "plug": "3", "ssh": "0", "command_prompt": "> "}, nil},
		{"plug not a number", map[string]string{"ip": "sw1", "username": "a", "password": "p", "plug": "x", "ssh": "0", "command_prompt": "> "}, []string{"plug"}},
		{"telnet without password", map[string]string{"ip": "sw1", "username": "a", "plug": "3", "ssh": "0", "command_prompt": "> "}, []string{"password"}},
		{"ssh without host key policy", map[string]string{"ip": "sw1", "username": "a", "password": "p", "plug": "3", "ssh": "1", "command_prompt": "> "}, []string{"ssh_host_key"}},
		{"everything wrong", map[string]string{"ip": "a b", "ipport": "70000", "plug": "-1", "ssh": "0", "command_prompt": " "},
			[]string{"command_prompt", "ip", "ipport", "password", "plug", "username"}},
	}
	for _, tc := range cases {
		_, err := d.Parse(tc.params)
		var got []string
		if err != nil {
			for _, f := range strings.Split(strings.TrimPrefix(err.Error(), "invalid: "), "; ") {
				got = append(got, strings.SplitN(f, ":", 2)[0])
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.bad, ",") {
			t.Errorf("%s: Parse = %v; want problems with %v", tc.name, err, tc.bad)
		}
	}
}

// serve runs the Brocade driver service on 127.0.0.1 over real gRPC and returns a client for it.
func serve(t *testing.T, cfg brocade.Config) driverv1.FenceDriverServiceClient {
	t.Helper()
	cfg.Log = logger(t)
	d := brocade.NewWith(cfg)
	t.Cleanup(d.Close)
	_, c := kittest.Serve(t, d, kit.Options{PollInterval: 20 * time.Millisecond, Log: cfg.Log})
	return c
}

func logger(t *testing.T) *slog.Logger { return kittest.Logger(t, slog.LevelInfo) }
