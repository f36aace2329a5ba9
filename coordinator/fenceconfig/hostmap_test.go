package fenceconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodefence/nodefence/services/fault"
)

const longhand = `
drivers:
  ipmi: {endpoints: ["10.0.0.1:7101", "10.0.0.2:7101", "10.0.0.3:7101"]}
  pdu: {endpoint: "10.0.0.1:7102"}
templates:
  bmc: {driver: ipmi, parameters: {lanplus: "1", cipher: "3", username: admin, password: pw}}
  apc: {driver: pdu, parameters: {ip: 10.0.1.1, username: apc, password: pw}}
nodes:
  node-01:
    zone: a
    methods:
      bmc: {template: bmc, parameters: {ip: 10.0.0.11, ipport: "623"}}
      outlet: {template: apc, must_success: true, parameters: {plug: "1"}}
    steps:
      power_management: [bmc, outlet]
      recovery: [outlet]
  node-02:
    methods:
      bmc: {template: bmc, parameters: {ip: 10.0.0.12, ipport: "624"}}
      outlet: {template: apc, must_success: true, parameters: {plug: "2"}}
    steps:
      power_management: [bmc, outlet]
      recovery: [outlet]
`

const compact = `
drivers:
  ipmi: {endpoints: ["10.0.0.1:7101", "10.0.0.2:7101", "10.0.0.3:7101"]}
  pdu: {endpoint: "10.0.0.1:7102"}
templates:
  bmc: {driver: ipmi, parameters: {lanplus: "1", cipher: "3", username: admin, password: pw}}
  apc: {driver: pdu, parameters: {ip: 10.0.1.1, username: apc, password: pw}}
nodes:
  node-01: {zone: a}
host_maps:
  - template: bmc
    parameters:
      ip: "node-01:10.0.0.11;node-02:10.0.0.12"
      ipport: {node-01: 623, node-02: "624"}
  - method: outlet
    template: apc
    must_success: true
    steps: [power_management, recovery]
    parameters:
      plug: "node-01=1 node-02=2"
`

// The compact form expands to exactly the configuration the long form spells out.
func TestHostMapsExpandToTheLongForm(t *testing.T) {
	want, err := Parse([]byte(longhand), "longhand.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse([]byte(compact), "compact.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Config{})); d != "" {
		t.Errorf("compact form (-longhand +compact):\n%s", d)
	}
	if i, ok := got.FromHostMap("node-02", "outlet"); !ok || i != 1 {
		t.Errorf("FromHostMap(node-02, outlet) = %d, %v; want 1", i, ok)
	}
	if _, ok := got.FromHostMap("node-01", "nothing"); ok {
		t.Error("FromHostMap of an unknown method")
	}
}

