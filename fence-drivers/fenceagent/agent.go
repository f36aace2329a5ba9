// Package fenceagent is the fence-agent runner: a fence driver that runs any installed ClusterLabs
// fence_* agent through its stdin protocol.
//
// The runner execs the agent with no arguments (with arguments, agents ignore stdin) and writes
// the parameters as key=value lines to its stdin, then reads the exit code: 0 is success (status
// on), 2 is status off, anything else a failure. The agent's metadata XML (`fence_x -o metadata`)
// is read once per agent to validate the parameters: every one must be known to the agent, the
// required ones given, select values among the options. Each run has the operation's deadline:
// on expiry the agent's whole process group (it spawns ipmitool, snmpget, ssh ...) is killed.
//
// The parameter `agent` (or `agent_name`) names the agent. For an agent with plugs and a list
// action, the plug is checked against the agent's list before anything else: fence_apc_snmp
// reports a missing outlet as off, and the runner must not.
package fenceagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodefence/nodefence/fence-drivers/agentparams"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// ParamAgent names the agent to run.
const ParamAgent = "agent"

// Config configures the runner. Zero fields take the defaults documented on each field.
type Config struct {
	// Dir is where the agents are installed. Default /usr/sbin.
	Dir string
	// Agent, when set, is the agent used by targets that name none, and the one Describe
	// describes (DescribeRequest names no target).
	Agent string
	// MetadataTimeout bounds reading an agent's metadata. Default 10 s.
	MetadataTimeout time.Duration
	// ExtraParameters are agent parameters the driver host's administrator allows beyond the
	// built-in allowlist (say status_file for fence_dummy in tests). Names that name a program, a
	// script, a file or command-line options are refused whatever this says.
	ExtraParameters []string
}

// Driver is the fence-agent runner.
type Driver struct {
	cfg  Config
	mu   sync.Mutex
	meta map[string]*Metadata // by agent name
}

var (
	_ kit.Driver     = (*Driver)(nil)
	_ kit.Lister     = (*Driver)(nil)
	_ kit.Monitorer  = (*Driver)(nil)
	_ kit.Documented = (*Driver)(nil)
)

// New returns a runner for the agents in /usr/sbin, with no default agent.
func New() kit.Driver { return NewWith(Config{}) }

// NewWith returns a runner configured by cfg.
func NewWith(cfg Config) *Driver {
	if cfg.Dir == "" {
		cfg.Dir = "/usr/sbin"
	}
	if cfg.MetadataTimeout == 0 {
		cfg.MetadataTimeout = 10 * time.Second
	}
	return &Driver{cfg: cfg, meta: map[string]*Metadata{}}
}

// Name is "agent".
func (*Driver) Name() string { return "agent" }

// Description says what the driver runs.
func (d *Driver) Description() string {
	s := "Runs an installed ClusterLabs fence agent (fence_*) through its stdin protocol; the parameter agent names it."
	if m, err := d.Metadata(d.cfg.Agent); d.cfg.Agent != "" && err == nil {
		s += " Default agent " + m.Name + ": " + m.ShortDesc + "."
	}
	return s
}

// Describe lists the agent parameter and, with a default agent, that agent's parameters.
func (d *Driver) Describe() []*driverv1.Parameter {
	agent := &driverv1.Parameter{Name: ParamAgent, Aliases: []string{"agent_name"}, Type: kit.TypeString, Required: d.cfg.Agent == "",
		Default: d.cfg.Agent, Description: "the fence agent to run, e.g. fence_ipmilan (installed in " + d.cfg.Dir + ")"}
	if d.cfg.Agent == "" {
		return []*driverv1.Parameter{agent}
	}
	m, err := d.Metadata(d.cfg.Agent)
	if err != nil {
		return []*driverv1.Parameter{agent}
	}
	return append([]*driverv1.Parameter{agent}, m.Describe()...)
}

// DescribeTarget describes the agent the target's agent (or agent_name) parameter names, or the
// default agent: the agent parameter plus that agent's own parameters from its metadata.
func (d *Driver) DescribeTarget(params map[string]string) ([]*driverv1.Parameter, string, error) {
	name := params[ParamAgent]
	if name == "" {
		name = params["agent_name"]
	}
	if name == "" {
		name = d.cfg.Agent
	}
	if name == "" {
		return nil, "", fault.Invalid{{Field: "target.parameters.agent", Problem: "name the fence agent to describe"}}
	}
	m, err := d.Metadata(name)
	if err != nil {
		return nil, "", err
	}
	agent := &driverv1.Parameter{Name: ParamAgent, Aliases: []string{"agent_name"}, Type: kit.TypeString, Default: name,
		Description: "the fence agent to run"}
	return append([]*driverv1.Parameter{agent}, m.Describe()...), m.Name + ": " + m.ShortDesc, nil
}

// Metadata returns the agent's metadata, reading it once.
func (d *Driver) Metadata(agent string) (*Metadata, error) {
	path, err := d.path(agent)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	m := d.meta[agent]
	d.mu.Unlock()
	if m != nil {
		return m, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.MetadataTimeout)
	defer cancel()
	res, err := run(ctx, path, []string{"-o", "metadata"}, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %s -o metadata: %v", fault.ErrFailedPrecondition, agent, err)
	}
	if res.code != 0 {
		return nil, fmt.Errorf("%w: %s -o metadata exited %d: %s", fault.ErrFailedPrecondition, agent, res.code, lastLine(res.stderr))
	}
	if m, err = ParseMetadata(res.stdout); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", fault.ErrFailedPrecondition, agent, err)
	}
	d.mu.Lock()
	d.meta[agent] = m
	d.mu.Unlock()
	return m, nil
}

