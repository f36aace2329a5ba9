package fenceconfig

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nodefence/nodefence/services/fault"
)

// HostMap gives many nodes one fence method each: the method's template (or driver) and shared
// parameters are written once, and each per-node parameter as a map from node to value. It is the
// compact form of what nodes: spells out node by node, and expands into exactly that (Config.
// ExpandHostMaps): for every node the map names, a method called Method with the template and the
// node's values, listed in each of Steps.
//
//	host_maps:
//	  - method: bmc
//	    template: bmc
//	    parameters:
//	      ip: "node-01:10.0.0.11;node-02:10.0.0.12"   # Pacemaker's pcmk_host_map syntax
//	      ipport: {node-01: "623", node-02: "623"}    # or a YAML mapping
type HostMap struct {
	// Method is the name of the method each node gets; empty means the template's name.
	Method string `json:"method,omitempty"`
	// Template, Driver, Action and MustSuccess are the method's, as in Method.
	Template    string `json:"template,omitempty"`
	Driver      string `json:"driver,omitempty"`
	Action      string `json:"action,omitempty"`
	MustSuccess *bool  `json:"must_success,omitempty"`
	// Steps lists the steps the method is appended to, in order; empty means power_management.
	Steps []string `json:"steps,omitempty"`
	// Parameters map a parameter name to each node's value. Every node must have a value for every
	// parameter listed; parameters common to all nodes belong in the template.
	Parameters map[string]HostValues `json:"parameters"`
}

// HostValues is one parameter's node-to-value map, written as Pacemaker's pcmk_host_map string
// ("node-01:plug1;node-02:plug2", entries separated by ';' or white space, node and value by ':'
// or '=') or as a YAML mapping {node-01: plug1}. The text is parsed when the map is expanded, so
// that a problem names its field.
type HostValues struct {
	// Text is the pcmk_host_map form; Map the mapping form. One of them is set.
	Text string
	Map  map[string]string
	// bad says what was wrong with the input, reported with its field when the map is expanded.
	bad string
}

// UnmarshalJSON accepts a string, or a mapping whose values are strings, numbers or booleans
// (YAML reads 623 as a number). Anything else is kept as a problem for ExpandHostMaps to report
// under the parameter's field: the decoder would not name it.
func (h *HostValues) UnmarshalJSON(b []byte) error {
	*h = HostValues{}
	if json.Unmarshal(b, &h.Text) == nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		h.bad = `want "node:value;node:value" or a mapping {node: value}`
		return nil
	}
	h.Map = map[string]string{}
	for node, v := range m {
		switch v := v.(type) {
		case string:
			h.Map[node] = v
		case float64:
			h.Map[node] = strconv.FormatFloat(v, 'f', -1, 64)
		case bool:
			h.Map[node] = strconv.FormatBool(v)
		default:
			h.bad = fmt.Sprintf("node %s: want a single value, not a list or a mapping", clip(node))
			return nil
		}
	}
	return nil
}

// MarshalJSON writes the form that was read.
func (h HostValues) MarshalJSON() ([]byte, error) {
	if h.Map != nil {
		return json.Marshal(h.Map)
	}
	return json.Marshal(h.Text)
}

// Bounds of a host map: a fleet of a few thousand nodes, values as long as a host name.
const (
	maxHostMapEntries = 4096
	maxHostMapValue   = 253
)

// ParseHostMap parses Pacemaker's pcmk_host_map syntax: "node:value" (or "node=value") entries
// separated by ';' or white space. Node names follow the configuration's node names; a value is
// non-empty, at most 253 bytes, without white space or ';'. Every problem is returned, each
// naming the entry (1-based) and the node.
func ParseHostMap(s string) (map[string]string, []string) {
	out := map[string]string{}
	var problems []string
	at := map[string]int{}
	entries := strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ' ' || r == '\t' || r == '\n' || r == '\r' })
	if len(entries) == 0 {
		return nil, []string{`empty: want "node:value;node:value"`}
	}
	if len(entries) > maxHostMapEntries {
		return nil, []string{fmt.Sprintf("%d entries, at most %d", len(entries), maxHostMapEntries)}
	}
	for i, e := range entries {
		n := i + 1
		sep := strings.IndexAny(e, ":=")
		if sep < 0 {
			problems = append(problems, fmt.Sprintf("entry %d %q: want node:value", n, clip(e)))
			continue
		}
		node, value := e[:sep], e[sep+1:]
		if p := hostEntryProblem(node, value); p != "" {
			problems = append(problems, fmt.Sprintf("entry %d: %s", n, p))
			continue
		}
		if prev, dup := at[node]; dup {
			problems = append(problems, fmt.Sprintf("entry %d: node %s given twice (entries %d and %d)", n, node, prev, n))
			continue
		}
		at[node] = n
		out[node] = value
	}
	return out, problems
}

// hostEntryProblem says what is wrong with one node-to-value pair, or "".
func hostEntryProblem(node, value string) string {
	switch {
	case !nameRE.MatchString(node):
		return fmt.Sprintf("%q is not a node name (lowercase letters, digits, '-', '_', '.')", clip(node))
	case value == "":
		return fmt.Sprintf("node %s: empty value", node)
	case len(value) > maxHostMapValue:
		return fmt.Sprintf("node %s: value longer than %d bytes", node, maxHostMapValue)
	case strings.ContainsAny(value, " \t\r\n;"):
		return fmt.Sprintf("node %s: value holds white space or ';'", node)
	}
	return ""
}

