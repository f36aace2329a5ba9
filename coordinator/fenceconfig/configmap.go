package fenceconfig

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nodefence/nodefence/services/fault"
)

// The seed's ConfigMap names.
const (
	ConfigPrefix   = "fence-config-"          // fence-config-<node>, data key config.properties
	MethodPrefix   = "fence-method-"          // fence-method-<method>-<node>, data key method.properties
	TemplatePrefix = "fence-method-template-" // fence-method-template-<name>, data key template.properties
	HostMapPrefix  = "fence-host-map-"        // fence-host-map-<method>, data key host-map.properties (hostmap.go)
)

// Control keys of the seed's properties: they steer the flow and are not passed to drivers.
var controlKeys = map[string]bool{
	"name": true, "template": true, "agent_name": true, "action": true, "must_success": true, "must_sucess": true,
	"node_name": true, "isolation": true, "power_management": true, "recovery": true,
}

// ConfigMap is the part of a Kubernetes ConfigMap the seed's format uses.
type ConfigMap struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
	// Source names where it was read from, for errors.
	Source string `json:"-"`
}

// DriverForAgent maps a ClusterLabs agent name (the seed's agent_name) to the nodefence driver that
// speaks its protocol natively; any other fence_* agent runs through the generic agent driver.
func DriverForAgent(agent string) string {
	switch agent {
	case "fence_ipmilan", "fence_ipmilanplus", "fence_idrac", "fence_ilo3", "fence_ilo4", "fence_ilo5", "fence_imm":
		return "ipmi"
	case "fence_apc_snmp", "fence_eaton_snmp", "fence_pulizzi_snmp":
		return "pdu"
	case "fence_brocade":
		return "brocade"
	case "fence_redfish":
		return "redfish"
	case "fence_aws":
		return "aws"
	case WatchdogDriver:
		return WatchdogDriver // no fence agent: the node's own watchdog (fenceconfig.WatchdogDriver)
	}
	return "agent"
}

// ReadConfigMaps reads ConfigMaps from a file or every *.yaml/*.yml/*.json file of a directory.
// A file may hold several YAML documents, a YAML list of ConfigMaps (as the seed writes them), or a
// v1 List.
func ReadConfigMaps(path string) ([]ConfigMap, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if st.IsDir() {
		files = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
	}
	var out []ConfigMap
	var inv fault.Invalid
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		cms, err := parseConfigMaps(data, f)
		if err != nil {
			inv.Add(f, "%v", err)
			continue
		}
		out = append(out, cms...)
	}
	return out, inv.Err()
}

func parseConfigMaps(data []byte, source string) ([]ConfigMap, error) {
	var out []ConfigMap
	for i, doc := range splitYAMLDocuments(data) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var probe any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		var items []ConfigMap
		switch v := probe.(type) {
		case nil:
			continue // only comments: an empty document
		case []any:
			if err := yaml.Unmarshal(doc, &items); err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
		case map[string]any:
			if v["kind"] == "List" {
				var list struct {
					Items []ConfigMap `json:"items"`
				}
				if err := yaml.Unmarshal(doc, &list); err != nil {
					return nil, fmt.Errorf("document %d: %w", i+1, err)
				}
				items = list.Items
			} else {
				if _, ok := v["kind"]; !ok {
					return nil, fmt.Errorf("document %d is neither a Kubernetes object (no kind:) nor the standalone fence configuration (no nodes:); "+
						"expected fence ConfigMaps (fence-config-*, fence-method-*, fence-method-template-*) or one YAML document with keys drivers, templates and nodes", i+1)
				}
				var cm ConfigMap
				if err := yaml.Unmarshal(doc, &cm); err != nil {
					return nil, fmt.Errorf("document %d: %w", i+1, err)
				}
				items = []ConfigMap{cm}
			}
		default:
			return nil, fmt.Errorf("document %d: not a ConfigMap, a list of them, or a List", i+1)
		}
		for j := range items {
			items[j].Source = fmt.Sprintf("%s: ConfigMap %s", source, items[j].Metadata.Name)
			out = append(out, items[j])
		}
	}
	return out, nil
}

func splitYAMLDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " \t") == "---" {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	return append(docs, cur.Bytes())
}

// ParseProperties parses the seed's key=value properties: one pair a line, blank lines and lines
// starting with # or ! ignored, whitespace around keys and values trimmed. A key given twice or a
// line without '=' is an error.
func ParseProperties(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	n := 0
	var errs []string
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("line %d: %q is not key=value", n, line))
		case k == "":
			errs = append(errs, fmt.Sprintf("line %d: empty key", n))
		case out[k] != "":
			errs = append(errs, fmt.Sprintf("line %d: %s given twice", n, k))
		default:
			out[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return out, errors.New(strings.Join(errs, "; "))
	}
	return out, nil
}