// path returns the agent's executable, checking its name.
func (d *Driver) path(agent string) (string, error) {
	if !agentparams.IsAgentName(agent) {
		var inv fault.Invalid
		inv.Add(ParamAgent, "must name a ClusterLabs fence agent (fence_ and lower-case letters, digits, _), got %q", agent)
		return "", inv.Err()
	}
	p := filepath.Join(d.cfg.Dir, agent)
	if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		var inv fault.Invalid
		inv.Add(ParamAgent, "fence agent %s is not installed in %s", agent, d.cfg.Dir)
		return "", inv.Err()
	}
	return p, nil
}

// call is a validated target: the agent and its stdin parameters.
type call struct {
	agent  string
	path   string
	meta   *Metadata
	params map[string]string // agent's canonical names; false booleans dropped
}

// prepare validates canonical target parameters against the agent's metadata.
func (d *Driver) prepare(params map[string]string) (*call, error) {
	agent := strings.TrimSpace(params[ParamAgent])
	if agent == "" {
		agent = d.cfg.Agent
	}
	if agent == "" {
		var inv fault.Invalid
		inv.Add(ParamAgent, "required: the fence agent to run, e.g. fence_ipmilan")
		return nil, inv.Err()
	}
	m, err := d.Metadata(agent)
	if err != nil {
		return nil, err
	}
	c := &call{agent: agent, path: filepath.Join(d.cfg.Dir, agent), meta: m, params: map[string]string{}}
	var inv fault.Invalid
	for _, k := range sortedKeys(params) {
		v := params[k]
		if k == ParamAgent || k == "agent_name" {
			continue
		}
		name, ok := m.canonical(k)
		switch {
		case !ok:
			inv.Add(k, "fence agent %s has no parameter %q", agent, k)
			continue
		case slices.Contains(controlled, name):
			inv.Add(k, "is set by the runner, not by the target")
			continue
		}
		if problem := checkValue(name, v, d.cfg.ExtraParameters); problem != "" {
			inv.Add(k, "%s", problem)
			continue
		}
		ap := m.Params[name]
		if ap.Type == "select" && len(ap.Options) > 0 && !slices.Contains(ap.Options, v) {
			inv.Add(k, "must be one of %s, got %q", strings.Join(ap.Options, ", "), v)
			continue
		}
		if ap.Type == "second" || ap.Type == "integer" {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || n < 0 {
				inv.Add(k, "must be a whole number of seconds or a count (fence agents take no fractions), got %q", v)
				continue
			}
		}
		if ap.Type == "boolean" {
			// Agents test flags for presence: "0" would still set them. Leave false out.
			switch strings.ToLower(strings.TrimSpace(v)) {
			case "0", "false", "no", "off", "n", "f":
				continue
			}
			v = "1"
		}
		c.params[name] = v
	}
	for _, name := range sortedKeys(m.Params) {
		ap := m.Params[name]
		if ap.Required && !slices.Contains(controlled, name) && c.params[name] == "" && ap.Default == "" {
			inv.Add(name, "required by fence agent %s: %s", agent, ap.Description)
		}
	}
	if err := inv.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// Parse checks the parameters against the agent's metadata and returns the call they make.
func (d *Driver) Parse(params map[string]string) (any, error) { return d.prepare(params) }

// DeviceKey is the agent and the device address and plug it is given.
func (d *Driver) DeviceKey(t kit.Target) string {
	agent := t.Params[ParamAgent]
	if agent == "" {
		agent = d.cfg.Agent
	}
	key := agent
	for _, k := range []string{"ip", "ipaddr", "ipport", "plug", "port", "status_file", "nodename"} {
		if v := t.Params[k]; v != "" {
			key += "/" + k + "=" + v
		}
	}
	return key
}

func (d *Driver) act(ctx context.Context, t kit.Target, action string) error {
	c, err := kit.ParsedAs(t, d.prepare)
	if err != nil {
		return err
	}
	if err := c.checkPlug(ctx); err != nil {
		return err
	}
	res, err := c.do(ctx, action)
	if err != nil {
		return err
	}
	if res.code != 0 {
		return c.failure(action, res)
	}
	return nil
}

// PowerOff runs the agent's off action.
func (d *Driver) PowerOff(ctx context.Context, t kit.Target) error { return d.act(ctx, t, "off") }

// PowerOn runs the agent's on action.
func (d *Driver) PowerOn(ctx context.Context, t kit.Target) error { return d.act(ctx, t, "on") }

// Status runs the agent's status action: exit 0 is on, 2 is off, anything else an error.
func (d *Driver) Status(ctx context.Context, t kit.Target) (driverv1.PowerState, error) {
	c, err := kit.ParsedAs(t, d.prepare)
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	if err := c.checkPlug(ctx); err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	res, err := c.do(ctx, "status")
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	switch res.code {
	case 0:
		return driverv1.PowerState_POWER_STATE_ON, nil
	case 2:
		return driverv1.PowerState_POWER_STATE_OFF, nil
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN, c.failure("status", res)
}

// List runs the agent's list action.
func (d *Driver) List(ctx context.Context, t kit.Target) ([]*driverv1.Plug, error) {
	c, err := kit.ParsedAs(t, d.prepare)
	if err != nil {
		return nil, err
	}
	if !c.meta.Supports("list") {
		return nil, fmt.Errorf("%w: fence agent %s has no list action", fault.ErrFailedPrecondition, c.agent)
	}
	return c.list(ctx)
}

// Monitor runs the agent's monitor action.
func (d *Driver) Monitor(ctx context.Context, t kit.Target) error {
	c, err := kit.ParsedAs(t, d.prepare)
	if err != nil {
		return err
	}
	res, err := c.do(ctx, "monitor")
	if err != nil {
		return err
	}
	if res.code != 0 {
		return c.failure("monitor", res)
	}
	return nil
}
