// Package redfish is the Redfish BMC fence driver (github.com/stmcginnis/gofish), with the
// parameters of ClusterLabs fence_redfish.
//
// It finds the ComputerSystem to fence (systems_uri, or discovery through the service root's
// Systems collection), reads its PowerState, and powers it off with the #ComputerSystem.Reset
// action ResetType ForceOff and on with On (ForceOn when On is not allowed). Success is never
// taken from the POST's status alone: the kit confirms every action by reading PowerState back.
// PowerState Off is off, On is on, anything else (PoweringOn, PoweringOff, Paused, missing) is
// unknown.
//
// Unlike fence_redfish, which fences the LAST member of the Systems collection when no system is
// named, the driver refuses to guess on a service with several systems: name one with
// systems_uri or plug (a system Id).
//
// TLS is verified, against the system roots or the CA in ssl_ca_file; only the explicit
// ssl_insecure=1 skips verification. Authentication is HTTP Basic on every request, as
// fence_redfish does, or a Redfish session with session_auth=1. Clients are kept per BMC and
// credentials (kit.Pool), so connections and the discovered system are reused; a client whose
// operation failed is dropped, and one unused for 30 s is closed (its Redfish session deleted).
package redfish

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// Canonical parameter names (ClusterLabs' where fence_redfish has one).
const (
	ParamSystemsURI  = "systems_uri"
	ParamRedfishURI  = "redfish_uri"
	ParamSSL         = "ssl"
	ParamSSLInsecure = "ssl_insecure"
	ParamSSLSecure   = "ssl_secure"
	// ParamSSLCAFile is a PEM file of CA certificates trusted for the BMC (instead of the
	// system roots).
	ParamSSLCAFile = "ssl_ca_file"
	// ParamSessionAuth uses a Redfish session (X-Auth-Token) instead of Basic auth.
	ParamSessionAuth = "session_auth"
)

// Idle clients: at most maxIdle per BMC and credentials, each closed after idleTimeout.
const (
	maxIdle     = 4
	idleTimeout = 30 * time.Second
)

// Driver is the Redfish driver. Use New.
type Driver struct {
	pool *kit.Pool[*client] // idle clients by client key
}

var (
	_ kit.Driver     = (*Driver)(nil)
	_ kit.Lister     = (*Driver)(nil)
	_ kit.Monitorer  = (*Driver)(nil)
	_ kit.Documented = (*Driver)(nil)
)

// New returns the Redfish driver.
func New() kit.Driver { return &Driver{pool: kit.NewPool(maxIdle, idleTimeout, (*client).close)} }

// Close closes every idle client.
func (d *Driver) Close() { d.pool.Close() }

// Name is "redfish".
func (*Driver) Name() string { return "redfish" }

// Description says what the driver controls.
func (*Driver) Description() string {
	return "Powers servers off and on through their BMC's Redfish API (ComputerSystem.Reset ForceOff / On, PowerState read-back), like fence_redfish."
}

