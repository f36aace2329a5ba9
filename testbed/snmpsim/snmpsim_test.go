package snmpsim

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// netsnmp runs a net-snmp command (snmpget, snmpset) against the simulator: an independent
// client, so the simulator is proved faithful without the code under test.
func netsnmp(t *testing.T, tool string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, append([]string{"-m", "", "-On", "-Oqv", "-t", "1", "-r", "0"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return strings.TrimSpace(string(out) + stderr.String()), err
	}
	return strings.TrimSpace(string(out)), nil
}

func TestSimWithNetSNMP(t *testing.T) {
	s, err := Start(Config{Outlets: 4})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	for _, p := range Profiles {
		got, err := netsnmp(t, "snmpget", "-v2c", "-c", CommunityRO, s.Addr(p), "1.3.6.1.2.1.1.2.0")
		if err != nil || got != "."+ObjectIDs[p] {
			t.Errorf("%s sysObjectID = %q, %v; want .%s", p, got, err, ObjectIDs[p])
		}
	}

	const status, control = "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.2", "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.2"
	v3 := map[string][]string{
		"v1":         {"-v1", "-c", CommunityRW},
		"authPriv":   {"-v3", "-l", "authPriv", "-u", UserAuthPriv, "-a", "SHA", "-A", AuthPass, "-x", "AES", "-X", PrivPass},
		"sha256":     {"-v3", "-l", "authPriv", "-u", UserAuthPriv256, "-a", "SHA-256", "-A", AuthPass, "-x", "AES-256", "-X", PrivPass},
		"authNoPriv": {"-v3", "-l", "authNoPriv", "-u", UserAuthNoPriv, "-a", "SHA", "-A", AuthPass},
		"noAuth":     {"-v3", "-l", "noAuthNoPriv", "-u", UserNoAuth},
	}
	for name, cred := range v3 {
		for _, want := range []struct{ set, read string }{{"2", "2"}, {"1", "1"}} {
			if out, err := netsnmp(t, "snmpset", append(cred, s.Addr(APCRPDU), control, "i", want.set)...); err != nil {
				t.Fatalf("%s: snmpset: %v: %s", name, err, out)
			}
			if got, err := netsnmp(t, "snmpget", append(cred, s.Addr(APCRPDU), status)...); err != nil || got != want.read {
				t.Errorf("%s: status after set %s = %q, %v", name, want.set, got, err)
			}
		}
	}

	// The state file follows, and a hook is obeyed.
	if _, err := netsnmp(t, "snmpset", "-v2c", "-c", CommunityRW, s.Addr(APCRPDU), control, "i", "2"); err != nil {
		t.Fatal(err)
	}
	if on, err := s.On(APCRPDU, 2); err != nil || on {
		t.Errorf("On after off = %v, %v", on, err)
	}
	if err := s.SetOutlet(APCRPDU, 2, Outlet{State: "off", Stuck: true}); err != nil {
		t.Fatal(err)
	}
	if out, err := netsnmp(t, "snmpset", "-v2c", "-c", CommunityRW, s.Addr(APCRPDU), control, "i", "1"); err != nil {
		t.Fatalf("stuck set: %v %s", err, out)
	}
	if got, _ := netsnmp(t, "snmpget", "-v2c", "-c", CommunityRW, s.Addr(APCRPDU), status); got != "2" {
		t.Errorf("stuck outlet turned %q", got)
	}
	if out, err := netsnmp(t, "snmpset", "-v2c", "-c", CommunityRO, s.Addr(APCRPDU), control, "i", "1"); err == nil {
		t.Errorf("SET with the read-only community succeeded: %s", out)
	}
	if err := s.SetOutlet(APCRPDU, 3, Outlet{Flap: true}); err != nil {
		t.Fatal(err)
	}
	var reads []string
	for range 4 {
		got, _ := netsnmp(t, "snmpget", "-v2c", "-c", CommunityRW, s.Addr(APCRPDU), "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.3")
		reads = append(reads, got)
	}
	if strings.Join(reads, ",") != "1,2,1,2" {
		t.Errorf("flapping reads = %v", reads)
	}
}