// FromConfigMaps builds the model from the seed's ConfigMaps. drivers supplies the driver services
// (in Kubernetes mode they come from flags). The node of a fence-config is its node_name property, or
// the ConfigMap name's suffix when node_name is absent; a method M of node N is the ConfigMap
// fence-method-M-N (N being node_name, or else the ConfigMap name's suffix). Every problem is reported,
// named by its ConfigMap and key.
func FromConfigMaps(cms []ConfigMap, drivers map[string]Driver) (*Config, error) {
	c := &Config{Drivers: drivers, Templates: map[string]Method{}, Nodes: map[string]Node{}}
	var inv fault.Invalid
	byName := map[string]ConfigMap{}
	for _, cm := range cms {
		if cm.Kind != "" && cm.Kind != "ConfigMap" {
			continue
		}
		if prev, dup := byName[cm.Metadata.Name]; dup {
			inv.Add(cm.Source, "ConfigMap %s also defined in %s", cm.Metadata.Name, prev.Source)
			continue
		}
		byName[cm.Metadata.Name] = cm
	}
	props := func(cm ConfigMap, key string) map[string]string {
		raw, ok := cm.Data[key]
		if !ok {
			inv.Add(cm.Source, "data key %s is missing", key)
			return nil
		}
		p, err := ParseProperties(strings.NewReader(raw))
		if err != nil {
			inv.Add(cm.Source+" "+key, "%v", err)
		}
		return p
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	// Templates first: methods refer to them by ConfigMap name.
	for _, name := range names {
		if !strings.HasPrefix(name, TemplatePrefix) {
			continue
		}
		cm := byName[name]
		p := props(cm, "template.properties")
		if p == nil {
			continue
		}
		c.Templates[name] = methodFromProperties(&inv, cm.Source+" template.properties", p)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, ConfigPrefix) {
			continue
		}
		cm := byName[name]
		p := props(cm, "config.properties")
		if p == nil {
			continue
		}
		suffix := strings.TrimPrefix(name, ConfigPrefix)
		node := p["node_name"]
		if node == "" {
			node = suffix
		}
		if _, dup := c.Nodes[node]; dup {
			inv.Add(cm.Source+" config.properties node_name", "node %s configured twice", node)
			continue
		}
		n := nodeFromProperties(&inv, props, byName, cm, p, node, suffix)
		c.Nodes[node] = n
	}
	c.HostMaps = hostMapsFromConfigMaps(&inv, props, byName, names)
	for _, name := range names {
		if !strings.HasPrefix(name, ConfigPrefix) && !strings.HasPrefix(name, MethodPrefix) && !strings.HasPrefix(name, HostMapPrefix) {
			inv.Add(byName[name].Source, "not a fence ConfigMap (want %s*, %s*, %s*, %s*)", ConfigPrefix, MethodPrefix, TemplatePrefix, HostMapPrefix)
		}
	}
	if err := inv.Err(); err != nil {
		return nil, err
	}
	if err := c.ExpandHostMaps(); err != nil {
		return nil, err
	}
	return c, nil
}

// hostMapsFromConfigMaps reads the fence-host-map-<method> ConfigMaps among names, in name order.
func hostMapsFromConfigMaps(inv *fault.Invalid, props func(ConfigMap, string) map[string]string, byName map[string]ConfigMap, names []string) []HostMap {
	var out []HostMap
	for _, name := range names {
		if !strings.HasPrefix(name, HostMapPrefix) {
			continue
		}
		cm := byName[name]
		if p := props(cm, "host-map.properties"); p != nil {
			out = append(out, hostMapFromProperties(inv, cm.Source+" host-map.properties", strings.TrimPrefix(name, HostMapPrefix), p))
		}
	}
	return out
}

// hostMapFromProperties turns a fence-host-map-<method> ConfigMap's properties into a HostMap:
// template, agent_name, action and must_success as in a method, steps (space-separated; default
// power_management), and every other key a parameter whose value is a pcmk_host_map string
// ("node-01:10.0.0.11;node-02:10.0.0.12").
func hostMapFromProperties(inv *fault.Invalid, source, method string, p map[string]string) HostMap {
	m := methodFromProperties(inv, source, p)
	hm := HostMap{Method: method, Template: m.Template, Driver: m.Driver, Action: m.Action, MustSuccess: m.MustSuccess,
		Steps: strings.Fields(p["steps"]), Parameters: map[string]HostValues{}}
	for k, v := range m.Parameters {
		switch k {
		case "steps":
		case "agent": // the generic agent driver's program, from agent_name: not a per-node value
			inv.Add(source+" agent_name", "%s runs through the generic agent driver: name it in a template (template=...), not in a host map", v)
		default:
			hm.Parameters[k] = HostValues{Text: v}
		}
	}
	return hm
}

