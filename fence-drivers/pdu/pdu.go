// Package pdu is the SNMP switched-PDU fence driver: it switches PDU outlets off and on over SNMP
// v1, v2c or v3, with the parameters of ClusterLabs fence_apc_snmp and fence_eaton_snmp.
//
// Supported models (device_type, or detected from sysObjectID): APC rPDU (AP79xx), APC rPDU2
// (AP8xxx, whose status values are the reverse of rPDU's), APC MasterSwitch, Eaton ePDU G2/G3
// (EATON-EPDU-MIB, which fence_eaton_snmp cannot drive), Eaton Managed ePDU and Eaton Switched
// (Pulizzi) ePDU. A plug is an outlet number or an outlet name.
//
// Unlike fence_apc_snmp, an outlet the PDU does not have is an invalid target, never "off": the
// driver reads the outlet's status before every command and refuses a plug with no status.
//
// SNMP sessions are kept per device and credentials and reused (kit.Pool), so SNMPv3 engine
// discovery happens once; an operation that failed drops its session, and a session unused for
// 30 s is closed.
package pdu

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gosnmp/gosnmp"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// Canonical parameter names (ClusterLabs').
const (
	ParamCommunity    = "community"
	ParamVersion      = "snmp_version"
	ParamAuthProt     = "snmp_auth_prot"
	ParamSecLevel     = "snmp_sec_level"
	ParamPrivProt     = "snmp_priv_prot"
	ParamPrivPasswd   = "snmp_priv_passwd"
	ParamDeviceType   = "device_type"
	ParamSNMPTimeout  = "snmp_timeout"
	ParamSNMPContext  = "snmp_context"
	defaultSNMPTimout = "1"
)

// Idle sessions: at most maxIdle per device and credentials, each closed after idleTimeout.
const (
	maxIdle     = 4
	idleTimeout = 30 * time.Second
)

var authProtocols = map[string]gosnmp.SnmpV3AuthProtocol{
	"MD5": gosnmp.MD5, "SHA": gosnmp.SHA, "SHA224": gosnmp.SHA224, "SHA256": gosnmp.SHA256,
	"SHA384": gosnmp.SHA384, "SHA512": gosnmp.SHA512,
}

var privProtocols = map[string]gosnmp.SnmpV3PrivProtocol{
	"DES": gosnmp.DES, "AES": gosnmp.AES, "AES128": gosnmp.AES, "AES192": gosnmp.AES192,
	"AES256": gosnmp.AES256, "AES192C": gosnmp.AES192C, "AES256C": gosnmp.AES256C,
}

var secLevels = map[string]gosnmp.SnmpV3MsgFlags{
	"noauthnopriv": gosnmp.NoAuthNoPriv, "authnopriv": gosnmp.AuthNoPriv, "authpriv": gosnmp.AuthPriv,
}

// Driver is the SNMP PDU fence driver. Use New; it keeps sessions and detected models.
type Driver struct {
	mu       sync.Mutex
	pool     *kit.Pool[*gosnmp.GoSNMP] // idle sessions by session key
	detected map[string]*profile       // device address -> model read from sysObjectID
	named    map[string]int            // device address + outlet name -> plug number, re-checked on use
}

var (
	_ kit.Driver     = (*Driver)(nil)
	_ kit.Lister     = (*Driver)(nil)
	_ kit.Monitorer  = (*Driver)(nil)
	_ kit.Documented = (*Driver)(nil)
)

// New returns the PDU driver.
func New() kit.Driver {
	return &Driver{pool: kit.NewPool(maxIdle, idleTimeout, closeSNMP), detected: map[string]*profile{}, named: map[string]int{}}
}

// Name is "pdu".
func (*Driver) Name() string { return "pdu" }

// Description says what the driver controls.
func (*Driver) Description() string {
	var models []string
	for _, p := range profiles {
		models = append(models, p.what)
	}
	return "Switches outlets of SNMP-managed PDUs off and on (SNMP v1, v2c, v3), like fence_apc_snmp and fence_eaton_snmp: " +
		strings.Join(models, "; ") + "."
}

