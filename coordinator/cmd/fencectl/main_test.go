package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/testbed/hanglistener"
	"github.com/nodefence/nodefence/testbed/pki"
)

func TestConfigCheckPrintsThePlanWithSecretsMasked(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"config", "check", "../../fenceconfig/testdata/seed-complete"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	for _, want := range []string{"node host0", "node host1", "1. fc-off: off via brocade", "1. eaton-off: off via pdu, must succeed",
		"2. eaton-on: on via pdu, must succeed", "password=***", "snmp-priv-passwd=***", "2 node(s), configuration valid"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, secret := range []string{"eaton_password", "brocade_password", "eaton_snmp_passwd"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("output shows the secret %q", secret)
		}
	}
}

func TestConfigCheckListsEveryProblem(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"config", "check", "../../fenceconfig/testdata/seed/two-node.yaml"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "6 problem(s)") {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
}

// Driver parameters are checked offline with the drivers' own rules, and every secret the drivers
// know (IPMI kg, passphrases, SNMP auth passwords) is masked.
func TestConfigCheckDriverParameters(t *testing.T) {
	write := func(yaml string) string {
		p := filepath.Join(t.TempDir(), "fence.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write(`drivers: {ipmi: {endpoint: "127.0.0.1:1"}, agent: {endpoint: "127.0.0.1:2"}}
nodes:
  n1:
    methods:
      bmc: {driver: ipmi, parameters: {ip: "10.0.0.1; reboot", cipher: "0", lanplus: "1"}}
      script: {driver: agent, parameters: {agent: fence_ipmilan, ip: 10.0.0.2, ipmitool_path: /tmp/evil.sh}}
    steps: {power_management: [bmc, script]}
`)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"config", "check", bad}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1; stdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	// The agent method's parameters are refused when the configuration loads (the coordinator
	// refuses them the same way); the drivers' own rules run on a configuration that loads.
	if want := "nodes.n1.methods.script.parameters.ipmitool_path:"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, errb.String())
	}
	out.Reset()
	errb.Reset()
	badIPMI := write(`drivers: {ipmi: {endpoint: "127.0.0.1:1"}}
nodes:
  n1:
    methods:
      bmc: {driver: ipmi, parameters: {ip: "10.0.0.1; reboot", cipher: "0", lanplus: "1"}}
    steps: {power_management: [bmc]}
`)
	if code := run(context.Background(), []string{"config", "check", badIPMI}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1; stdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"bmc (driver ipmi): ip:", "bmc (driver ipmi): cipher:"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	good := write(`drivers: {ipmi: {endpoint: "127.0.0.1:1"}, agent: {endpoint: "127.0.0.1:2"}}
nodes:
  n1:
    methods:
      bmc: {driver: ipmi, parameters: {ip: 10.0.0.1, cipher: "3", password: pw-one, hexadecimal_kg: hex-three}}
    steps: {power_management: [bmc]}
`)
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"config", "check", good}, &out, &errb); code != 0 || !strings.Contains(out.String(), "kg=***") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	// Names no driver and no fence agent knows are refused (each named, its value never shown).
	unknown := write(`drivers: {ipmi: {endpoint: "127.0.0.1:1"}}
nodes:
  n1:
    methods:
      bmc: {driver: ipmi, parameters: {ip: 10.0.0.1, kg: kg-two, snmp_auth_pass: auth-four, passphrase: phrase-five, pass: pass-six}}
    steps: {power_management: [bmc]}
`)
	if code := run(context.Background(), []string{"config", "check", unknown}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "4 problem(s)") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, secret := range []string{"pw-one", "kg-two", "hex-three", "auth-four", "phrase-five", "pass-six"} {
		if strings.Contains(out.String()+errb.String(), secret) {
			t.Errorf("the secret %q is printed:\n%s%s", secret, out.String(), errb.String())
		}
	}
}

// A coordinator that accepts connections but never answers (cut off, or stopped) is listed first:
// fencectl gives it its own deadline and asks the next address, a real coordinator, within the
// overall deadline.
func TestEachAddressHasItsOwnDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hung := hanglistener.New(ln)
	hung.SetHang(true)
	go func() {
		for {
			if _, err := hung.Accept(); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); hung.CloseHung() })

	cfgPath := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(cfgPath, []byte(`drivers:
  ipmi: {endpoint: "127.0.0.1:1"}
templates:
  bmc: {driver: ipmi, parameters: {username: admin, password: x}}
nodes:
  node-1:
    zone: a
    methods:
      bmc: {template: bmc, parameters: {ip: 127.0.0.1}}
    steps:
      power_management: [bmc]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	coordTLS, err := ca.Files(identity.Coordinator, "c1")
	if err != nil {
		t.Fatal(err)
	}
	opTLS, err := ca.Files(identity.Operator, "alice")
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(app.Config{
		Server: server.Config{Listen: "127.0.0.1:0", TLS: coordTLS, DrainTimeout: time.Second}, DriverTLS: coordTLS,
		FenceConfig: cfgPath, DataDir: t.TempDir(), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0",
		EtcdUnsafeNoFsync: true, ElectionTTL: 3 * time.Second, KdumpListen: "",
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	deadline := time.Now().Add(20 * time.Second)
	for {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(pki.Args("", opTLS), "--coordinator", ln.Addr().String()+","+a.Addr(),
			"--timeout", "5s", "--per-address-timeout", "1s", "nodes"), &out, &errb)
		if code == 0 && strings.Contains(out.String(), "node-1") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fencectl nodes: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
		}
		time.Sleep(200 * time.Millisecond) // the coordinator may still be electing itself
	}
}