// Describe lists the parameters, with ClusterLabs names and aliases.
func (*Driver) Describe() []*driverv1.Parameter {
	return []*driverv1.Parameter{
		{Name: kit.ParamIP, Aliases: []string{"ipaddr"}, Required: true, Type: kit.TypeString,
			Description: "IP address or hostname of the BMC, optionally host:port"},
		{Name: kit.ParamIPPort, Type: kit.TypeInteger, Default: "443", Description: "TCP port of the Redfish service"},
		{Name: kit.ParamUsername, Aliases: []string{"login"}, Required: true, Type: kit.TypeString, Description: "BMC user name"},
		{Name: kit.ParamPassword, Aliases: []string{"passwd"}, Secret: true, Required: true, Type: kit.TypeString, Description: "BMC password"},
		{Name: ParamSystemsURI, Type: kit.TypeString,
			Description: "URI of the ComputerSystem, e.g. /redfish/v1/Systems/1 (default: discovered; required when the service has several systems and no plug is given)"},
		{Name: kit.ParamPlug, Aliases: []string{"port"}, Type: kit.TypeString,
			Description: "Id of the ComputerSystem in the Systems collection (an alternative to systems_uri)"},
		{Name: ParamRedfishURI, Type: kit.TypeString, Default: "/redfish/v1",
			Description: "base URI of the Redfish service (only /redfish/v1 is supported)"},
		{Name: ParamSSL, Type: kit.TypeBoolean, Default: "1", Description: "use HTTPS (ssl=0 sends the password in clear text over HTTP)"},
		{Name: ParamSSLSecure, Type: kit.TypeBoolean, Default: "1", Description: "verify the BMC's certificate (the default)"},
		{Name: ParamSSLInsecure, Type: kit.TypeBoolean, Default: "0",
			Description: "do not verify the BMC's certificate (tests only: a man in the middle could take the password)"},
		{Name: ParamSSLCAFile, Type: kit.TypeString, Description: "PEM file with the CA certificates that sign the BMC's certificate (default: system roots)"},
		{Name: ParamSessionAuth, Type: kit.TypeBoolean, Default: "0", Description: "authenticate with a Redfish session instead of Basic auth on every request"},
	}
}

// config is a parsed target.
type config struct {
	endpoint   string // https://host:port
	hostport   string
	username   string
	password   string
	systemsURI string
	plug       string
	ssl        bool
	insecure   bool
	caFile     string
	session    bool
}

// parse reads canonical parameters, naming every bad one.
func parse(p map[string]string) (*config, error) {
	var inv fault.Invalid
	c := &config{username: p[kit.ParamUsername], password: p[kit.ParamPassword], systemsURI: strings.TrimSpace(p[ParamSystemsURI]),
		plug: strings.TrimSpace(p[kit.ParamPlug]), ssl: p[ParamSSL] != "0", insecure: p[ParamSSLInsecure] == "1",
		caFile: strings.TrimSpace(p[ParamSSLCAFile]), session: p[ParamSessionAuth] == "1"}
	host := strings.TrimSpace(p[kit.ParamIP])
	port := strings.TrimSpace(p[kit.ParamIPPort])
	if h, pt, err := net.SplitHostPort(host); err == nil { // fence_redfish accepts ip=host:port
		host, port = h, pt
	}
	if host == "" || strings.ContainsAny(host, " /?#@") {
		inv.Add(kit.ParamIP, "must be an IP address or hostname (optionally host:port), got %q", p[kit.ParamIP])
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		inv.Add(kit.ParamIPPort, "must be a TCP port 1-65535, got %q", port)
	}
	c.hostport = net.JoinHostPort(host, port)
	c.endpoint = "https://" + c.hostport
	if !c.ssl {
		c.endpoint = "http://" + c.hostport
	}
	if strings.TrimSpace(c.username) == "" {
		inv.Add(kit.ParamUsername, "required: BMC user name")
	}
	if c.password == "" {
		inv.Add(kit.ParamPassword, "required: BMC password")
	}
	if c.systemsURI != "" && (!strings.HasPrefix(c.systemsURI, "/redfish/v1/") || strings.ContainsAny(c.systemsURI, " ?#")) {
		inv.Add(ParamSystemsURI, "must be a path under /redfish/v1/, got %q", c.systemsURI)
	}
	if c.systemsURI != "" && c.plug != "" {
		inv.Add(kit.ParamPlug, "give systems_uri or plug, not both")
	}
	if u := strings.TrimSuffix(strings.TrimSpace(p[ParamRedfishURI]), "/"); u != "" && u != "/redfish/v1" {
		inv.Add(ParamRedfishURI, "only /redfish/v1 is supported, got %q", p[ParamRedfishURI])
	}
	if c.insecure && c.caFile != "" {
		inv.Add(ParamSSLInsecure, "conflicts with ssl_ca_file: either verify against the CA or not at all")
	}
	if !c.ssl && (c.insecure || c.caFile != "") {
		inv.Add(ParamSSL, "ssl=0 (plain HTTP) conflicts with the TLS parameters given")
	}
	return c, inv.Err()
}