// Describe lists the parameters, with ClusterLabs names and aliases.
func (*Driver) Describe() []*driverv1.Parameter {
	return []*driverv1.Parameter{
		{Name: kit.ParamIP, Aliases: []string{"ipaddr"}, Required: true, Type: kit.TypeString,
			Description: "IP address or hostname of the PDU"},
		{Name: kit.ParamIPPort, Type: kit.TypeInteger, Default: "161", Description: "UDP port of the PDU's SNMP agent"},
		{Name: kit.ParamPlug, Aliases: []string{"port"}, Required: true, Type: kit.TypeString,
			Description: "outlet number (as printed on the PDU, from 1) or outlet name"},
		{Name: ParamVersion, Type: kit.TypeString, Default: "1", Description: "SNMP version: 1, 2c or 3"},
		{Name: ParamCommunity, Secret: true, Type: kit.TypeString, Default: "private",
			Description: "SNMP v1/v2c community (needs write access)"},
		{Name: kit.ParamUsername, Aliases: []string{"login"}, Type: kit.TypeString, Description: "SNMPv3 user name"},
		{Name: kit.ParamPassword, Aliases: []string{"passwd"}, Secret: true, Type: kit.TypeString,
			Description: "SNMPv3 authentication passphrase"},
		{Name: ParamSecLevel, Type: kit.TypeString,
			Description: "SNMPv3 security level: noAuthNoPriv, authNoPriv or authPriv (default: from the passphrases given)"},
		{Name: ParamAuthProt, Type: kit.TypeString, Default: "MD5",
			Description: "SNMPv3 authentication protocol: MD5, SHA, SHA224, SHA256, SHA384 or SHA512"},
		{Name: ParamPrivProt, Type: kit.TypeString, Default: "DES",
			Description: "SNMPv3 privacy protocol: DES, AES (AES128), AES192, AES256 (Blumenthal key extension, as net-snmp), AES192C or AES256C (Reeder/Cisco)"},
		{Name: ParamPrivPasswd, Secret: true, Type: kit.TypeString, Description: "SNMPv3 privacy passphrase"},
		{Name: ParamSNMPContext, Type: kit.TypeString, Description: "SNMPv3 context name"},
		{Name: ParamDeviceType, Aliases: []string{"pdu_type"}, Type: kit.TypeString, Default: "auto",
			Description: "PDU model: " + strings.Join(profileNames(), ", ") + " (auto: from sysObjectID)"},
		{Name: ParamSNMPTimeout, Type: kit.TypeString, Default: defaultSNMPTimout,
			Description: "seconds to wait for each SNMP answer before retrying (fractions allowed); the operation's deadline bounds the retries"},
	}
}

// config is a parsed target.
type config struct {
	host    string
	port    int
	plugNum int    // > 0 when the plug is a number
	plug    string // as given
	model   *profile
	timeout time.Duration
	snmp    snmpParams
}

// snmpParams are the SNMP connection parameters of a target.
type snmpParams struct {
	Version            gosnmp.SnmpVersion
	Community          string
	MsgFlags           gosnmp.SnmpV3MsgFlags
	SecurityParameters *gosnmp.UsmSecurityParameters // nil for v1 and v2c
	ContextName        string
}

func (c *config) addr() string { return net.JoinHostPort(c.host, strconv.Itoa(c.port)) }

// parse reads canonical parameters, naming every bad one.
func parse(p map[string]string) (*config, error) {
	var inv fault.Invalid
	c := &config{plug: strings.TrimSpace(p[kit.ParamPlug])}
	c.host, c.port = kit.ParseAddress(p, &inv, "PDU", "UDP")
	switch n, err := strconv.Atoi(c.plug); {
	case c.plug == "":
		inv.Add(kit.ParamPlug, "required: outlet number or name")
	case err == nil && n < 1:
		inv.Add(kit.ParamPlug, "outlet numbers start at 1, got %d", n)
	case err == nil:
		c.plugNum = n
	}
	switch dt := strings.ToLower(strings.TrimSpace(p[ParamDeviceType])); dt {
	case "", "auto":
	default:
		if c.model = profileByName(dt); c.model == nil {
			inv.Add(ParamDeviceType, "unknown PDU model %q (known: %s)", dt, strings.Join(profileNames(), ", "))
		}
	}
	if d, err := kit.ParseSeconds(p[ParamSNMPTimeout], 10*time.Millisecond, time.Minute); err != nil {
		inv.Add(ParamSNMPTimeout, "%v", err)
	} else {
		c.timeout = d
	}
	g := &c.snmp
	switch v := strings.ToLower(strings.TrimSpace(p[ParamVersion])); v {
	case "1":
		g.Version = gosnmp.Version1
	case "2c", "2":
		g.Version = gosnmp.Version2c
	case "3":
		g.Version = gosnmp.Version3
	default:
		inv.Add(ParamVersion, "must be 1, 2c or 3, got %q", p[ParamVersion])
	}
	if g.Version != gosnmp.Version3 {
		g.Community = p[ParamCommunity]
		if g.Community == "" {
			inv.Add(ParamCommunity, "required for SNMP v1 and v2c")
		}
		return c, inv.Err()
	}
	g.MsgFlags, g.SecurityParameters = parseV3(p, &inv)
	g.ContextName = p[ParamSNMPContext]
	return c, inv.Err()
}

