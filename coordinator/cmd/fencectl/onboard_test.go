package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodefence/nodefence/testbed/ipmisim"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func runCtl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	home := t.TempDir()
	env := func(k string) string {
		if k == "HOME" {
			return home
		}
		return ""
	}
	code = runEnv(context.Background(), args, &out, &errb, env)
	return code, out.String(), errb.String()
}

// A typo'd parameter (passwrd) is refused with the field it is written in and a suggestion, not
// passed on and masked as a secret.
func TestConfigCheckRefusesUnknownParameters(t *testing.T) {
	p := writeFile(t, "fence.yaml", `drivers: {ipmi: {endpoint: "127.0.0.1:1"}}
templates:
  bmc: {driver: ipmi, parameters: {username: admin, passwrd: typo-secret}}
host_maps:
  - template: bmc
    parameters: {ip: "node-01:10.0.0.11;node-02:10.0.0.12", ipprt: "node-01:623;node-02:623"}
`)
	code, out, errb := runCtl(t, "config", "check", p)
	for _, want := range []string{"2 problem(s)", `templates.bmc.parameters.passwrd: unknown parameter for driver ipmi; did you mean "password"`,
		`host_maps[0].parameters.ipprt: unknown parameter for driver ipmi; did you mean "ipport"`} {
		if code != 1 || !strings.Contains(errb, want) {
			t.Errorf("exit %d; stderr lacks %q:\n%s%s", code, want, out, errb)
		}
	}
	if strings.Contains(out+errb, "typo-secret") {
		t.Errorf("the value is printed:\n%s%s", out, errb)
	}
}

// Two nodes on one BMC (here spelled two ways), or on one PDU outlet, are refused, naming both
// nodes and the field (the host map's, where the value is written); one node's off and on methods
// on one device are fine, and so are nodes written out in nodes:.
func TestConfigCheckRefusesSharedDevices(t *testing.T) {
	p := writeFile(t, "fence.yaml", `drivers: {ipmi: {endpoint: "127.0.0.1:1"}, pdu: {endpoint: "127.0.0.1:2"}}
templates:
  bmc: {driver: ipmi, parameters: {username: admin}}
  apc: {driver: pdu, parameters: {ip: 10.0.1.1, username: apc, password: apc}}
host_maps:
  - template: bmc
    parameters: {ip: "node-01:10.0.0.11;node-02:10.0.0.12;node-03:::ffff:10.0.0.11"}
  - template: apc
    steps: [power_management, recovery]
    parameters: {plug: "node-01:1;node-02:2;node-03:2"}
`)
	code, out, errb := runCtl(t, "config", "check", p)
	for _, want := range []string{
		"host_maps[0].parameters.ip: nodes node-01 and node-03 use the same device ipmi/10.0.0.11:623: fencing one",
		"host_maps[1].parameters.plug: nodes node-02 and node-03 use the same device pdu/10.0.1.1:161/2: fencing one",
		"2 problem(s)",
	} {
		if code != 1 || !strings.Contains(errb, want) {
			t.Errorf("exit %d; stderr lacks %q:\n%s%s", code, want, out, errb)
		}
	}
	long := writeFile(t, "long.yaml", `drivers: {ipmi: {endpoint: "127.0.0.1:1"}}
nodes:
  a:
    methods: {bmc: {driver: ipmi, parameters: {ip: 10.0.0.1}}}
    steps: {power_management: [bmc], recovery: [bmc]}
  b:
    methods: {bmc: {driver: ipmi, parameters: {ipaddr: 10.0.0.1, ipport: "623"}}}
    steps: {power_management: [bmc]}
`)
	code, out, errb = runCtl(t, "config", "check", long)
	if want := "nodes.b.methods.bmc.parameters.ipaddr: nodes a and b use the same device ipmi/10.0.0.1:623 (nodes.a.methods.bmc.parameters.ip and nodes.b.methods.bmc.parameters.ipaddr)"; code != 1 || !strings.Contains(errb, want) || !strings.Contains(errb, "1 problem(s)") {
		t.Errorf("exit %d; stderr lacks %q:\n%s%s", code, want, out, errb)
	}
}