// Parse checks canonical parameters and returns them typed.
func (*Driver) Parse(params map[string]string) (any, error) { return parse(params) }

// DeviceKey is the BMC's address and the system.
func (*Driver) DeviceKey(t kit.Target) string {
	c, _ := kit.ParsedAs(t, parse) // the kit asks only for parsed targets
	sys := c.systemsURI
	if sys == "" {
		sys = "plug=" + c.plug
	}
	return "redfish/" + strings.ToLower(c.hostport) + sys
}

// Status reads PowerState: Off is OFF, On is ON, anything else UNKNOWN.
func (d *Driver) Status(ctx context.Context, t kit.Target) (driverv1.PowerState, error) {
	state := driverv1.PowerState_POWER_STATE_UNKNOWN
	err := d.withSystem(ctx, t, func(_ *config, sys *schemas.ComputerSystem) error {
		state = powerState(sys.PowerState)
		return nil
	})
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	return state, nil
}

func powerState(s schemas.PowerState) driverv1.PowerState {
	switch s {
	case schemas.OffPowerState:
		return driverv1.PowerState_POWER_STATE_OFF
	case schemas.OnPowerState:
		return driverv1.PowerState_POWER_STATE_ON
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN
}

// PowerOff resets the system with ForceOff unless it already reads Off.
func (d *Driver) PowerOff(ctx context.Context, t kit.Target) error {
	return d.reset(ctx, t, schemas.OffPowerState, schemas.ForceOffResetType)
}

// PowerOn resets the system with On (ForceOn if On is not allowed) unless it already reads On.
func (d *Driver) PowerOn(ctx context.Context, t kit.Target) error {
	return d.reset(ctx, t, schemas.OnPowerState, schemas.OnResetType, schemas.ForceOnResetType)
}

// reset posts the first allowed reset type of types, unless the system already reads want.
func (d *Driver) reset(ctx context.Context, t kit.Target, want schemas.PowerState, types ...schemas.ResetType) error {
	return d.withSystem(ctx, t, func(c *config, sys *schemas.ComputerSystem) error {
		return resetTo(ctx, c, sys, want, types)
	})
}

func resetTo(ctx context.Context, c *config, sys *schemas.ComputerSystem, want schemas.PowerState, types []schemas.ResetType) error {
	if sys.PowerState == want {
		return nil
	}
	rt := types[0]
	if allowed, err := sys.GetSupportedResetTypes(); err == nil && len(allowed) > 0 {
		i := slices.IndexFunc(types, func(t schemas.ResetType) bool { return slices.Contains(allowed, t) })
		if i < 0 {
			return fmt.Errorf("%w: system %s at %s allows reset types %v, none of %v", fault.ErrDevice, sys.ODataID, c.hostport, allowed, types)
		}
		rt = types[i]
	}
	if _, err := sys.Reset(rt); err != nil {
		return classify(ctx, c, "Reset "+string(rt)+" of "+sys.ODataID, err)
	}
	return nil
}

// List returns the systems of the service, with their power states.
func (d *Driver) List(ctx context.Context, t kit.Target) ([]*driverv1.Plug, error) {
	var plugs []*driverv1.Plug
	err := d.withClient(ctx, t, func(c *config, cl *client) error {
		systems, err := cl.api.WithContext(ctx).Service.Systems()
		if err != nil {
			return classify(ctx, c, "reading the Systems collection", err)
		}
		plugs = make([]*driverv1.Plug, 0, len(systems))
		for _, s := range systems {
			plugs = append(plugs, &driverv1.Plug{Id: s.ID, Name: s.ODataID, State: powerState(s.PowerState)})
		}
		return nil
	})
	return plugs, err
}

// Monitor connects and reads the target's system.
func (d *Driver) Monitor(ctx context.Context, t kit.Target) error {
	return d.withSystem(ctx, t, func(*config, *schemas.ComputerSystem) error { return nil })
}
