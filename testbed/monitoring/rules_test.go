package monitoring

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nodefence/nodefence/testbed/gomod"
)

// PromtoolVersion is the Prometheus module whose promtool evaluates the alert rules. The tool
// module testbed/tools/promtool must require exactly this version; the binary is cached by it.
const PromtoolVersion = "v0.316.0"

// promtoolEnv overrides where the promtool binary is cached.
const promtoolEnv = "NODEFENCE_PROMTOOL"

// promtool returns the path of the pinned promtool, building it into the cache the first time
// (a few minutes cold; instant afterwards), like the Kubernetes test binaries in ~/.cache/nodefence.
func promtool(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(promtoolEnv)
	if bin == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no cache directory for promtool (set %s): %v", promtoolEnv, err)
		}
		bin = filepath.Join(base, "nodefence", "promtool-"+PromtoolVersion, "promtool")
	}
	if st, err := os.Stat(bin); err == nil && st.Mode()&0o111 != 0 {
		return bin
	}
	dir := "../tools/promtool"
	if err := gomod.Requires(filepath.Join(dir, "go.mod"), "github.com/prometheus/prometheus", PromtoolVersion); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("building promtool %s into %s (once)", PromtoolVersion, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	tmp := fmt.Sprintf("%s.tmp.%d", bin, os.Getpid())
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp, "github.com/prometheus/prometheus/cmd/promtool")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		t.Fatalf("building promtool: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

type ruleFile struct {
	Groups []struct {
		Name  string           `json:"name"`
		Rules []map[string]any `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "nodefence-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

// alertNames lists the alerts of the rule file in order.
func alertNames(rf ruleFile) []string {
	var out []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if a, ok := r["alert"].(string); ok {
				out = append(out, a)
			}
		}
	}
	return out
}

// runRuleTests runs promtool's rule unit tests of testdata/alerts_test.yaml on rf without its
// annotations, and returns promtool's output and error.
func runRuleTests(t *testing.T, rf ruleFile) (string, error) {
	t.Helper()
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			delete(r, "annotations")
		}
	}
	b, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	tests, err := os.ReadFile("testdata/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(work, "rules.yaml"), string(b))
	write(t, filepath.Join(work, "alerts_test.yaml"), string(tests))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), "test", "rules", "alerts_test.yaml")
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAlertRulesFire evaluates every alert rule of deploy/monitoring with promtool's rule unit
// tests against recorded series (testdata/alerts_test.yaml): each alert has a case where it must
// fire, with its labels, and one where it must not.
func TestAlertRulesFire(t *testing.T) {
	rf := readRules(t)
	b, err := os.ReadFile("testdata/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var unit struct {
		Tests []struct {
			Name  string `json:"name"`
			Cases []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &unit); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tg := range unit.Tests {
		for _, c := range tg.Cases {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname] = true
			} else {
				quiet[c.Alertname] = true
			}
		}
	}
	names := alertNames(rf)
	for _, a := range names {
		if !fires[a] || !quiet[a] {
			t.Errorf("alert %s: testdata/alerts_test.yaml needs a case where it fires (%v) and one where it does not (%v)", a, fires[a], quiet[a])
		}
	}
	for a := range fires {
		if !slices.Contains(names, a) {
			t.Errorf("testdata/alerts_test.yaml tests %s, which is not an alert of nodefence-rules.yaml", a)
		}
	}
	if out, err := runRuleTests(t, rf); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// TestAlertRuleTestsCatchAWrongRule proves the test above can fail: the agent-down alert judged
// from the agent's own metric (which a dead host never reports) does not fire when it should.
func TestAlertRuleTestsCatchAWrongRule(t *testing.T) {
	rf := readRules(t)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r["alert"] == "NodefenceAgentDown" {
				r["expr"] = "nodefence_agent_stream_connected == 0"
			}
		}
	}
	out, err := runRuleTests(t, rf)
	if err == nil || !strings.Contains(out, "NodefenceAgentDown") {
		t.Fatalf("promtool accepted an agent-down rule that never fires for a dead host: %v\n%s", err, out)
	}
}

// Every alert links its runbook section (runbook_url), docs/runbooks.md has that section, and the
// deploy guide links the runbooks.
func TestEveryAlertHasARunbook(t *testing.T) {
	b, err := os.ReadFile("../../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)\s*$`).FindAllStringSubmatch(string(b), -1) {
		sections[m[1]] = true
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			a, _ := r["alert"].(string)
			if a == "" {
				continue
			}
			ann, _ := r["annotations"].(map[string]any)
			want := "https://github.com/nodefence/nodefence/blob/main/docs/runbooks.md#" + strings.ToLower(a)
			if ann["runbook_url"] != want {
				t.Errorf("alert %s: runbook_url %v, want %s", a, ann["runbook_url"], want)
			}
			if !sections[a] {
				t.Errorf("alert %s: docs/runbooks.md has no section \"## %s\"", a, a)
			}
		}
	}
	readme, err := os.ReadFile("../../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "../docs/runbooks.md") {
		t.Error("deploy/README.md does not link ../docs/runbooks.md")
	}
}

// The dashboard has zone and node selectors, and the per-node and per-zone panels use them.
func TestDashboardHasNodeAndZoneSelectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(dir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name, Type, Definition string
				IncludeAll             bool `json:"includeAll"`
			}
		}
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type == "query" && v.IncludeAll {
			vars[v.Name] = v.Definition
		}
	}
	if !strings.Contains(vars["zone"], "zone") || !strings.Contains(vars["node"], "node") {
		t.Fatalf("dashboard selectors: %v, want query variables zone and node with All", vars)
	}
	uses := map[string]int{}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			for _, v := range []string{"zone", "node"} {
				if strings.Contains(q.Expr, `=~"$`+v+`"`) {
					uses[v]++
				}
			}
		}
	}
	if uses["zone"] < 3 || uses["node"] < 3 {
		t.Errorf("panels using the selectors: %v, want the zone and node panels to use them", uses)
	}
}
