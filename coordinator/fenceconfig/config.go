// Package fenceconfig loads the coordinator's standalone fence configuration: which driver services exist,
// method templates, and per node the methods (template plus overrides) used by each fencing step.
// It is the YAML twin of the seed's ConfigMap model (fence-method-template-*, fence-method-*-<node>,
// fence-config-<node>); the ConfigMap reader arrives with the Kubernetes mode.
//
// Parameter names follow the ClusterLabs fence agents (ip, ipport, username, password, plug, lanplus,
// cipher, ...). A parameter whose name ends in "_file" is a secret reference: the value is a path, read
// when the driver is called, and passed under the name without the suffix (password_file -> password).
package fenceconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nodefence/nodefence/fence-drivers/agentparams"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
)

// Steps of the fencing flow, in the seed's order.
const (
	StepIsolation       = "isolation"
	StepPowerManagement = "power_management"
	StepRecovery        = "recovery"
)

var steps = []string{StepIsolation, StepPowerManagement, StepRecovery}

// Config is the whole standalone configuration.
type Config struct {
	// Drivers maps a driver name (ipmi, pdu, ...) to the fence-driver service that implements it.
	Drivers map[string]Driver `json:"drivers"`
	// Templates are reusable method definitions (the seed's fence-method-template-<name>).
	Templates map[string]Method `json:"templates"`
	// Nodes maps a node name to its fencing configuration.
	Nodes map[string]Node `json:"nodes"`
	// HostMaps give many nodes one method each in a few lines: a template plus, per parameter, a
	// node-to-value map (Pacemaker's pcmk_host_map, "node-01:10.0.0.11;node-02:10.0.0.12"). They
	// are expanded into Nodes when the configuration is read (see hostmap.go) and are empty after.
	HostMaps []HostMap `json:"host_maps,omitempty"`

	// fromHostMap records, by node and method, the host map each expanded method came from.
	fromHostMap map[nodeMethod]int
}

// Driver locates a fence-driver service and says who must answer there.
type Driver struct {
	// Endpoint is the service's gRPC address, host:port.
	Endpoint string `json:"endpoint,omitempty"`
	// Endpoints are more addresses of the same driver service (one per driver host), tried in
	// order after Endpoint while a host is unreachable: a fence never depends on one driver host.
	// Either field alone is enough. See Driver.Addresses and deploy/baremetal.md.
	Endpoints []string `json:"endpoints,omitempty"`
	// Identity is the name the service's certificate must carry, spiffe://nodefence/driver/<identity>;
	// empty means the driver's own name (drivers.ipmi answers as driver/ipmi). The coordinator
	// refuses, at the TLS handshake, any other server of the same CA at Endpoint.
	Identity string `json:"identity,omitempty"`
}

// PeerName is the driver identity name the service at the endpoint must present: Identity, or the
// driver's name when Identity is empty.
func (d Driver) PeerName(name string) string {
	if d.Identity != "" {
		return d.Identity
	}
	return name
}

// Method is one way of fencing a node: a driver and its parameters, optionally from a template.
type Method struct {
	// Template names a template whose driver and parameters this method starts from.
	Template string `json:"template,omitempty"`
	// Driver names the driver; it overrides the template's.
	Driver string `json:"driver,omitempty"`
	// Parameters override the template's, key by key.
	Parameters map[string]string `json:"parameters,omitempty"`
	// Action is "off" or "on"; empty means off in isolation and power_management, on in recovery.
	// The seed's power_management=eaton-off eaton-on is a reboot by two methods.
	Action string `json:"action,omitempty"`
	// MustSuccess makes the method required: its step fails if it is not confirmed (the seed's
	// must_sucess, spelled either way). Unset inherits the template's; the default is false.
	MustSuccess *bool `json:"must_success,omitempty"`
}