// nodeFromProperties builds node's model from its fence-config properties p (in cm), finding its
// methods' ConfigMaps in byName by node and by suffix, the ConfigMap name's suffix. props reads a
// ConfigMap's properties, reporting problems to inv as every problem here is.
func nodeFromProperties(inv *fault.Invalid, props func(ConfigMap, string) map[string]string, byName map[string]ConfigMap,
	cm ConfigMap, p map[string]string, node, suffix string) Node {
	n := Node{Methods: map[string]Method{}, Steps: map[string][]string{}}
	for _, step := range steps {
		for _, m := range strings.Fields(p[step]) {
			n.Steps[step] = append(n.Steps[step], m)
			if _, ok := n.Methods[m]; ok {
				continue
			}
			mcm, ok := byName[MethodPrefix+m+"-"+node]
			if !ok {
				mcm, ok = byName[MethodPrefix+m+"-"+suffix]
			}
			if !ok {
				inv.Add(cm.Source+" config.properties "+step, "method %q: no ConfigMap %s%s-%s", m, MethodPrefix, m, node)
				continue
			}
			mp := props(mcm, "method.properties")
			if mp == nil {
				continue
			}
			n.Methods[m] = methodFromProperties(inv, mcm.Source+" method.properties", mp)
		}
	}
	for k, v := range p {
		if !controlKeys[k] {
			switch k {
			case "zone":
				n.Zone = v
			case "region":
				n.Region = v
			case "watchdog_fallback":
				b, err := parseBool(v)
				if err != nil {
					inv.Add(cm.Source+" config.properties watchdog_fallback", "%v", err)
				}
				n.WatchdogFallback = b
			default:
				inv.Add(cm.Source+" config.properties "+k, "unknown key")
			}
		}
	}
	return n
}

// methodFromProperties turns a template's or method's properties into a Method: template (a
// ConfigMap name), agent_name (mapped to a driver), action and must_success are control keys; the
// rest are driver parameters.
func methodFromProperties(inv *fault.Invalid, source string, p map[string]string) Method {
	m := Method{Template: p["template"], Parameters: map[string]string{}}
	if a := p["agent_name"]; a != "" {
		m.Driver = DriverForAgent(a)
		if m.Driver == "agent" {
			m.Parameters["agent"] = a
		}
	}
	switch a := p["action"]; a {
	case "", "off", "on":
		m.Action = a
	case "reboot":
		inv.Add(source+" action", "reboot is not a fencing action here: list an off method then an on method")
	default:
		inv.Add(source+" action", "%q is not off or on", a)
	}
	for _, k := range []string{"must_success", "must_sucess"} {
		if v, ok := p[k]; ok {
			b, err := parseBool(v)
			if err != nil {
				inv.Add(source+" "+k, "%v", err)
			}
			m.MustSuccess = &b
		}
	}
	for k, v := range p {
		if !controlKeys[k] {
			m.Parameters[k] = v
		}
	}
	return m
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "yes", "true", "1", "on", "y":
		return true, nil
	case "no", "false", "0", "off", "n":
		return false, nil
	}
	return false, fmt.Errorf("%q is not yes or no", v)
}

// LoadAny loads a standalone YAML configuration file, or the seed's ConfigMaps from a file or a
// directory (drivers then come from the caller, nil for an offline check). Secret files must exist.
func LoadAny(path string, drivers map[string]Driver) (*Config, error) {
	return LoadAnyWith(path, drivers, Checks{})
}

// LoadAnyWith is LoadAny with the given checks.
func LoadAnyWith(path string, drivers map[string]Driver, checks Checks) (*Config, error) {
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if yaml.Unmarshal(data, &probe) == nil {
			_, nodes := probe["nodes"]
			_, hostMaps := probe["host_maps"]
			if nodes || hostMaps {
				return ParseWith(data, path, checks)
			}
		}
	}
	cms, err := ReadConfigMaps(path)
	if err != nil {
		return nil, err
	}
	var others []string
	fence := 0
	for _, cm := range cms {
		if (cm.Kind == "" || cm.Kind == "ConfigMap") && strings.HasPrefix(cm.Metadata.Name, "fence-") {
			fence++
		} else {
			others = append(others, strings.TrimSpace(cm.Kind+" "+cm.Metadata.Name))
		}
	}
	if fence == 0 {
		found := "nothing"
		if len(others) > 0 {
			found = strings.Join(others, ", ")
		}
		return nil, fault.Invalid{{Field: path, Problem: "no fence configuration found: expected a standalone YAML with nodes: or fence ConfigMaps " +
			"(fence-config-*, fence-method-*, fence-method-template-*); found " + found}}
	}
	c, err := FromConfigMaps(cms, drivers)
	if err != nil {
		return nil, err
	}
	return c, c.ValidateWith(checks)
}
