// Package monitoring tests deploy/monitoring: the alert rules and the dashboard parse with
// Prometheus' own parser, the Prometheus Operator copy of the rules matches the plain file, and
// every metric they use is exported by a real coordinator, fence driver or node agent.
package monitoring

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/procs"
	"github.com/nodefence/nodefence/testbed/promscrape"
)

const dir = "../../deploy/monitoring"

// promcheck runs testbed/tools/promcheck (Prometheus' rulefmt and PromQL parser, in a module of
// its own) on rule files and returns the metric names each one uses.
func promcheck(t *testing.T, files ...string) map[string][]string {
	t.Helper()
	var abs []string
	for _, f := range files {
		a, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		abs = append(abs, a)
	}
	cmd := exec.Command("go", append([]string{"run", "."}, abs...)...)
	cmd.Dir = "../tools/promcheck"
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("promcheck: %v\n%s", err, stderr.String())
	}
	var names map[string][]string
	if err := json.Unmarshal(out, &names); err != nil {
		t.Fatalf("promcheck output %q: %v", out, err)
	}
	return names
}

type dashboard struct {
	UID, Title    string
	SchemaVersion int `json:"schemaVersion"`
	Panels        []struct {
		ID      int
		Type    string
		Title   string
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string
		}
	}
}

// dashboardExprs checks the dashboard's structure and returns its queries as a rule file (one
// recording rule per query) for promcheck.
func dashboardExprs(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 || len(d.Panels) == 0 {
		t.Errorf("dashboard needs uid, title, a current schemaVersion and panels: %q %q %d %d", d.UID, d.Title, d.SchemaVersion, len(d.Panels))
	}
	ids := map[int]bool{}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for _, p := range d.Panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("%s: id missing or repeated", where)
		}
		ids[p.ID] = true
		if !slices.Contains([]string{"stat", "timeseries", "table", "gauge", "bargauge"}, p.Type) || p.Title == "" {
			t.Errorf("%s: type %q, want a known panel type and a title", where, p.Type)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", where, g)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.RefID == "" || refs[q.RefID] || q.Expr == "" {
				t.Errorf("%s: query %q: refId missing or repeated, or no expr", where, q.RefID)
			}
			refs[q.RefID] = true
			e, _ := json.Marshal(q.Expr)
			fmt.Fprintf(&rules, "      - record: panel_%d_%s\n        expr: %s\n", p.ID, q.RefID, e)
		}
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPrometheusRuleMatchesRuleFile: the Prometheus Operator resource holds the same groups.
func TestPrometheusRuleMatchesRuleFile(t *testing.T) {
	var plain, op struct {
		Groups []any `json:"groups"`
		Spec   struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	for f, v := range map[string]any{"nodefence-rules.yaml": &plain, "prometheusrule.yaml": &op} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if len(plain.Groups) == 0 {
		t.Fatal("nodefence-rules.yaml has no groups")
	}
	if d := cmp.Diff(plain.Groups, op.Spec.Groups); d != "" {
		t.Errorf("prometheusrule.yaml spec.groups differ from nodefence-rules.yaml (-file +resource):\n%s", d)
	}
}

// TestPromcheckRefusesBrokenRules proves the check below can fail.
func TestPromcheckRefusesBrokenRules(t *testing.T) {
	f := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(f, []byte("groups:\n  - name: x\n    rules:\n      - alert: A\n        expr: sum(rate(x[5m]) by\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", ".", f)
	cmd.Dir = "../tools/promcheck"
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("promcheck accepted a broken expression: %s", out)
	}
}

// TestRulesAndDashboardUseRealMetrics runs a coordinator (embedded etcd), an IPMI fence driver
// and a node agent, makes them produce their metrics (an agent connects in a zone; an operator
// fences a node whose BMC does not answer; the device is checked), scrapes their /metrics, and
// checks every metric the alert rules and the dashboard use is there.
func TestRulesAndDashboardUseRealMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	rulesFile := filepath.Join(dir, "nodefence-rules.yaml")
	used := promcheck(t, rulesFile, dashboardExprs(t))
	bin := build(t, "coordinator", "fence-driver", "node-agent")
	work := t.TempDir()
	port := func() string {
		p, err := procs.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("127.0.0.1:%d", p)
	}
	coordAddr, coordMetrics, driverAddr, driverMetrics, agentMetrics := port(), port(), port(), port(), port()
	// A BMC that never answers: a free UDP port nothing listens on.
	bmc := strings.Split(port(), ":")[1]
	pw := filepath.Join(work, "bmc-password")
	write(t, pw, "secret\n")
	fenceYAML := filepath.Join(work, "fence.yaml")
	write(t, fenceYAML, fmt.Sprintf(`drivers:
  ipmi: {endpoint: "%s"}
nodes:
  n1:
    methods:
      bmc: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: "%s", username: admin, password_file: %s, lanplus: "1"}}
    steps:
      power_management: [bmc]
`, driverAddr, bmc, pw))
	ca, err := certs.NewCA("monitoring test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(work, "ca.crt")
	write(t, caFile, string(ca.CertPEM))
	tlsFlags := map[string][]string{}
	files := map[string]tlsfiles.Files{}
	for _, id := range []string{"coordinator/c1", "driver/ipmi", "agent/n1", "operator/admin", "monitoring/prometheus"} {
		ident, err := identity.Parse("spiffe://" + identity.TrustDomain + "/" + id)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := ca.Issue(ident, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, k, err := pair.Write(filepath.Join(work, "tls"), strings.ReplaceAll(id, "/", "-"))
		if err != nil {
			t.Fatal(err)
		}
		files[id] = tlsfiles.Files{CertFile: c, KeyFile: k, CAFile: caFile}
		tlsFlags[id] = []string{"--tls-cert", c, "--tls-key", k, "--tls-ca", caFile}
	}
	coordTLS := files["coordinator/c1"]
	start(t, work, bin, "fence-driver", append([]string{"--driver", "ipmi", "--listen", driverAddr,
		"--metrics-listen", driverMetrics, "--state-dir", filepath.Join(work, "driver"), "--default-timeout", "2s", "--metrics-tls"}, tlsFlags["driver/ipmi"]...)...)
	start(t, work, bin, "coordinator", append([]string{"--listen", coordAddr, "--advertise", coordAddr,
		"--driver-tls-cert", coordTLS.CertFile, "--driver-tls-key", coordTLS.KeyFile, "--driver-tls-ca", caFile,
		"--metrics-listen", coordMetrics, "--data-dir", filepath.Join(work, "coord"),
		"--etcd-client-listen", port(), "--etcd-peer-listen", port(), "--kdump-listen", port(),
		"--config", fenceYAML, "--fence-op-timeout", "2s", "--fence-retries", "0", "--auto-fence=false", "--device-check-interval", "1s", "--metrics-tls"}, tlsFlags["coordinator/c1"]...)...)
	start(t, work, bin, "node-agent", append([]string{"--coordinator", coordAddr, "--node-name", "n1",
		"--zone", "z1", "--region", "r1", "--metrics-listen", agentMetrics, "--manage-inhibit-delay=false", "--metrics-tls"}, tlsFlags["agent/n1"]...)...)
	// Every /metrics is served over mutual TLS (--metrics-tls), as deploy/monitoring scrapes it:
	// Prometheus presents a monitoring certificate.
	scrapeAs := func(who string) *tls.Config {
		cfg, err := files[who].Client()
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	prometheus := scrapeAs("monitoring/prometheus")

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	coord, err := dial.New(coordAddr, files["operator/admin"])
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	cluster := coordv1.NewClusterServiceClient(coord)
	poll(ctx, t, "agent n1 connected", func() bool {
		r, err := cluster.GetNode(ctx, &coordv1.GetNodeRequest{Node: "n1"})
		return err == nil && r.GetNode().GetConnected()
	})
	fences := coordv1.NewFenceServiceClient(coord)
	fr, err := fences.Fence(ctx, &coordv1.FenceRequest{Node: "n1", Reason: "monitoring test"})
	if err != nil {
		t.Fatalf("Fence: %v", err)
	}
	poll(ctx, t, "the fence to fail its driver call", func() bool {
		r, err := fences.GetFence(ctx, &coordv1.GetFenceRequest{Id: fr.GetFence().GetId()})
		if err != nil {
			return false
		}
		for _, op := range r.GetFence().GetOperations() {
			if op.GetResult() == coordv1.OperationResult_OPERATION_RESULT_FAILED {
				return true
			}
		}
		return false
	})
	// Drivers answer the coordinator only: check the device with its certificate.
	drv, err := dial.New(driverAddr, coordTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	target := &driverv1.Target{Name: "n1", Parameters: map[string]string{"ip": "127.0.0.1", "ipport": bmc, "username": "admin", "password": "secret", "lanplus": "1"}}
	if _, err := driverv1.NewFenceDriverServiceClient(drv).Monitor(ctx, &driverv1.MonitorRequest{Target: target}); err != nil {
		t.Fatalf("Monitor: %v", err)
	}

	poll(ctx, t, "the leader's first device check", func() bool {
		s, err := promscrape.GetTLS("https://"+coordMetrics+"/metrics", prometheus)
		_, ok := s[`nodefence_fence_device_check_ok{driver="ipmi",method="bmc",node="n1"}`]
		return err == nil && ok
	})
	exported := map[string]bool{}
	scrapes := map[string]promscrape.Scrape{}
	for name, addr := range map[string]string{"coordinator": coordMetrics, "driver": driverMetrics, "agent": agentMetrics} {
		s, err := promscrape.GetTLS("https://"+addr+"/metrics", prometheus)
		if err != nil {
			t.Fatalf("scrape %s: %v", name, err)
		}
		// Only identities the policy allows read it: not an agent, not a caller without a
		// certificate, not a plaintext request.
		if _, err := promscrape.GetTLS("https://"+addr+"/metrics", scrapeAs("agent/n1")); err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("scrape %s with an agent's certificate: %v, want 403 Forbidden", name, err)
		}
		anon := scrapeAs("agent/n1").Clone()
		anon.Certificates = nil
		if _, err := promscrape.GetTLS("https://"+addr+"/metrics", anon); err == nil {
			t.Errorf("scrape %s without a client certificate: answered", name)
		}
		if _, err := promscrape.Get("http://" + addr + "/metrics"); err == nil {
			t.Errorf("scrape %s in plaintext: answered", name)
		}
		scrapes[name] = s
		for series := range s {
			n, _, _ := strings.Cut(series, "{")
			exported[n] = true
		}
	}
	for file, names := range used {
		for _, n := range names {
			if strings.HasPrefix(n, "record:") {
				continue
			}
			if !exported[n] {
				t.Errorf("%s uses %s, which no nodefence binary exports", filepath.Base(file), n)
			}
		}
	}
	// The values behind the alerts are the real ones.
	want := map[string]map[string]float64{
		"coordinator": {
			"nodefence_leader": 1,
			`nodefence_fences_started_total{action="off",trigger="manual"}`:    1,
			`nodefence_fences_started_total{action="off",trigger="automatic"}`: 0,
			`nodefence_fence_skips_total{kind="budget"}`:                       0,
		},
		"agent": {"nodefence_agent_stream_connected": 1},
	}
	for who, series := range want {
		for k, v := range series {
			if got, ok := scrapes[who][k]; !ok || got != v {
				t.Errorf("%s %s = %v (present %v), want %v", who, k, got, ok, v)
			}
		}
	}
	if scrapes["coordinator"]["nodefence_leader_epoch"] <= 0 {
		t.Errorf("nodefence_leader_epoch = %v, want the leader's epoch", scrapes["coordinator"]["nodefence_leader_epoch"])
	}
	var devUp, offFailed bool
	for k, v := range scrapes["driver"] {
		if strings.HasPrefix(k, "nodefence_driver_device_up{") && strings.Contains(k, bmc) && v == 0 {
			devUp = true
		}
		if strings.HasPrefix(k, "nodefence_driver_operations_total{") && strings.Contains(k, `action="off"`) && !strings.Contains(k, `code="OK"`) && v >= 1 {
			offFailed = true
		}
	}
	if !devUp || !offFailed {
		t.Errorf("driver metrics: device down recorded %v, failed power-off recorded %v; scrape:\n%v", devUp, offFailed, scrapes["driver"])
	}
}

func build(t *testing.T, names ...string) string {
	t.Helper()
	out := t.TempDir()
	pkgs := map[string]string{
		"coordinator":  "../../coordinator/cmd/coordinator",
		"fence-driver": "../../fence-drivers/cmd/fence-driver",
		"node-agent":   "../../node-agent/cmd/node-agent",
	}
	for _, n := range names {
		if b, err := exec.Command("go", "build", "-o", filepath.Join(out, n), pkgs[n]).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", n, err, b)
		}
	}
	return out
}

func start(t *testing.T, work, bin, name string, args ...string) {
	t.Helper()
	p, err := procs.Start(name, filepath.Join(work, name+".log"), filepath.Join(bin, name), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			t.Logf("%s log:\n%s", name, b)
		}
	})
}

func poll(ctx context.Context, t *testing.T, what string, ok func() bool) {
	t.Helper()
	for ctx.Err() == nil {
		if ok() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