// Node is one node's fencing configuration (the seed's fence-config-<node>).
type Node struct {
	// Zone and Region locate the node when no agent has reported them.
	Zone   string `json:"zone,omitempty"`
	Region string `json:"region,omitempty"`
	// Methods are the node's fence methods by name.
	Methods map[string]Method `json:"methods"`
	// Steps maps isolation, power_management and recovery to ordered method names.
	Steps map[string][]string `json:"steps"`
	// Delay and RandomDelay postpone this node's fencing by Delay plus a random part up to
	// RandomDelay (Pacemaker's pcmk_delay_base and pcmk_delay_max): in a two-node cluster, the
	// nodes' delays differ so that both cannot fence each other at once.
	Delay       Duration `json:"delay,omitempty"`
	RandomDelay Duration `json:"random_delay,omitempty"`
	// Addresses are the node's IP addresses, used to recognise its fence_kdump messages.
	Addresses []string `json:"addresses,omitempty"`
	// WatchdogFallback (default off): a power-off record of this node whose power_management
	// methods all failed as unreachable (a dark BMC) falls back to the watchdog method when the
	// node's agent last reported an armed watchdog (docs/fence-config.md).
	WatchdogFallback bool `json:"watchdog_fallback,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("5s") in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON accepts a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"5s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.Duration.String()) }

// Resolved is a method with its template applied.
type Resolved struct {
	// Name is the method name.
	Name string
	// Driver is the driver name.
	Driver string
	// Endpoint is the driver service address: the first of Endpoints.
	Endpoint string
	// Endpoints are every address of the driver service, in the order they are tried.
	Endpoints []string
	// Identity is the name of the driver identity (spiffe://nodefence/driver/<Identity>) the service
	// at Endpoint must present.
	Identity string
	// Parameters are merged template and method parameters; secrets are still references.
	Parameters map[string]string
	// Action is "off" or "on".
	Action string
	// Required is true for a must-succeed method.
	Required bool
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$`)

// Load reads and validates a configuration file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fence configuration: %w", err)
	}
	return Parse(data, path)
}

// Parse parses and validates YAML; source names the input in errors. Input of another shape (the
// seed's ConfigMaps, several documents, a list, nothing) is refused with what it is and what was
// expected, before any field is looked at. Secret files must exist (Checks{}).
func Parse(data []byte, source string) (*Config, error) { return ParseWith(data, source, Checks{}) }