// The ConfigMap form's fence-host-map-<method> expands to the same nodes as the seed's
// fence-config-<node> and fence-method-<method>-<node> ConfigMaps written out.
func TestConfigMapHostMapExpandsToTheLongForm(t *testing.T) {
	const tmpl = "- kind: ConfigMap\n  metadata: {name: fence-method-template-bmc}\n  data: {template.properties: \"agent_name=fence_ipmilan\\nusername=admin\\npassword=pw\\nlanplus=1\"}\n"
	long := tmpl +
		"- kind: ConfigMap\n  metadata: {name: fence-config-node-01}\n  data: {config.properties: \"power_management=bmc\\nrecovery=bmc\"}\n" +
		"- kind: ConfigMap\n  metadata: {name: fence-method-bmc-node-01}\n  data: {method.properties: \"template=fence-method-template-bmc\\nip=10.0.0.11\"}\n" +
		"- kind: ConfigMap\n  metadata: {name: fence-config-node-02}\n  data: {config.properties: \"power_management=bmc\\nrecovery=bmc\"}\n" +
		"- kind: ConfigMap\n  metadata: {name: fence-method-bmc-node-02}\n  data: {method.properties: \"template=fence-method-template-bmc\\nip=10.0.0.12\"}\n"
	short := tmpl +
		"- kind: ConfigMap\n  metadata: {name: fence-host-map-bmc}\n  data: {host-map.properties: \"template=fence-method-template-bmc\\nsteps=power_management recovery\\nip=node-01:10.0.0.11;node-02:10.0.0.12\"}\n"
	load := func(src string) *Config {
		t.Helper()
		cms, err := parseConfigMaps([]byte(src), "test")
		if err != nil {
			t.Fatal(err)
		}
		c, err := FromConfigMaps(cms, map[string]Driver{"ipmi": {Endpoint: "127.0.0.1:7101"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	want, got := load(long), load(short)
	// The long form's methods carry no parameters of their own beyond ip; the same holds here.
	if d := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Config{})); d != "" {
		t.Errorf("fence-host-map (-long +short):\n%s", d)
	}
}

// Bad host maps are refused with every problem, each naming its field.
func TestHostMapProblemsNameTheField(t *testing.T) {
	head := "drivers: {ipmi: {endpoint: \"127.0.0.1:1\"}}\ntemplates: {bmc: {driver: ipmi}}\n"
	for _, tc := range []struct{ name, in, field, problem string }{
		{"no method", "host_maps: [{parameters: {ip: \"a:1\"}}]", "host_maps[0].method", "required"},
		{"no parameters", "host_maps: [{template: bmc}]", "host_maps[0].parameters", "required"},
		{"bad entry", "host_maps: [{template: bmc, parameters: {ip: \"node-01 10.0.0.1\"}}]", "host_maps[0].parameters.ip", "want node:value"},
		{"node twice", "host_maps: [{template: bmc, parameters: {ip: \"a:1;b:2;a:3\"}}]", "host_maps[0].parameters.ip", "node a given twice (entries 1 and 3)"},
		{"bad node", "host_maps: [{template: bmc, parameters: {ip: \"Node_1:1\"}}]", "host_maps[0].parameters.ip", "not a node name"},
		{"missing value", "host_maps: [{template: bmc, parameters: {ip: \"a:1;b:2\", ipport: \"a:623\"}}]", "host_maps[0].parameters.ipport", "node b has ip but no ipport"},
		{"unknown step", "host_maps: [{template: bmc, steps: [power], parameters: {ip: \"a:1\"}}]", "host_maps[0].steps[0]", "unknown step"},
		{"method twice", "nodes: {a: {methods: {bmc: {template: bmc}}, steps: {power_management: [bmc]}}}\nhost_maps: [{template: bmc, parameters: {ip: \"a:1\"}}]", "host_maps[0].method", "node a already has a method bmc"},
		{"empty", "host_maps: [{template: bmc, parameters: {ip: \";;\"}}]", "host_maps[0].parameters.ip", "empty"},
		{"mapping value", "host_maps: [{template: bmc, parameters: {ip: {a: \"\"}}}]", "host_maps[0].parameters.ip", "node a: empty value"},
		{"list", "host_maps: [{template: bmc, parameters: {ip: [a, b]}}]", "host_maps[0].parameters.ip", `want "node:value;node:value" or a mapping`},
		{"nested", "host_maps: [{template: bmc, parameters: {ip: {a: [1]}}}]", "host_maps[0].parameters.ip", "node a: want a single value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(head+tc.in), "test.yaml")
			var inv fault.Invalid
			if !errors.As(err, &inv) {
				t.Fatalf("err = %v, want fault.Invalid", err)
			}
			for _, fe := range inv {
				if fe.Field == tc.field && strings.Contains(fe.Problem, tc.problem) {
					return
				}
			}
			t.Errorf("no problem %q at %s in %v", tc.problem, tc.field, err)
		})
	}
}

func TestParseHostMap(t *testing.T) {
	got, problems := ParseHostMap(" node-01:10.0.0.11;node-02=fe80::1\n node-03:plug3 ;")
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	want := map[string]string{"node-01": "10.0.0.11", "node-02": "fe80::1", "node-03": "plug3"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if _, problems := ParseHostMap(strings.Repeat("a:1;", maxHostMapEntries+1)); len(problems) != 1 || !strings.Contains(problems[0], "at most") {
		t.Errorf("too many entries: %v", problems)
	}
	if _, problems := ParseHostMap("a:" + strings.Repeat("x", maxHostMapValue+1)); len(problems) != 1 || !strings.Contains(problems[0], "longer than") {
		t.Errorf("long value: %v", problems)
	}
}

func FuzzParseHostMap(f *testing.F) {
	f.Add("node-01:10.0.0.11;node-02:10.0.0.12")
	f.Add("a=1 b=2\nc:3")
	f.Add(";;a:;:b")
	f.Fuzz(func(t *testing.T, s string) {
		m, problems := ParseHostMap(s)
		if len(problems) == 0 && len(m) == 0 {
			t.Fatalf("%q: no problem and no entry", s)
		}
		for node, v := range m {
			if hostEntryProblem(node, v) != "" || !strings.Contains(s, node) || !strings.Contains(s, v) {
				t.Fatalf("%q: accepted %q=%q", s, node, v)
			}
		}
	})
}

// A compact configuration of any shape expands and validates without a panic; whatever it accepts
// plans every node.
func FuzzParseHostMaps(f *testing.F) {
	f.Add([]byte(compact))
	f.Add([]byte("drivers: {d: {endpoints: [\"a:1\", \"a:1\"]}}\nhost_maps: [{driver: d, parameters: {ip: \"x:1\"}}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseWith(data, "fuzz", Checks{SecretFiles: SecretFilesSkip})
		if err != nil {
			return
		}
		for _, n := range c.NodeNames() {
			ms, err := c.Plan(n, StepPowerManagement)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if len(m.Endpoints) == 0 || m.Endpoint != m.Endpoints[0] {
					t.Fatalf("node %s method %s: endpoints %q, endpoint %q", n, m.Name, m.Endpoints, m.Endpoint)
				}
			}
		}
	})
}

// A driver's endpoints: the single field, the list, or both; each host:port, none twice, some.
func TestDriverEndpoints(t *testing.T) {
	node := "\nnodes: {a: {methods: {m: {driver: d}}, steps: {power_management: [m]}}}\n"
	c, err := Parse([]byte("drivers: {d: {endpoint: \"h1:1\", endpoints: [\"h2:1\", \"h3:1\"]}}"+node), "t")
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := c.Plan("a", StepPowerManagement)
	if d := cmp.Diff([]string{"h1:1", "h2:1", "h3:1"}, ms[0].Endpoints); d != "" || ms[0].Endpoint != "h1:1" {
		t.Errorf("endpoints (-want +got):\n%s endpoint %s", d, ms[0].Endpoint)
	}
	for _, tc := range []struct{ drivers, field, problem string }{
		{"{d: {}}", "drivers.d.endpoint", "required"},
		{"{d: {endpoints: [\"h1:1\", nohostport]}}", "drivers.d.endpoints[1]", "not host:port"},
		{"{d: {endpoint: \"h1:1\", endpoints: [\"h1:1\"]}}", "drivers.d.endpoints[0]", "also drivers.d.endpoint"},
		{"{d: {endpoints: [a:1, a:2, a:3, a:4, a:5, a:6, a:7, a:8, a:9]}}", "drivers.d.endpoints", "at most 8"},
	} {
		_, err := Parse([]byte("drivers: "+tc.drivers+node), "t")
		if err == nil || !strings.Contains(err.Error(), tc.field+": ") || !strings.Contains(err.Error(), tc.problem) {
			t.Errorf("drivers %s: %v; want %s: %s", tc.drivers, err, tc.field, tc.problem)
		}
	}
}

// Secret files are checked as asked: skipped (an offline check), stat'ed (the coordinator), or
// read (--check-secrets); a problem never shows the file's content.
func TestSecretFileChecks(t *testing.T) {
	dir := t.TempDir()
	empty, full := filepath.Join(dir, "empty"), filepath.Join(dir, "full")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := func(path string) []byte {
		return []byte("drivers: {d: {endpoint: \"h:1\"}}\nnodes: {a: {methods: {m: {driver: d, parameters: {password_file: " + path + "}}}, steps: {power_management: [m]}}}\n")
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		path    string
		mode    SecretFiles
		problem string // "" means accepted
	}{
		{missing, SecretFilesSkip, ""},
		{missing, SecretFilesExist, "no such file"},
		{missing, SecretFilesRead, "no such file"},
		{empty, SecretFilesExist, ""},
		{empty, SecretFilesRead, "empty"},
		{full, SecretFilesRead, ""},
	} {
		_, err := ParseWith(cfg(tc.path), "t", Checks{SecretFiles: tc.mode})
		switch {
		case tc.problem == "" && err != nil:
			t.Errorf("%s mode %d: %v", filepath.Base(tc.path), tc.mode, err)
		case tc.problem != "" && (err == nil || !strings.Contains(err.Error(), "nodes.a.methods.m.parameters.password_file: ") || !strings.Contains(err.Error(), tc.problem)):
			t.Errorf("%s mode %d: %v; want %q", filepath.Base(tc.path), tc.mode, err, tc.problem)
		case err != nil && strings.Contains(err.Error(), "hunter2"):
			t.Errorf("a problem shows the secret: %v", err)
		}
	}
}
