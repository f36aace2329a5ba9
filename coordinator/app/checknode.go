package app

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodefence/nodefence/coordinator/api"
	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/redact"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// fenceSteps are the fencing steps in the order they run.
var fenceSteps = []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery}

// secretReader returns the reader of Secret references: Kubernetes mode's, nil in standalone mode.
func (a *App) secretReader() fenceconfig.SecretReader {
	if a.kube != nil {
		return a.kube.secret
	}
	return nil
}

// checkNode is api.DeviceChecker: the scheduled device check's probe, run on demand for each fence
// method of one node, in the order of its steps.
func (a *App) checkNode(ctx context.Context, _ *api.Leading, node string) ([]*coordv1.DeviceCheck, error) {
	cfg := a.fences()
	var out []*coordv1.DeviceCheck
	byName := map[string]*coordv1.DeviceCheck{}
	var methods []fenceconfig.Resolved
	for _, step := range fenceSteps {
		ms, err := cfg.Plan(node, step)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if c, ok := byName[m.Name]; ok {
				c.Steps = append(c.Steps, step)
				continue
			}
			c := &coordv1.DeviceCheck{Method: m.Name, Driver: m.Driver, Steps: []string{step}}
			byName[m.Name] = c
			out = append(out, c)
			methods = append(methods, m)
		}
	}
	secrets := a.secretReader()
	for i, m := range methods {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r := a.probe(ctx, secrets, node, m, true)
		r.Method, r.Driver, r.Steps = out[i].Method, out[i].Driver, out[i].Steps
		out[i] = r
	}
	return out, nil
}

// probe checks one fence method's device without changing anything: the driver's Monitor (device
// reachable, credentials accepted) and, with readState, when that passed, the driver's Status.
// The detail never holds a secret: the drivers' details do not, and a secret value the method was
// given is cut out of every message all the same.
func (a *App) probe(ctx context.Context, secrets fenceconfig.SecretReader, node string, m fenceconfig.Resolved, readState bool) *coordv1.DeviceCheck {
	start := a.now()
	r := &coordv1.DeviceCheck{Method: m.Name, Driver: m.Driver}
	finish := func(detail string, params map[string]string) *coordv1.DeviceCheck {
		r.Detail = redactValues(detail, params)
		end := a.now()
		r.Latency = durationpb.New(end.Sub(start))
		r.CheckedAt = timestamppb.New(end)
		return r
	}
	params, err := fenceconfig.ResolveSecrets(m.Parameters, secrets)
	if err != nil {
		return finish("secret not readable: "+err.Error(), nil)
	}
	target := &driverv1.Target{Name: node, Parameters: params}
	cctx, cancel := context.WithTimeout(ctx, a.cfg.FenceOpTimeout+2*time.Second)
	defer cancel()
	// The driver's endpoints in order, as the fence runner tries them: the first that answers.
	var cli driverv1.FenceDriverServiceClient
	var mon *driverv1.MonitorResponse
	for _, endpoint := range m.Endpoints {
		if cli, err = a.drivers.Client(endpoint, m.Identity); err != nil {
			return finish("no driver client: "+err.Error(), params)
		}
		mon, err = cli.Monitor(cctx, &driverv1.MonitorRequest{Target: target, Timeout: durationpb.New(a.cfg.FenceOpTimeout)})
		if status.Code(err) != codes.Unavailable || cctx.Err() != nil {
			break
		}
	}
	if err != nil || mon == nil {
		return finish(fmt.Sprintf("monitor: %v", err), params)
	}
	r.Reachable, r.CredentialsOk = mon.GetReachable(), mon.GetCredentialsOk()
	if !r.Reachable || !r.CredentialsOk || !readState {
		return finish(mon.GetDetail(), params)
	}
	st, err := cli.Status(cctx, &driverv1.StatusRequest{Target: target, Timeout: durationpb.New(a.cfg.FenceOpTimeout)})
	if err != nil {
		return finish("status: "+err.Error(), params)
	}
	r.State = st.GetState()
	return finish(mon.GetDetail(), params)
}

