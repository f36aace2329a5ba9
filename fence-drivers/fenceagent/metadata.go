package fenceagent

import (
	"encoding/xml"
	"fmt"
	"slices"
	"strings"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// Metadata is what a fence agent says about itself in `fence_x -o metadata`.
type Metadata struct {
	// Name is the agent's name (fence_x).
	Name string
	// ShortDesc and LongDesc describe the agent.
	ShortDesc, LongDesc string
	// Params are the agent's parameters, by canonical name.
	Params map[string]*AgentParam
	// aliases maps an obsolete or deprecated name to its canonical name.
	aliases map[string]string
	// Actions are the actions the agent supports.
	Actions []string
}

// AgentParam is one parameter of a fence agent.
type AgentParam struct {
	Name        string
	Aliases     []string
	Required    bool
	Type        string // string, boolean, integer, second or select
	Default     string
	Options     []string // for select
	Description string
}

type xmlAgent struct {
	Name       string `xml:"name,attr"`
	ShortDesc  string `xml:"shortdesc,attr"`
	LongDesc   string `xml:"longdesc"`
	Parameters []struct {
		Name       string `xml:"name,attr"`
		Required   string `xml:"required,attr"`
		Deprecated string `xml:"deprecated,attr"`
		Obsoletes  string `xml:"obsoletes,attr"`
		Content    struct {
			Type    string `xml:"type,attr"`
			Default string `xml:"default,attr"`
			Options []struct {
				Value string `xml:"value,attr"`
			} `xml:"option"`
		} `xml:"content"`
		ShortDesc string `xml:"shortdesc"`
	} `xml:"parameters>parameter"`
	Actions []struct {
		Name string `xml:"name,attr"`
	} `xml:"actions>action"`
}

// controlled are the parameters the runner sets itself or never passes: the action, and flags
// that make an agent print something else instead of acting.
var controlled = []string{"action", "help", "version", "metadata"}

// ParseMetadata reads a fence agent's metadata XML.
func ParseMetadata(data []byte) (*Metadata, error) {
	var x xmlAgent
	if err := xml.Unmarshal(data, &x); err != nil {
		return nil, fmt.Errorf("metadata XML: %w", err)
	}
	if !strings.HasPrefix(x.Name, "fence_") {
		return nil, fmt.Errorf("metadata XML names agent %q, not a fence_ agent", x.Name)
	}
	m := &Metadata{Name: x.Name, ShortDesc: x.ShortDesc, LongDesc: strings.TrimSpace(x.LongDesc),
		Params: map[string]*AgentParam{}, aliases: map[string]string{}}
	deprecated := map[string]bool{}
	for _, p := range x.Parameters {
		name := kit.NormalizeName(p.Name)
		if p.Deprecated == "1" {
			deprecated[name] = true
			continue
		}
		ap := &AgentParam{Name: name, Required: p.Required == "1", Type: p.Content.Type, Default: p.Content.Default,
			Description: strings.TrimSpace(p.ShortDesc)}
		for _, o := range p.Content.Options {
			ap.Options = append(ap.Options, o.Value)
		}
		if p.Obsoletes != "" {
			ap.Aliases = append(ap.Aliases, kit.NormalizeName(p.Obsoletes))
		}
		m.Params[name] = ap
	}
	for _, ap := range m.Params {
		for _, a := range ap.Aliases {
			m.aliases[a] = ap.Name
			delete(deprecated, a)
		}
	}
	// A deprecated parameter nothing obsoletes stays usable under its own name.
	for _, p := range x.Parameters {
		if name := kit.NormalizeName(p.Name); deprecated[name] {
			m.Params[name] = &AgentParam{Name: name, Type: p.Content.Type, Default: p.Content.Default, Description: strings.TrimSpace(p.ShortDesc)}
		}
	}
	for _, a := range x.Actions {
		if !slices.Contains(m.Actions, a.Name) {
			m.Actions = append(m.Actions, a.Name)
		}
	}
	return m, nil
}

// canonical returns the canonical name of an agent parameter name, and whether the agent has it.
func (m *Metadata) canonical(name string) (string, bool) {
	n := kit.NormalizeName(name)
	if _, ok := m.Params[n]; ok {
		return n, true
	}
	if c, ok := m.aliases[n]; ok {
		return c, true
	}
	return n, false
}

// Supports reports whether the agent has the action.
func (m *Metadata) Supports(action string) bool { return slices.Contains(m.Actions, action) }

// Describe returns the agent's parameters as driver parameters (without the ones the runner
// controls), sorted by name.
func (m *Metadata) Describe() []*driverv1.Parameter {
	var out []*driverv1.Parameter
	for _, name := range sortedKeys(m.Params) {
		ap := m.Params[name]
		if slices.Contains(controlled, name) {
			continue
		}
		typ := kit.TypeString
		switch ap.Type {
		case "boolean":
			typ = kit.TypeBoolean
		case "integer":
			typ = kit.TypeInteger
		}
		desc := ap.Description
		if len(ap.Options) > 0 {
			desc += " (one of: " + strings.Join(ap.Options, ", ") + ")"
		}
		out = append(out, &driverv1.Parameter{Name: name, Aliases: ap.Aliases, Required: ap.Required, Type: typ,
			Default: ap.Default, Description: desc, Secret: kit.IsSecret(name, nil)})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
