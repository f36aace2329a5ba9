package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/fence-drivers/agentparams"
	"github.com/nodefence/nodefence/fence-drivers/fenceagent"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/redact"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// describeParameters returns a driver's parameters as its Describe RPC lists them: the driver's
// own table, compiled into fencectl from the same code as fence-driver. The agent driver's
// parameters depend on the fence agent; offline they are the agent parameter and the allowlist
// of names (with their kinds) any agent may be handed.
func describeParameters(driver string) ([]*driverv1.Parameter, error) {
	if driver == "agent" {
		out := fenceagent.New().Describe()
		allowed := agentparams.Allowed()
		for _, name := range slices.Sorted(maps.Keys(allowed)) {
			k := allowed[name]
			out = append(out, &driverv1.Parameter{Name: name, Type: k.String(), Secret: k == agentparams.KindSecret,
				Description: "passed to the fence agent (the agent's own metadata says what it means)"})
		}
		return out, nil
	}
	d, ok := offlineDrivers[driver]
	if !ok {
		return nil, usagef("unknown driver %q (known: %s)%s", driver, strings.Join(fenceconfig.DriverKinds, ", "), didYouMean(driver, fenceconfig.DriverKinds))
	}
	desc := d.Describe()
	slices.SortFunc(desc, func(a, b *driverv1.Parameter) int { return strings.Compare(a.GetName(), b.GetName()) })
	return desc, nil
}

// describe prints a driver's parameters.
func (c *ctl) describe(driver string) error {
	desc, err := describeParameters(driver)
	if err != nil {
		return err
	}
	t := table{header: []string{"PARAMETER", "ALIASES", "TYPE", "REQUIRED", "DEFAULT", "SECRET", "DESCRIPTION"}}
	for _, p := range desc {
		t.rows = append(t.rows, []string{p.GetName(), strings.Join(p.GetAliases(), ","), p.GetType(), yesNo(p.GetRequired()),
			p.GetDefault(), yesNo(p.GetSecret()), p.GetDescription()})
	}
	t.notes = append(t.notes, "a secret may be given as NAME_file (a file holding it) or, in Kubernetes mode, NAME_secret (name/key of a Secret)")
	return c.show(view{data: &driverv1.DescribeResponse{Driver: driver, Parameters: desc}, tables: []table{t}})
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}

// unknownParameters names every parameter of a method its driver does not describe (a typo such
// as passwrd would otherwise reach the driver, which ignores it, and be masked as a secret in
// every log). A secret reference counts under the name it stands for (password_file is
// password). A name the driver does not know but the ClusterLabs fence agents do (inet4_only,
// power_wait: the seed's examples carry them) is no typo: it is a note, as the native driver
// ignores it. The field named is where the parameter is written: the node's method, or its
// template. The agent driver checks its own allowlist (checkMethod).
func unknownParameters(c *fenceconfig.Config, node string, m fenceconfig.Resolved) (problems, notes []string) {
	d, ok := offlineDrivers[m.Driver]
	if !ok {
		return nil, nil
	}
	known := map[string]bool{}
	var names []string
	for _, p := range d.Describe() {
		for _, n := range append([]string{p.GetName()}, p.GetAliases()...) {
			known[kit.NormalizeName(n)] = true
			names = append(names, n)
		}
	}
	agentOptions := agentparams.Allowed()
	for _, k := range slices.Sorted(maps.Keys(m.Parameters)) {
		base := k
		if b, ok := strings.CutSuffix(k, "_file"); ok {
			base = b
		} else if b, ok := strings.CutSuffix(k, "_secret"); ok {
			base = b
		}
		n := kit.NormalizeName(base)
		if known[n] {
			continue
		}
		field := paramField(c, node, m.Name, k)
		if _, agentOption := agentOptions[n]; agentOption {
			notes = append(notes, fmt.Sprintf("%s: a fence-agent option driver %s does not use (ignored)", field, m.Driver))
			continue
		}
		problems = append(problems, fmt.Sprintf("%s: unknown parameter for driver %s%s (fencectl describe %s lists them)",
			field, m.Driver, didYouMean(base, names), m.Driver))
	}
	return problems, notes
}

// paramField is where parameter k of a node's method is written: the method's own parameters (in
// nodes:, or in the host map that gave it), or else its template's.
func paramField(c *fenceconfig.Config, node, method, k string) string {
	meth := c.Nodes[node].Methods[method]
	if _, own := meth.Parameters[k]; !own && meth.Template != "" {
		if _, inTemplate := c.Templates[meth.Template].Parameters[k]; inTemplate {
			return "templates." + meth.Template + ".parameters." + k
		}
	}
	if i, ok := c.FromHostMap(node, method); ok {
		return fmt.Sprintf("host_maps[%d].parameters.%s", i, k)
	}
	return "nodes." + node + ".methods." + method + ".parameters." + k
}

// deviceKey is the device a method acts on, as its driver's epoch table and locks name it
// (ipmi/10.0.0.11:623, pdu/10.0.1.1:161/7): address literals in canonical form, defaults applied.
// ok is false when the parameters do not parse (checkMethod reports that).
func deviceKey(node string, m fenceconfig.Resolved) (string, bool) {
	var d kit.Driver
	if m.Driver == "agent" {
		d = fenceagent.New()
	} else if d = offlineDrivers[m.Driver]; d == nil {
		return "", false
	}
	canon, err := kit.Canonicalize(placeholderSecrets(m.Parameters), d.Describe())
	if err != nil {
		return "", false
	}
	t := kit.Target{Name: node, Params: canon}
	if m.Driver != "agent" {
		if t.Parsed, err = d.Parse(canon); err != nil {
			return "", false
		}
	}
	return kit.ResolvedKey(context.Background(), nil, d, t), true
}