// redactValues replaces every secret parameter value found in s by "***".
func redactValues(s string, params map[string]string) string {
	return redact.Values(s, params, secretParam)
}

// secretParam reports whether a fence parameter is secret by its name (kit.IsSecret).
func secretParam(name string) bool { return kit.IsSecret(name, nil) }

// liveConfig is GetConfig's answer: the replica's settings and its fence configuration, secrets
// redacted.
func (a *App) liveConfig() *coordv1.GetConfigResponse {
	resp := &coordv1.GetConfigResponse{ReplicaId: a.cfg.ID, Settings: nameFlags(settings(reflect.ValueOf(a.cfg), ""))}
	cfg := a.fences()
	if cfg == nil {
		return resp
	}
	for _, node := range cfg.NodeNames() {
		nc := cfg.Nodes[node]
		n := &coordv1.FenceNodeConfig{Node: node, Zone: nc.Zone, Region: nc.Region}
		for _, step := range fenceSteps {
			ms, _ := cfg.Plan(node, step)
			for _, m := range ms {
				n.Methods = append(n.Methods, &coordv1.FenceMethodConfig{Step: step, Name: m.Name, Driver: m.Driver, Endpoint: m.Endpoint, Endpoints: m.Endpoints,
					Action: m.Action, Required: m.Required, Parameters: redactParameters(m.Parameters),
					PeerIdentity: identity.Identity{Role: identity.Driver, Name: m.Identity}.String()})
			}
		}
		resp.Nodes = append(resp.Nodes, n)
	}
	return resp
}

// redactParameters copies a method's parameters with every secret value replaced by "***"; a
// secret reference (NAME_file, NAME_secret) keeps its value, which says where the secret is kept.
func redactParameters(params map[string]string) map[string]string {
	return redact.Params(params, secretParam)
}

// settings flattens a configuration struct into sorted name=value settings: text, numbers, booleans,
// durations, string lists and maps. Pointers, functions and interfaces (a Kubernetes client
// configuration with its credentials, a policy table) are left out; secrets by name are "***".
func settings(v reflect.Value, prefix string) []*coordv1.Setting {
	var out []*coordv1.Setting
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := prefix + f.Name
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct {
			out = append(out, settings(fv, name+".")...)
			continue
		}
		text, ok := settingText(fv)
		if !ok {
			continue
		}
		if redact.Setting(f.Name) && text != "" {
			text = "***"
		}
		out = append(out, &coordv1.Setting{Name: name, Value: text})
	}
	if prefix == "" {
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	}
	return out
}

// settingText formats one setting's value; ok is false for kinds settings leaves out.
func settingText(v reflect.Value) (string, bool) {
	if s, ok := v.Interface().(fmt.Stringer); ok && v.Kind() != reflect.Pointer && v.Kind() != reflect.Interface {
		return s.String(), true
	}
	switch v.Kind() {
	case reflect.String:
		return v.String(), true
	case reflect.Bool:
		return strconv.FormatBool(v.Bool()), true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10), true
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64), true
	case reflect.Slice:
		stringer := v.Type().Elem().Implements(reflect.TypeFor[fmt.Stringer]())
		if v.Type().Elem().Kind() != reflect.String && !stringer {
			return "", false
		}
		parts := make([]string, v.Len())
		for i := range parts {
			if stringer {
				parts[i] = v.Index(i).Interface().(fmt.Stringer).String()
			} else {
				parts[i] = v.Index(i).String()
			}
		}
		return strings.Join(parts, ","), true
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String || v.Type().Elem().Kind() != reflect.String {
			return "", false
		}
		var parts []string
		for _, k := range v.MapKeys() {
			parts = append(parts, k.String()+"="+v.MapIndex(k).String())
		}
		sort.Strings(parts)
		return strings.Join(parts, ","), true
	}
	return "", false
}