// clip shortens text quoted in a problem.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// values returns the node-to-value map, or adds problems under f.
func (h HostValues) values(v *fault.Invalid, f string) map[string]string {
	if h.bad != "" {
		v.Add(f, "%s", h.bad)
		return nil
	}
	if h.Map == nil {
		m, problems := ParseHostMap(h.Text)
		for _, p := range problems {
			v.Add(f, "%s", p)
		}
		return m
	}
	if len(h.Map) > maxHostMapEntries {
		v.Add(f, "%d entries, at most %d", len(h.Map), maxHostMapEntries)
		return nil
	}
	out := map[string]string{}
	for _, node := range sortedKeys(h.Map) {
		if p := hostEntryProblem(node, h.Map[node]); p != "" {
			v.Add(f, "%s", p)
			continue
		}
		out[node] = h.Map[node]
	}
	return out
}

// ExpandHostMaps turns every host map into the nodes' methods and steps it stands for, then
// empties HostMaps: the configuration is then exactly what nodes: would spell out. A node the map
// names that nodes: does not is created; one it does gets the method added (a method of the same
// name already there is an error, as is a step listing it already). Maps are applied in order, so
// their methods follow any the node lists itself, in map order. Every problem is returned, named
// by its field (host_maps[0].parameters.ip).
func (c *Config) ExpandHostMaps() error {
	var v fault.Invalid
	for i, hm := range c.HostMaps {
		c.expandHostMap(&v, i, hm)
	}
	c.HostMaps = nil
	return v.Err()
}

func (c *Config) expandHostMap(v *fault.Invalid, index int, hm HostMap) {
	f := fmt.Sprintf("host_maps[%d]", index)
	name := hm.Method
	if name == "" {
		name = hm.Template
	}
	switch {
	case name == "":
		v.Add(f+".method", "required (or a template, whose name the method takes)")
		return
	case !nameRE.MatchString(name):
		v.Add(f+".method", "invalid method name %q", name)
		return
	}
	stepList := hm.Steps
	if len(stepList) == 0 {
		stepList = []string{StepPowerManagement}
	}
	for j, s := range stepList {
		if !slices.Contains(steps, s) {
			v.Add(fmt.Sprintf("%s.steps[%d]", f, j), "unknown step %q (want one of %s)", s, strings.Join(steps, ", "))
			return
		}
	}
	if len(hm.Parameters) == 0 {
		v.Add(f+".parameters", "required: at least one parameter with a value per node (ip: \"node-01:10.0.0.11;node-02:10.0.0.12\")")
		return
	}
	params := map[string]map[string]string{}
	nodes := map[string]string{} // node -> the first parameter naming it
	before := len(*v)
	for _, p := range sortedKeys(hm.Parameters) {
		params[p] = hm.Parameters[p].values(v, f+".parameters."+p)
		for node := range params[p] {
			if _, ok := nodes[node]; !ok {
				nodes[node] = p
			}
		}
	}
	for _, p := range sortedKeys(params) {
		for _, node := range sortedKeys(nodes) {
			if _, ok := params[p][node]; !ok {
				v.Add(f+".parameters."+p, "node %s has %s but no %s: give every node a value for every parameter", node, nodes[node], p)
			}
		}
	}
	if len(*v) > before {
		return
	}
	for _, node := range sortedKeys(nodes) {
		c.addHostMethod(v, index, node, name, hm, stepList, params)
	}
}

// nodeMethod names one method of one node.
type nodeMethod struct{ node, method string }

// FromHostMap returns the index of the host map (host_maps[i]) that gave node its method, for
// problems that name where a parameter is written.
func (c *Config) FromHostMap(node, method string) (int, bool) {
	i, ok := c.fromHostMap[nodeMethod{node, method}]
	return i, ok
}

// addHostMethod gives node the host map's method and lists it in its steps.
func (c *Config) addHostMethod(v *fault.Invalid, index int, node, name string, hm HostMap, stepList []string, params map[string]map[string]string) {
	f := fmt.Sprintf("host_maps[%d]", index)
	if c.Nodes == nil {
		c.Nodes = map[string]Node{}
	}
	n := c.Nodes[node]
	if n.Methods == nil {
		n.Methods = map[string]Method{}
	}
	if n.Steps == nil {
		n.Steps = map[string][]string{}
	}
	if _, dup := n.Methods[name]; dup {
		v.Add(f+".method", "node %s already has a method %s (nodes.%s.methods.%s or an earlier host map)", node, name, node, name)
		return
	}
	m := Method{Template: hm.Template, Driver: hm.Driver, Action: hm.Action, MustSuccess: hm.MustSuccess, Parameters: map[string]string{}}
	for p, byNode := range params {
		m.Parameters[p] = byNode[node]
	}
	n.Methods[name] = m
	if c.fromHostMap == nil {
		c.fromHostMap = map[nodeMethod]int{}
	}
	c.fromHostMap[nodeMethod{node, name}] = index
	for _, s := range stepList {
		if slices.Contains(n.Steps[s], name) {
			v.Add(f+".steps", "node %s already lists method %s in %s", node, name, s)
			continue
		}
		n.Steps[s] = append(n.Steps[s], name)
	}
	c.Nodes[node] = n
}
