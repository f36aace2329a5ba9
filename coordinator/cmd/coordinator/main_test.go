package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRefusesToStartListingEveryProblem(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "fence.yaml")
	if err := os.WriteFile(bad, []byte("drivers: {ipmi: {endpoint: nope}}\nnodes: {n1: {methods: {m: {driver: pdu}}, steps: {power_management: [m, x]}}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := run(context.Background(), []string{
		"--listen", "nohostport", "--election-ttl", "1500ms", "--unhealthy-zone-threshold", "1.5",
		"--fence-policy", "bogus", "--driver-endpoint", "ipmi=nohostport", "--config", bad, "--etcd-prefix", "nodefence/",
		"--gc-percent", "20", "--control-plane-selector", "role in (", "--fence-guard-settle", "-1s", "--release-healthy-delay", "-1s",
		"--pod-eviction-timeout", "5m",
	}, io.Discard, &stderr)
	if code != 2 {
		t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{
		"--listen", "--election-ttl", "--unhealthy-zone-threshold", "--fence-policy", "--driver-endpoint ipmi", "--etcd-prefix",
		"--gc-percent: 20 is not in 50..1000", "--tls-cert: required unless --insecure", "--driver-tls-ca",
		"drivers.ipmi.endpoint", "nodes.n1.methods.m.driver", "nodes.n1.steps.power_management[1]",
		"--control-plane-selector", "--fence-guard-settle", "--release-healthy-delay",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not mention %q:\n%s", want, stderr.String())
		}
	}
	if strings.Contains(stderr.String(), "--pod-eviction-timeout:") {
		t.Errorf("the deprecated --pod-eviction-timeout was refused:\n%s", stderr.String())
	}
}

func TestRejectsUnknownFlagsAndArguments(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"--insecure", "extra"}, {"--kubelet-down-policy", "maybe"}} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
}

// --version prints the binary's name and build, and exits 0 without starting (no --insecure or
// TLS flags needed).
func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--version: exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.HasPrefix(out, "coordinator ") || strings.Count(out, "\n") != 1 {
		t.Errorf("--version printed %q, want one line starting with \"coordinator \"", out)
	}
}
