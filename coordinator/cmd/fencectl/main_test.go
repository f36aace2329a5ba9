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
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/hanglistener"
)

func TestConfigCheckPrintsThePlanWithSecretsMasked(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"config", "check", "../../config/testdata/seed-complete"}, &out, &errb)
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
	code := run(context.Background(), []string{"config", "check", "../../config/testdata/seed/two-node.yaml"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "6 problem(s)") {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"frobnicate"}, {"fence"}, {"config", "check"}, {"--coordinator", "", "nodes"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"--insecure"}, args...), &out, &errb); code != 2 {
			t.Errorf("fencectl %q: exit %d, want 2 (stderr %q)", args, code, errb.String())
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
	insecure := tlsfiles.Files{Insecure: true}
	a, err := app.New(app.Config{
		Server: server.Config{Listen: "127.0.0.1:0", TLS: insecure, DrainTimeout: time.Second,
			UnauthenticatedCaller: "spiffe://nodefence/viewer/test"}, DriverTLS: insecure,
		FenceConfig: cfgPath, DataDir: t.TempDir(), EtcdClientListen: "127.0.0.1:0", EtcdPeerListen: "127.0.0.1:0",
		EtcdUnsafeNoFsync: true, ElectionTTL: time.Second, KdumpListen: "",
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
		code := run(context.Background(), []string{"--insecure", "--coordinator", ln.Addr().String() + "," + a.Addr(),
			"--timeout", "5s", "--per-address-timeout", "1s", "nodes"}, &out, &errb)
		if code == 0 && strings.Contains(out.String(), "node-1") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fencectl nodes: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
		}
		time.Sleep(200 * time.Millisecond) // the coordinator may still be electing itself
	}
}