// parseV3 reads the SNMPv3 user, security level, protocols and passphrases.
func parseV3(p map[string]string, inv *fault.Invalid) (gosnmp.SnmpV3MsgFlags, *gosnmp.UsmSecurityParameters) {
	usm := &gosnmp.UsmSecurityParameters{UserName: p[kit.ParamUsername]}
	if usm.UserName == "" {
		inv.Add(kit.ParamUsername, "required for SNMPv3")
	}
	level := strings.ToLower(strings.TrimSpace(p[ParamSecLevel]))
	if level == "" { // like net-snmp given -A and -X: the passphrases say the level
		level = "noauthnopriv"
		if p[kit.ParamPassword] != "" {
			level = "authnopriv"
			if p[ParamPrivPasswd] != "" {
				level = "authpriv"
			}
		}
	}
	flags, ok := secLevels[level]
	if !ok {
		inv.Add(ParamSecLevel, "must be noAuthNoPriv, authNoPriv or authPriv, got %q", p[ParamSecLevel])
	}
	if flags != gosnmp.NoAuthNoPriv {
		usm.AuthenticationPassphrase = p[kit.ParamPassword]
		if len(usm.AuthenticationPassphrase) < 8 {
			inv.Add(kit.ParamPassword, "the SNMPv3 authentication passphrase must have at least 8 characters for %s", p[ParamSecLevel])
		}
		if usm.AuthenticationProtocol, ok = authProtocols[strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(p[ParamAuthProt]), "-", ""))]; !ok {
			inv.Add(ParamAuthProt, "must be MD5, SHA, SHA224, SHA256, SHA384 or SHA512, got %q", p[ParamAuthProt])
		}
	}
	if flags == gosnmp.AuthPriv {
		usm.PrivacyPassphrase = p[ParamPrivPasswd]
		if len(usm.PrivacyPassphrase) < 8 {
			inv.Add(ParamPrivPasswd, "the SNMPv3 privacy passphrase must have at least 8 characters for authPriv")
		}
		if usm.PrivacyProtocol, ok = privProtocols[strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(p[ParamPrivProt]), "-", ""))]; !ok {
			inv.Add(ParamPrivProt, "must be DES, AES, AES192, AES256, AES192C or AES256C, got %q", p[ParamPrivProt])
		}
	}
	return flags, usm
}

// Parse checks canonical parameters and returns them typed.
func (*Driver) Parse(params map[string]string) (any, error) { return parse(params) }

// DeviceKey is the PDU's address and the plug: one outlet is one fenceable thing. An outlet
// number is keyed by its value ("07" and "7" are one outlet, locked and epoch-checked as one); an
// outlet name is keyed as written here; mutations resolve it to its number first (ResolveTarget).
func (*Driver) DeviceKey(t kit.Target) string {
	host := strings.ToLower(strings.TrimSpace(t.Params[kit.ParamIP]))
	return "pdu/" + net.JoinHostPort(host, kit.KeyPart(t.Params[kit.ParamIPPort])) + "/" + kit.KeyPart(t.Params[kit.ParamPlug])
}