// Secret files are read only when asked: a configuration naming files that are not on this host
// checks clean without --check-secrets, and is refused with it.
func TestConfigCheckReadsSecretsOnlyWhenAsked(t *testing.T) {
	p := writeFile(t, "fence.yaml", `drivers: {ipmi: {endpoint: "127.0.0.1:1"}}
nodes:
  n1:
    methods: {bmc: {driver: ipmi, parameters: {ip: 10.0.0.1, password_file: /nonexistent/bmc-password}}}
    steps: {power_management: [bmc]}
`)
	if code, out, errb := runCtl(t, "config", "check", p); code != 0 {
		t.Fatalf("without --check-secrets: exit %d\n%s%s", code, out, errb)
	}
	code, out, errb := runCtl(t, "config", "check", "--check-secrets", p)
	if code != 1 || !strings.Contains(errb, "nodes.n1.methods.bmc.parameters.password_file: secret file: open /nonexistent/bmc-password") {
		t.Fatalf("with --check-secrets: exit %d\n%s%s", code, out, errb)
	}
}

func TestDescribeListsTheDriversParameters(t *testing.T) {
	code, out, errb := runCtl(t, "describe", "ipmi")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb)
	}
	for _, want := range []string{"PARAMETER", "password  ", "passwd", "yes", "ipport", "623"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe ipmi lacks %q:\n%s", want, out)
		}
	}
	if code, out, _ := runCtl(t, "describe", "agent", "-o", "json"); code != 0 || !strings.Contains(out, `"name": "snmp_priv_passwd"`) {
		t.Errorf("describe agent -o json: exit %d\n%s", code, out)
	}
	if code, _, errb := runCtl(t, "describe", "ipmx"); code != 2 || !strings.Contains(errb, `did you mean "ipmi"`) {
		t.Errorf("describe ipmx: exit %d: %s", code, errb)
	}
}

// test --config checks a node's BMC as a configuration not yet applied describes it, with no
// coordinator: Monitor and Status only. The BMC's own call log shows no power operation; a wrong
// password is reported as rejected credentials without being printed.
func TestTestConfigNeverSwitchesPower(t *testing.T) {
	bmc, err := ipmisim.Start(filepath.Join(t.TempDir(), "bmc"), 0, "admin", "bmc-password")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bmc.Stop() })
	good := writeFile(t, "good-password", "bmc-password\n")
	bad := writeFile(t, "bad-password", "wrong-password\n")
	config := func(secret string) string {
		return writeFile(t, "fence.yaml", fmt.Sprintf(`drivers: {ipmi: {endpoints: ["127.0.0.1:1", "127.0.0.1:2"]}}
templates:
  bmc: {driver: ipmi, parameters: {username: admin, password_file: %s, cipher: "3"}}
host_maps:
  - template: bmc
    steps: [power_management, recovery]
    parameters: {ip: "node-01:127.0.0.1", ipport: "node-01:%d"}
`, secret, bmc.Port))
	}
	// No coordinator listens at the default address: none is asked.
	code, out, errb := runCtl(t, "test", "--config", config(good), "node-01", "--coordinator", "127.0.0.1:1")
	if code != 0 || !strings.Contains(out, "bmc") || !strings.Contains(out, "on") || !strings.Contains(out, "nothing was switched") {
		t.Fatalf("good password: exit %d\n%s%s", code, out, errb)
	}
	code, out, errb = runCtl(t, "test", "--config", config(bad), "node-01")
	if code != 1 || !strings.Contains(out, "rejected") {
		t.Fatalf("wrong password: exit %d\n%s%s", code, out, errb)
	}
	if strings.Contains(out+errb, "wrong-password") {
		t.Errorf("the password is printed:\n%s%s", out, errb)
	}
	code, _, errb = runCtl(t, "test", "--config", config(good), "node-1")
	if code != 1 || !strings.Contains(errb, `did you mean "node-01"`) {
		t.Errorf("unknown node: exit %d: %s", code, errb)
	}
	calls, err := bmc.Calls()
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	for _, c := range calls {
		if strings.HasPrefix(c, "set ") {
			t.Errorf("the BMC saw %q: test --config switched power", c)
		}
		if c == "get power" {
			reads++
		}
	}
	if reads == 0 {
		t.Errorf("the BMC saw no status read (calls %q)", calls)
	}
	if on, err := bmc.Power(); err != nil || !on {
		t.Errorf("BMC power on = %v, %v; want still on", on, err)
	}
}