// ParseWith is Parse with the given checks.
func ParseWith(data []byte, source string, checks Checks) (*Config, error) {
	if problem := notStandalone(data); problem != "" {
		return nil, fault.Invalid{{Field: source, Problem: problem}}
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fault.Invalid{{Field: source, Problem: "not a valid standalone fence configuration (drivers:, templates:, nodes:, host_maps:): " + err.Error()}}
	}
	if err := c.ExpandHostMaps(); err != nil {
		return nil, err
	}
	if err := c.ValidateWith(checks); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate returns every problem at once, as fault.Invalid with dotted field paths. Secret files
// must exist (Checks{}).
func (c *Config) Validate() error { return c.ValidateWith(Checks{}) }

// ValidateWith is Validate with the given checks.
func (c *Config) ValidateWith(checks Checks) error {
	var v fault.Invalid
	if len(c.HostMaps) > 0 {
		v.Add("host_maps", "not expanded (ExpandHostMaps)")
	}
	c.validateDrivers(&v)
	for _, name := range sortedKeys(c.Templates) {
		t := c.Templates[name]
		f := "templates." + name
		if t.Template != "" {
			v.Add(f+".template", "templates cannot reference other templates")
		}
		if t.Driver == "" {
			v.Add(f+".driver", "required (or agent_name)")
		} else if t.Driver == WatchdogDriver {
			v.Add(f+".driver", "%q is a method of its own, not a template's driver: write driver: %s in the node's method", WatchdogDriver, WatchdogDriver)
		} else {
			c.checkDriver(&v, f+".driver", t.Driver)
		}
		checkAction(&v, f+".action", t.Action)
		checkParams(&v, f, t.Parameters, checks)
		if t.Driver == "agent" {
			checkAgentParams(&v, f, t.Parameters)
		}
	}
	if len(c.Nodes) == 0 {
		v.Add("nodes", "at least one node is required")
	}
	for _, node := range sortedKeys(c.Nodes) {
		n := c.Nodes[node]
		f := "nodes." + node
		if !nameRE.MatchString(node) {
			v.Add(f, "invalid node name (lowercase letters, digits, '-', '_', '.')")
		}
		for _, m := range sortedKeys(n.Methods) {
			c.checkMethod(&v, f+".methods."+m, n.Methods[m], checks)
		}
		used := 0
		for _, step := range sortedKeys(n.Steps) {
			if !slices.Contains(steps, step) {
				v.Add(f+".steps."+step, "unknown step (want one of %s)", strings.Join(steps, ", "))
				continue
			}
			seen := map[string]bool{}
			for i, m := range n.Steps[step] {
				if _, ok := n.Methods[m]; !ok {
					v.Add(fmt.Sprintf("%s.steps.%s[%d]", f, step, i), "unknown method %q", m)
				} else if n.Methods[m].Driver == WatchdogDriver && step != StepPowerManagement {
					v.Add(fmt.Sprintf("%s.steps.%s[%d]", f, step, i), "method %q is a watchdog method: it powers the node off by its watchdog and belongs in %s only", m, StepPowerManagement)
				}
				if seen[m] {
					v.Add(fmt.Sprintf("%s.steps.%s[%d]", f, step, i), "method %q listed twice", m)
				}
				seen[m] = true
				used++
			}
		}
		if used == 0 {
			v.Add(f+".steps", "no step lists any method: the node could never be fenced")
		}
		if len(n.Steps[StepIsolation])+len(n.Steps[StepPowerManagement]) == 0 && used > 0 {
			v.Add(f+".steps", "neither isolation nor power_management lists a method: the node could never be fenced")
		}
		if n.Delay.Duration < 0 || n.RandomDelay.Duration < 0 {
			v.Add(f+".delay", "delays must not be negative")
		}
		for i, a := range n.Addresses {
			if net.ParseIP(a) == nil {
				v.Add(fmt.Sprintf("%s.addresses[%d]", f, i), "%q is not an IP address", a)
			}
		}
	}
	return v.Err()
}

// validateDrivers checks each driver's name, endpoint and expected identity.
func (c *Config) validateDrivers(v *fault.Invalid) {
	for _, name := range sortedKeys(c.Drivers) {
		d := c.Drivers[name]
		if !nameRE.MatchString(name) {
			v.Add("drivers."+name, "invalid driver name")
		}
		d.validateEndpoints(v, "drivers."+name)
		if err := identity.ValidName(d.PeerName(name)); err != nil {
			if d.Identity == "" {
				v.Add("drivers."+name+".identity", "required: the driver's name is not an identity name (%v)", err)
			} else {
				v.Add("drivers."+name+".identity", "%v", err)
			}
		}
	}
}

func (c *Config) checkMethod(v *fault.Invalid, f string, m Method, checks Checks) {
	driver := m.Driver
	if m.Template != "" {
		t, ok := c.Templates[m.Template]
		if !ok {
			v.Add(f+".template", "unknown template %q", m.Template)
		} else if driver == "" {
			driver = t.Driver
		}
	}
	switch {
	case driver == "" && m.Template == "":
		v.Add(f, "needs a template or a driver")
	case driver == WatchdogDriver:
		checkWatchdogMethod(v, f, m)
		return
	case driver != "":
		c.checkDriver(v, f+".driver", driver)
	}
	checkAction(v, f+".action", m.Action)
	checkParams(v, f, m.Parameters, checks)
	if driver == "agent" {
		// What the agent driver is handed: the template's parameters with the method's overrides.
		params := map[string]string{}
		if t, ok := c.Templates[m.Template]; ok && m.Template != "" {
			maps.Copy(params, t.Parameters)
		}
		maps.Copy(params, m.Parameters)
		checkAgentParams(v, f, params)
	}
}

// checkAgentParams applies the agent driver's own validator (package agentparams: allowlisted
// names, values checked by their kind, never an option or a program) to a method's parameters, so
// that a configuration the driver would refuse is refused when it is loaded or reloaded. Names a
// driver host's administrator may allow beyond the allowlist pass here as text (the coordinator
// does not know them; the driver refuses those it does not allow); forbidden names never do.
func checkAgentParams(v *fault.Invalid, f string, params map[string]string) {
	var inv fault.Invalid
	if errors.As(agentparams.Check(params, []string{agentparams.AnyExtra}), &inv) {
		for _, fe := range inv {
			v.Add(f+".parameters."+fe.Field, "%s", fe.Problem)
		}
	}
}

// checkDriver checks that a driver has a service. With no Drivers at all (an offline check of
// ConfigMaps, whose driver services come from coordinator flags) any known driver kind passes.
func (c *Config) checkDriver(v *fault.Invalid, f, driver string) {
	if c.Drivers == nil {
		if !slices.Contains(DriverKinds, driver) {
			v.Add(f, "unknown driver %q (want one of %s)", driver, strings.Join(DriverKinds, ", "))
		}
		return
	}
	if _, ok := c.Drivers[driver]; !ok {
		v.Add(f, "unknown driver %q: no such entry in drivers", driver)
	}
}

// WatchdogDriver is the driver name of the watchdog method: no driver service; the leader tells
// the node's agent to stop feeding its watchdog and proves the node off by the timing rule
// (services/wdlease). It takes no template, no parameters, and only the action "off".
const WatchdogDriver = "watchdog"

// checkWatchdogMethod checks a watchdog method: nothing to set but must_success.
func checkWatchdogMethod(v *fault.Invalid, f string, m Method) {
	if m.Template != "" {
		v.Add(f+".template", "a %s method takes no template", WatchdogDriver)
	}
	if len(m.Parameters) > 0 {
		v.Add(f+".parameters", "a %s method takes no parameters", WatchdogDriver)
	}
	if m.Action != "" && m.Action != "off" {
		v.Add(f+".action", "a %s method only powers off (by the node's own watchdog), not %q", WatchdogDriver, m.Action)
	}
}

// DriverKinds are the drivers fence-driver implements.
var DriverKinds = []string{"agent", "aws", "brocade", "ipmi", "pdu", "redfish"}

func checkAction(v *fault.Invalid, f, action string) {
	if action != "" && action != "off" && action != "on" {
		v.Add(f, "%q is not off or on", action)
	}
}

func checkParams(v *fault.Invalid, f string, params map[string]string, checks Checks) {
	for _, k := range sortedKeys(params) {
		if k == "" || strings.ContainsAny(k, " =\n") {
			v.Add(f+".parameters", "invalid parameter name %q", k)
			continue
		}
		if strings.HasSuffix(k, "_file") {
			checkSecretFile(v, f+".parameters."+k, params[k], checks.SecretFiles)
		}
		if strings.HasSuffix(k, "_secret") {
			if n := len(strings.Split(params[k], "/")); n != 2 && n != 3 {
				v.Add(f+".parameters."+k, "%q is not name/key or namespace/name/key", params[k])
			}
		}
	}
}

// Plan returns a node's methods for a step, in order, with templates applied.
func (c *Config) Plan(node, step string) ([]Resolved, error) {
	n, ok := c.Nodes[node]
	if !ok {
		return nil, fmt.Errorf("node %q has no fence configuration: %w", node, fault.ErrNotFound)
	}
	var out []Resolved
	for _, name := range n.Steps[step] {
		m := n.Methods[name]
		r := Resolved{Name: name, Driver: m.Driver, Parameters: map[string]string{}, Action: m.Action}
		must := m.MustSuccess
		if t, ok := c.Templates[m.Template]; ok {
			if r.Driver == "" {
				r.Driver = t.Driver
			}
			if r.Action == "" {
				r.Action = t.Action
			}
			if must == nil {
				must = t.MustSuccess
			}
			for k, val := range t.Parameters {
				r.Parameters[k] = val
			}
		}
		for k, val := range m.Parameters {
			r.Parameters[k] = val
		}
		if r.Action == "" {
			r.Action = DefaultAction(step)
		}
		r.Required = must != nil && *must
		d := c.Drivers[r.Driver]
		r.Endpoints, r.Identity = d.Addresses(), d.PeerName(r.Driver)
		if len(r.Endpoints) > 0 {
			r.Endpoint = r.Endpoints[0]
		}
		out = append(out, r)
	}
	return out, nil
}

// DefaultAction is a step's action when its method names none: on for recovery, else off.
func DefaultAction(step string) string {
	if step == StepRecovery {
		return "on"
	}
	return "off"
}

// HasNode reports whether the node has a fence configuration.
func (c *Config) HasNode(node string) bool { _, ok := c.Nodes[node]; return ok }

// NodeNames returns the configured node names, sorted.
func (c *Config) NodeNames() []string { return sortedKeys(c.Nodes) }

// SecretReader reads one key of a Kubernetes Secret (namespace may be empty: the coordinator's).
type SecretReader func(namespace, name, key string) (string, error)

// ResolveSecrets returns params with every secret reference replaced by the value it names, under the
// name without its suffix: "<name>_file" holds a file path (a mounted Secret, read at call time; one
// trailing newline removed), "<name>_secret" a Kubernetes Secret as "name/key" or
// "namespace/name/key" (read through secrets; nil refuses such references).
func ResolveSecrets(params map[string]string, secrets SecretReader) (map[string]string, error) {
	out := make(map[string]string, len(params))
	for k, val := range params {
		if name, isRef := strings.CutSuffix(k, "_file"); isRef {
			data, err := os.ReadFile(val)
			if err != nil {
				return nil, fmt.Errorf("parameter %s: %w", k, err)
			}
			out[name] = strings.TrimRight(string(data), "\r\n")
			continue
		}
		if name, isRef := strings.CutSuffix(k, "_secret"); isRef {
			parts := strings.Split(val, "/")
			if len(parts) == 2 {
				parts = append([]string{""}, parts...)
			}
			if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
				return nil, fmt.Errorf("parameter %s: %q is not name/key or namespace/name/key", k, val)
			}
			if secrets == nil {
				return nil, fmt.Errorf("parameter %s: Secret references need Kubernetes mode (use %s_file with a mounted Secret)", k, name)
			}
			v, err := secrets(parts[0], parts[1], parts[2])
			if err != nil {
				return nil, fmt.Errorf("parameter %s: %w", k, err)
			}
			out[name] = v
			continue
		}
		out[k] = val
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// expectedStandalone says what a standalone configuration file looks like, for errors.
const expectedStandalone = "expected the standalone fence configuration: one YAML document with drivers:, templates: and nodes:"

// notStandalone says what data is when it is plainly not a standalone configuration, or "" when it
// may be one (the strict decoder then names any wrong field).
func notStandalone(data []byte) string {
	var docs []map[string]any
	for i, doc := range splitYAMLDocuments(data) {
		var probe any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return fmt.Sprintf("document %d is not YAML (%v); %s", i+1, err, expectedStandalone)
		}
		switch v := probe.(type) {
		case nil:
			continue
		case map[string]any:
			docs = append(docs, v)
		case []any:
			return fmt.Sprintf("document %d is a YAML list of %d items (ConfigMaps as the node-fencing proposal writes them?); %s; "+
				"in Kubernetes mode (--kubeconfig) the coordinator reads the fence ConfigMaps from --fence-namespace", i+1, len(v), expectedStandalone)
		default:
			return fmt.Sprintf("document %d is a single value (%T), not a mapping; %s", i+1, v, expectedStandalone)
		}
	}
	if len(docs) == 0 {
		return "the file is empty (or only comments); " + expectedStandalone
	}
	var kinds []string
	configMaps := false
	for _, d := range docs {
		kind, hasKind := d["kind"].(string)
		_, hasAPI := d["apiVersion"]
		if !hasKind && !hasAPI {
			continue
		}
		configMaps = configMaps || kind == "ConfigMap" || kind == "List"
		name := ""
		if md, ok := d["metadata"].(map[string]any); ok {
			name, _ = md["name"].(string)
		}
		kinds = append(kinds, strings.TrimSpace(kind+" "+name))
	}
	if len(kinds) > 0 {
		shown := kinds
		if len(shown) > 3 {
			shown = append(shown[:3:3], fmt.Sprintf("and %d more", len(kinds)-3))
		}
		msg := fmt.Sprintf("the file holds %d Kubernetes object(s) (%s); %s", len(kinds), strings.Join(shown, ", "), expectedStandalone)
		if configMaps {
			msg += ". The node-fencing proposal's fence ConfigMaps are read in Kubernetes mode (--kubeconfig) from --fence-namespace: " +
				"apply them with kubectl (fencectl config check PATH validates them offline)"
		}
		return msg
	}
	if len(docs) > 1 {
		return fmt.Sprintf("the file has %d YAML documents; %s", len(docs), expectedStandalone)
	}
	return ""
}