// ResolveTarget names an outlet given by name by its number (kit.TargetResolver), so that the
// epoch and lock of outlet 7 are one whether a caller writes "7" or the outlet's name, and the
// outlet switched is the one locked even if it is renamed meanwhile.
func (d *Driver) ResolveTarget(ctx context.Context, t kit.Target) (kit.Target, error) {
	c, err := kit.ParsedAs(t, parse)
	if err != nil {
		return kit.Target{}, err
	}
	if c.plugNum > 0 {
		return t, nil
	}
	var plug int
	if err := d.withSession(ctx, t, func(_ *session, o outlet) error { plug = o.plug; return nil }); err != nil {
		return kit.Target{}, err
	}
	r := kit.Target{Name: t.Name, Params: maps.Clone(t.Params)}
	r.Params[kit.ParamPlug] = strconv.Itoa(plug)
	if r.Parsed, err = parse(r.Params); err != nil {
		return kit.Target{}, err
	}
	return r, nil
}

// withDevice opens a session for t bound to ctx, runs fn and gives the session back.
func (d *Driver) withDevice(ctx context.Context, t kit.Target, fn func(*session) error) error {
	c, err := kit.ParsedAs(t, parse)
	if err != nil {
		return err
	}
	s, err := d.open(ctx, c)
	if err != nil {
		return err
	}
	defer s.close()
	return fn(s)
}

// withSession opens a session for t bound to ctx, resolves the outlet and runs fn.
func (d *Driver) withSession(ctx context.Context, t kit.Target, fn func(*session, outlet) error) error {
	return d.withDevice(ctx, t, func(s *session) error {
		o, err := s.resolve()
		if err != nil {
			return err
		}
		return fn(s, o)
	})
}

func (d *Driver) switchTo(ctx context.Context, t kit.Target, want driverv1.PowerState) error {
	return d.withSession(ctx, t, func(s *session, o outlet) error {
		// The outlet must exist before anything is written (a missing outlet is no "off").
		if _, err := s.readState(o); err != nil {
			return err
		}
		oid, v := o.model.controlFor(o.index, want)
		return s.set(fmt.Sprintf("outlet %d %s", o.plug, map[bool]string{true: "off", false: "on"}[want == driverv1.PowerState_POWER_STATE_OFF]), oid, v)
	})
}

// PowerOff switches the outlet off.
func (d *Driver) PowerOff(ctx context.Context, t kit.Target) error {
	return d.switchTo(ctx, t, driverv1.PowerState_POWER_STATE_OFF)
}

// PowerOn switches the outlet on.
func (d *Driver) PowerOn(ctx context.Context, t kit.Target) error {
	return d.switchTo(ctx, t, driverv1.PowerState_POWER_STATE_ON)
}

// Status reads the outlet's state: ON or OFF as the PDU reports it, UNKNOWN for pending or odd
// values, an error when the PDU did not answer or has no such outlet.
func (d *Driver) Status(ctx context.Context, t kit.Target) (driverv1.PowerState, error) {
	state := driverv1.PowerState_POWER_STATE_UNKNOWN
	err := d.withSession(ctx, t, func(s *session, o outlet) error {
		var err error
		state, err = s.readState(o)
		return err
	})
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	return state, nil
}

// List returns the PDU's outlets with their names and states.
func (d *Driver) List(ctx context.Context, t kit.Target) ([]*driverv1.Plug, error) {
	var plugs []*driverv1.Plug
	err := d.withDevice(ctx, t, func(s *session) error {
		m, err := s.model()
		if err != nil {
			return err
		}
		if plugs, err = s.walkNames(m); err != nil {
			return err
		}
		// One try per outlet: an outlet that does not answer is listed as unknown rather than
		// holding the whole list until the deadline.
		s.g.Retries = 0
		for _, p := range plugs {
			n, _ := strconv.Atoi(p.GetId())
			st, err := s.readState(outlet{m, n, m.index(n)})
			if err != nil {
				st = driverv1.PowerState_POWER_STATE_UNKNOWN
			}
			p.State = st
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(plugs, func(a, b *driverv1.Plug) int {
		x, _ := strconv.Atoi(a.GetId())
		y, _ := strconv.Atoi(b.GetId())
		return x - y
	})
	return plugs, nil
}

// Monitor reads sysObjectID (and detects the model) without changing power.
func (d *Driver) Monitor(ctx context.Context, t kit.Target) error {
	return d.withDevice(ctx, t, func(s *session) error {
		if _, err := s.get("sysObjectID", ".1.3.6.1.2.1.1.2.0"); err != nil {
			return err
		}
		_, err := s.model()
		return err
	})
}