// sharedDevices names every pair of nodes whose methods act on the same device: fencing one would
// switch off the other. A node's own methods may share a device (off in power_management, on in
// recovery).
func sharedDevices(c *fenceconfig.Config) []string {
	type use struct{ node, method, field string }
	first := map[string]use{}
	var out []string
	for _, node := range c.NodeNames() {
		seen := map[string]bool{}
		for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
			ms, _ := c.Plan(node, step)
			for _, m := range ms {
				key, ok := deviceKey(node, m)
				if !ok || seen[key] {
					continue
				}
				seen[key] = true
				field := "ip" // the field that tells the devices apart: the plug, else the address
				for _, f := range []string{"plug", "port", "ip", "ipaddr"} {
					if _, ok := m.Parameters[f]; ok {
						field = f
						break
					}
				}
				u := use{node, m.Name, paramField(c, node, m.Name, field)}
				if prev, dup := first[key]; dup && prev.node != node {
					where := ""
					if prev.field != u.field {
						where = fmt.Sprintf(" (%s and %s)", prev.field, u.field)
					}
					out = append(out, fmt.Sprintf("%s: nodes %s and %s use the same device %s%s: fencing one would switch off the other",
						u.field, prev.node, node, key, where))
					continue
				}
				first[key] = u
			}
		}
	}
	return out
}

// deviceTimeout bounds the check of one device by test --config.
const deviceTimeout = 20 * time.Second

// testConfig checks a node's fence devices from this host, with the drivers compiled into
// fencectl and the configuration in path, before it is applied: for each method the driver's
// Monitor (when it has one) and Status. It never changes power: only those two are called.
func (c *ctl) testConfig(ctx context.Context, path, node string) error {
	cfg, err := fenceconfig.LoadAnyWith(path, nil, fenceconfig.Checks{SecretFiles: fenceconfig.SecretFilesRead})
	if err != nil {
		return configProblems(path, err)
	}
	if !cfg.HasNode(node) {
		return fmt.Errorf("node %q is not in %s (nodes: %s)%s", node, path, strings.Join(cfg.NodeNames(), ", "), didYouMean(node, cfg.NodeNames()))
	}
	r := &coordv1.CheckNodeResponse{Node: node, Ok: true}
	byName := map[string]*coordv1.DeviceCheck{}
	for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
		ms, _ := cfg.Plan(node, step)
		for _, m := range ms {
			if dc, done := byName[m.Name]; done {
				dc.Steps = append(dc.Steps, step)
				continue
			}
			dc := checkDevice(ctx, node, m)
			dc.Steps = []string{step}
			byName[m.Name] = dc
			r.Checks = append(r.Checks, dc)
			r.Ok = r.Ok && dc.Reachable && dc.CredentialsOk
		}
	}
	t := checkTable(r)
	t.notes = append(t.notes, "checked from this host with fencectl's own drivers and "+path+" (not yet applied); nothing was switched")
	if err := c.show(view{data: r, tables: []table{t}}); err != nil {
		return err
	}
	if !r.Ok {
		return fmt.Errorf("node %s: a fence device check failed", node)
	}
	return nil
}

// configProblems prints a configuration's problems and returns the exit code.
func configProblems(path string, err error) error {
	var inv fault.Invalid
	if errors.As(err, &inv) {
		lines := make([]string, len(inv))
		for i, fe := range inv {
			lines[i] = "  - " + fe.Error()
		}
		return fmt.Errorf("%s: %d problem(s):\n%s", path, len(inv), strings.Join(lines, "\n"))
	}
	return err
}

// checkDevice runs Monitor and Status for one method with its secrets read. The detail never
// holds a secret value.
func checkDevice(ctx context.Context, node string, m fenceconfig.Resolved) *coordv1.DeviceCheck {
	start := time.Now()
	dc := &coordv1.DeviceCheck{Method: m.Name, Driver: m.Driver}
	params := map[string]string{}
	finish := func(detail string) *coordv1.DeviceCheck {
		detail = redact.Values(detail, params, func(k string) bool { return kit.IsSecret(k, nil) })
		dc.Detail, dc.Latency, dc.CheckedAt = detail, durationpb.New(time.Since(start)), timestamppb.Now()
		return dc
	}
	newDriver, ok := driverFactories[m.Driver]
	if !ok {
		return finish("not checked here: the agent driver runs fence agents on the driver host; apply the configuration and run fencectl test " + node)
	}
	d := newDriver() // its own sessions, logged out when the check ends
	if cl, ok := d.(interface{ Close() }); ok {
		defer cl.Close()
	}
	resolved, err := fenceconfig.ResolveSecrets(m.Parameters, nil)
	if err != nil {
		return finish(err.Error())
	}
	params = resolved
	canon, err := kit.Canonicalize(params, d.Describe())
	var parsed any
	if err == nil {
		parsed, err = d.Parse(canon)
	}
	if err != nil {
		return finish("parameters: " + err.Error())
	}
	t := kit.Target{Name: node, Params: canon, Parsed: parsed}
	cctx, cancel := context.WithTimeout(ctx, deviceTimeout)
	defer cancel()
	if mon, ok := d.(kit.Monitorer); ok {
		if err := mon.Monitor(cctx, t); err != nil {
			dc.Reachable = errors.Is(err, fault.ErrUnauthenticated)
			return finish("monitor: " + err.Error())
		}
	}
	st, err := d.Status(cctx, t)
	if err != nil {
		dc.Reachable = errors.Is(err, fault.ErrUnauthenticated)
		return finish("status: " + err.Error())
	}
	dc.Reachable, dc.CredentialsOk, dc.State = true, true, st
	return finish("device answered and accepted the credentials")
}
