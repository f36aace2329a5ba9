package fenceconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodefence/nodefence/services/fault"
)

const good = `
drivers:
  ipmi: {endpoint: "127.0.0.1:7101"}
templates:
  bmc: {driver: ipmi, parameters: {lanplus: "1", cipher: "3", username: admin, password: tmpl}}
nodes:
  node-1:
    zone: a
    methods:
      bmc: {template: bmc, parameters: {ip: 127.0.0.1, ipport: "9001", password: secret}}
      bmc2: {driver: ipmi, parameters: {ip: 127.0.0.1, ipport: "9002"}}
    steps:
      power_management: [bmc, bmc2]
`

func TestPlanAppliesTemplateThenOverrides(t *testing.T) {
	c, err := Parse([]byte(good), "good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Plan("node-1", StepPowerManagement)
	if err != nil {
		t.Fatal(err)
	}
	want := []Resolved{
		{Name: "bmc", Driver: "ipmi", Endpoint: "127.0.0.1:7101", Endpoints: []string{"127.0.0.1:7101"}, Identity: "ipmi", Parameters: map[string]string{
			"lanplus": "1", "cipher": "3", "username": "admin", "password": "secret", "ip": "127.0.0.1", "ipport": "9001"}, Action: "off"},
		{Name: "bmc2", Driver: "ipmi", Endpoint: "127.0.0.1:7101", Endpoints: []string{"127.0.0.1:7101"}, Identity: "ipmi", Parameters: map[string]string{"ip": "127.0.0.1", "ipport": "9002"}, Action: "off"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("plan (-want +got):\n%s", d)
	}
	if _, err := c.Plan("nope", StepPowerManagement); !errors.Is(err, fault.ErrNotFound) {
		t.Fatalf("unknown node: %v, want ErrNotFound", err)
	}
}

func TestValidateListsEveryError(t *testing.T) {
	bad := `
drivers:
  ipmi: {endpoint: "nohostport"}
templates:
  t1: {driver: pdu}
nodes:
  Node_1:
    methods:
      m1: {template: missing}
      m2: {}
      m3: {driver: ipmi, parameters: {password_file: /nonexistent/secret}}
    steps:
      power_management: [m1, ghost, m1]
      teleport: [m2]
`
	_, err := Parse([]byte(bad), "bad.yaml")
	var inv fault.Invalid
	if !errors.As(err, &inv) {
		t.Fatalf("err = %v, want fault.Invalid", err)
	}
	var fields []string
	for _, fe := range inv {
		fields = append(fields, fe.Field)
	}
	want := []string{
		"drivers.ipmi.endpoint",
		"nodes.Node_1",
		"nodes.Node_1.methods.m1.template",
		"nodes.Node_1.methods.m2",
		"nodes.Node_1.methods.m3.parameters.password_file",
		"nodes.Node_1.steps.power_management[1]",
		"nodes.Node_1.steps.power_management[2]",
		"nodes.Node_1.steps.teleport",
		"templates.t1.driver",
	}
	if d := cmp.Diff(want, fields); d != "" {
		t.Fatalf("fields (-want +got):\n%s\nerror: %v", d, err)
	}
}

func TestParseRejectsUnknownKeysAndEmpty(t *testing.T) {
	for name, in := range map[string]string{
		"unknown key": "nodez: {}\n",
		"no nodes":    "drivers: {}\n",
		"not yaml":    "nodes: [\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(in), name); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestResolveSecretsReadsFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "pw")
	if err := os.WriteFile(p, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ResolveSecrets(map[string]string{"password_file": p, "ip": "127.0.0.1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]string{"password": "hunter2", "ip": "127.0.0.1"}, got); d != "" {
		t.Fatal(d)
	}
	if _, err := ResolveSecrets(map[string]string{"password_file": filepath.Join(dir, "gone")}, nil); err == nil || !strings.Contains(err.Error(), "password_file") {
		t.Fatalf("missing secret file: err = %v, want one naming password_file", err)
	}
	secrets := func(ns, name, key string) (string, error) {
		if ns == "" && name == "bmc" && key == "password" {
			return "from-secret", nil
		}
		return "", errors.New("no such secret")
	}
	got, err = ResolveSecrets(map[string]string{"password_secret": "bmc/password"}, secrets)
	if err != nil || got["password"] != "from-secret" {
		t.Fatalf("Secret reference: %v, %v", got, err)
	}
	for _, bad := range []string{"bmc", "a/b/c/d", "/key"} {
		if _, err := ResolveSecrets(map[string]string{"password_secret": bad}, secrets); err == nil {
			t.Errorf("password_secret=%q accepted", bad)
		}
	}
	if _, err := ResolveSecrets(map[string]string{"password_secret": "bmc/password"}, nil); err == nil || !strings.Contains(err.Error(), "Kubernetes mode") {
		t.Fatalf("Secret reference without Kubernetes: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("nodes: {a: {steps: {power_management: [x]}}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz")
		if err == nil {
			for _, n := range c.NodeNames() {
				if _, err := c.Plan(n, StepPowerManagement); err != nil {
					t.Fatalf("valid config, Plan(%s): %v", n, err)
				}
			}
		}
	})
}

// The seed's complete two-node example loads into exactly the plan it describes: isolate on the
// Brocade switch, power-cycle on the Eaton PDU (must succeed), reconnect storage on recovery.
func TestSeedTwoNodeExamplePlan(t *testing.T) {
	cms, err := ReadConfigMaps("testdata/seed-complete")
	if err != nil {
		t.Fatal(err)
	}
	c, err := FromConfigMaps(cms, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	brocade := func(plug, action string) Resolved {
		return Resolved{Name: "fc-" + action, Driver: "brocade", Identity: "brocade", Action: action, Parameters: map[string]string{
			"ipaddr": "192.168.1.2", "password": "brocade_password", "username": "brocade_admin", "plug": plug}}
	}
	eaton := func(plug, action string) Resolved {
		return Resolved{Name: "eaton-" + action, Driver: "pdu", Identity: "pdu", Action: action, Required: true, Parameters: map[string]string{
			"ipaddr": "192.168.1.4", "password": "eaton_password", "username": "eaton_admin", "plug": plug,
			"snmp-priv-prot": "AES", "snmp-priv-passwd": "eaton_snmp_passwd", "snmp-sec-level": "authPriv", "inet4-only": "true"}}
	}
	for node, plugs := range map[string][2]string{"host0": {"1", "1"}, "host1": {"2", "2"}} {
		want := map[string][]Resolved{
			StepIsolation:       {brocade(plugs[0], "off")},
			StepPowerManagement: {eaton(plugs[1], "off"), eaton(plugs[1], "on")},
			StepRecovery:        {brocade(plugs[0], "on")},
		}
		for step, w := range want {
			got, err := c.Plan(node, step)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(w, got); d != "" {
				t.Errorf("%s %s (-want +got):\n%s", node, step, d)
			}
		}
	}
}

// The seed's examples verbatim: every gap is reported, named by ConfigMap and key, all at once.
func TestSeedVerbatimExamplesReportEveryGap(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"testdata/seed/general.yaml", []string{
			"testdata/seed/general.yaml: ConfigMap fence-config-host1 config.properties isolation: method \"fc-off\": no ConfigMap fence-method-fc-off-host1",
			"testdata/seed/general.yaml: ConfigMap fence-config-host1 config.properties power_management: method \"eaton-off\": no ConfigMap fence-method-eaton-off-host1",
			"testdata/seed/general.yaml: ConfigMap fence-config-host1 config.properties power_management: method \"eaton-on\": no ConfigMap fence-method-eaton-on-host1",
			"testdata/seed/general.yaml: ConfigMap fence-config-host1 config.properties recovery: method \"fc-on\": no ConfigMap fence-method-fc-on-host1",
		}},
		{"testdata/seed/two-node.yaml", []string{
			"testdata/seed/two-node.yaml: ConfigMap fence-config-host1 config.properties isolation: method \"fc-off\": no ConfigMap fence-method-fc-off-host",
			"testdata/seed/two-node.yaml: ConfigMap fence-config-host1 config.properties recovery: method \"fc-on\": no ConfigMap fence-method-fc-on-host",
			"testdata/seed/two-node.yaml: ConfigMap fence-config-lago-kube-host0 config.properties isolation: method \"fc-off\": no ConfigMap fence-method-fc-off-lago-kube-host0",
			"testdata/seed/two-node.yaml: ConfigMap fence-config-lago-kube-host0 config.properties power_management: method \"eaton-off\": no ConfigMap fence-method-eaton-off-lago-kube-host0",
			"testdata/seed/two-node.yaml: ConfigMap fence-config-lago-kube-host0 config.properties power_management: method \"eaton-on\": no ConfigMap fence-method-eaton-on-lago-kube-host0",
			"testdata/seed/two-node.yaml: ConfigMap fence-config-lago-kube-host0 config.properties recovery: method \"fc-on\": no ConfigMap fence-method-fc-on-lago-kube-host0",
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cms, err := ReadConfigMaps(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			_, err = FromConfigMaps(cms, nil)
			var inv fault.Invalid
			if !errors.As(err, &inv) {
				t.Fatalf("err = %v, want fault.Invalid", err)
			}
			var got []string
			for _, fe := range inv {
				got = append(got, fe.Error())
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("errors (-want +got):\n%s", d)
			}
		})
	}
}

func TestParsePropertiesRejectsMalformedLines(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a=1\nb", `line 2: "b" is not key=value`},
		{"=1", "line 1: empty key"},
		{"a=1\na=2", "line 2: a given twice"},
	} {
		if _, err := ParseProperties(strings.NewReader(tc.in)); err == nil || err.Error() != tc.want {
			t.Errorf("ParseProperties(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
	got, err := ParseProperties(strings.NewReader("# comment\n\n key = value with spaces \n!also comment\nx=a=b"))
	if err != nil || got["key"] != "value with spaces" || got["x"] != "a=b" || len(got) != 2 {
		t.Fatalf("ParseProperties = %v, %v", got, err)
	}
}

func FuzzFromConfigMaps(f *testing.F) {
	seed, _ := os.ReadFile("testdata/seed-complete/two-node.yaml")
	f.Add(seed)
	f.Add([]byte("- kind: ConfigMap\n  metadata: {name: fence-config-a}\n  data: {config.properties: \"isolation=x\"}\n"))
	f.Add([]byte("- kind: ConfigMap\n  metadata: {name: fence-host-map-bmc}\n  data: {host-map.properties: \"agent_name=fence_ipmilan\\nsteps=power_management\\nip=a:1;b:2\"}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cms, err := parseConfigMaps(data, "fuzz")
		if err != nil {
			return
		}
		if c, err := FromConfigMaps(cms, nil); err == nil {
			_ = c.Validate()
		}
	})
}

// Every file of the wrong shape is refused with what it is and what was expected, never with the
// decoder's bare complaint about the first field it met.
func TestWrongShapeSaysWhatItIsAndWhatWasExpected(t *testing.T) {
	seedConfigMaps := "# the seed's format\n---\nkind: ConfigMap\napiVersion: v1\nmetadata: {name: fence-config-host0}\ndata: {config.properties: node_name=host0}\n"
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"ConfigMaps", seedConfigMaps, []string{"1 Kubernetes object(s) (ConfigMap fence-config-host0)", "expected the standalone", "Kubernetes mode (--kubeconfig)"}},
		{"other object", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n", []string{"(Kustomization)", "expected the standalone"}},
		{"list", "- kind: ConfigMap\n- kind: ConfigMap\n", []string{"YAML list of 2 items", "expected the standalone"}},
		{"empty", "# nothing here\n", []string{"empty (or only comments)", "expected the standalone"}},
		{"two documents", "nodes: {}\n---\ndrivers: {}\n", []string{"2 YAML documents", "expected the standalone"}},
		{"scalar", "hello\n", []string{"single value", "expected the standalone"}},
		{"unknown key", "nodez: {}\n", []string{"not a valid standalone fence configuration", `unknown field "nodez"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), "f.yaml")
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
}

// LoadAny (fencectl config check) names what it found when a path holds no fence configuration.
func TestLoadAnyWrongShape(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"plain mapping", "foo: bar\n", []string{"neither a Kubernetes object", "expected fence ConfigMaps"}},
		{"only Secrets", "kind: Secret\napiVersion: v1\nmetadata: {name: creds}\n", []string{"no fence configuration found", "found Secret creds"}},
		{"empty", "", []string{"found nothing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(p, []byte(tc.in), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadAny(p, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
}

// The README's own example: the examples directory (a kustomization, Secret templates, and the
// seed's ConfigMaps behind a comment-only first document) checks clean.
func TestDeployExamplesCheck(t *testing.T) {
	c, err := LoadAny("../../deploy/examples", nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"host0", "host1"}, c.NodeNames()); d != "" {
		t.Errorf("nodes (-want +got):\n%s", d)
	}
}
