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
// SNMP sessions are kept per device and credentials and reused, so SNMPv3 engine discovery
// happens once; an operation that failed drops its session.
package pdu

import (
	"context"
	"errors"
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
	c := &config{host: strings.TrimSpace(p[kit.ParamIP]), plug: strings.TrimSpace(p[kit.ParamPlug])}
	if c.host == "" {
		inv.Add(kit.ParamIP, "required: IP address or hostname of the PDU")
	} else if strings.ContainsAny(c.host, " /") {
		inv.Add(kit.ParamIP, "%q is not an IP address or hostname", c.host)
	}
	if port, err := strconv.Atoi(p[kit.ParamIPPort]); err != nil || port < 1 || port > 65535 {
		inv.Add(kit.ParamIPPort, "must be a UDP port 1-65535, got %q", p[kit.ParamIPPort])
	} else {
		c.port = port
	}
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
	g.MsgFlags, g.SecurityParameters = flags, usm
	g.ContextName = p[ParamSNMPContext]
	return c, inv.Err()
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

// sessionKey identifies a session's connection parameters, secrets included (hashed, kept in
// memory only).
func sessionKey(c *config) string {
	g := &c.snmp
	parts := []any{c.addr(), g.Version, g.MsgFlags, g.Community, g.ContextName, c.timeout}
	if u := g.SecurityParameters; u != nil {
		parts = append(parts, u.UserName, u.AuthenticationProtocol, u.AuthenticationPassphrase, u.PrivacyProtocol, u.PrivacyPassphrase)
	}
	return kit.SessionKey(parts...)
}

// session is one SNMP client in use by one operation.
type session struct {
	d   *Driver
	c   *config
	g   *gosnmp.GoSNMP
	key string
	bad bool // a failed request: do not reuse
}

// open takes an idle session for c or connects a new one, bound to ctx.
func (d *Driver) open(ctx context.Context, c *config) (*session, error) {
	key := sessionKey(c)
	g, ok := d.pool.Get(key)
	if !ok {
		p := &c.snmp
		g = &gosnmp.GoSNMP{
			Target: c.host, Port: uint16(c.port), Transport: "udp", MaxOids: gosnmp.MaxOids,
			Version: p.Version, Community: p.Community, MsgFlags: p.MsgFlags, ContextName: p.ContextName,
		}
		if p.SecurityParameters != nil {
			g.SecurityModel = gosnmp.UserSecurityModel
			g.SecurityParameters = p.SecurityParameters.Copy()
		}
		g.Timeout = c.timeout
		g.Context = ctx
		if err := g.Connect(); err != nil {
			return nil, fmt.Errorf("%w: SNMP to PDU %s: %v", fault.ErrUnreachable, c.addr(), err)
		}
	}
	g.Context = ctx
	g.Timeout = c.timeout
	g.ExponentialTimeout = false
	// Retry until the operation's deadline rather than giving up early: a PDU that does not
	// answer in time is reported as a deadline, not guessed at.
	g.Retries = 2
	if dl, ok := ctx.Deadline(); ok {
		g.Retries = max(0, min(1000, int(time.Until(dl)/c.timeout)+1))
	}
	return &session{d: d, c: c, g: g, key: key}, nil
}

// close returns a healthy session to the pool and closes a failed one.
func (s *session) close() {
	s.g.Context = context.Background()
	s.d.pool.Put(s.key, s.g, !s.bad)
}

func closeSNMP(g *gosnmp.GoSNMP) { _ = g.Conn.Close() }

// Close closes every idle session.
func (d *Driver) Close() { d.pool.Close() }

// get reads oids; a transport or security failure marks the session bad.
func (s *session) get(what string, oids ...string) ([]gosnmp.SnmpPDU, error) {
	r, err := s.g.Get(oids)
	if err != nil {
		s.bad = true
		return nil, s.classify(what, err)
	}
	if r.Error != gosnmp.NoError {
		if r.Error == gosnmp.NoSuchName { // SNMPv1's "no such object"
			return noSuch(oids), nil
		}
		return nil, fmt.Errorf("%w: SNMP GET %s on PDU %s: %s", fault.ErrDevice, what, s.c.addr(), r.Error)
	}
	if len(r.Variables) != len(oids) {
		s.bad = true
		return nil, fmt.Errorf("%w: SNMP GET %s on PDU %s: %d values for %d OIDs", fault.ErrDevice, what, s.c.addr(), len(r.Variables), len(oids))
	}
	return r.Variables, nil
}

func noSuch(oids []string) []gosnmp.SnmpPDU {
	out := make([]gosnmp.SnmpPDU, len(oids))
	for i, o := range oids {
		out[i] = gosnmp.SnmpPDU{Name: o, Type: gosnmp.NoSuchInstance}
	}
	return out
}

// set writes one integer.
func (s *session) set(what, oid string, v int) error {
	r, err := s.g.Set([]gosnmp.SnmpPDU{{Name: oid, Type: gosnmp.Integer, Value: v}})
	if err != nil {
		s.bad = true
		return s.classify(what, err)
	}
	switch r.Error {
	case gosnmp.NoError:
		return nil
	case gosnmp.NoAccess, gosnmp.AuthorizationError, gosnmp.NotWritable, gosnmp.ReadOnly:
		return fmt.Errorf("%w: PDU %s refused SNMP SET %s with %s: the community or user has no write access", fault.ErrUnauthenticated, s.c.addr(), what, r.Error)
	case gosnmp.NoSuchName:
		// SNMPv1 answers a SET with a read-only community so; the outlet's existence was
		// checked by a GET just before.
		return fmt.Errorf("%w: PDU %s refused SNMP SET %s with noSuchName (SNMPv1's answer when the community has no write access)", fault.ErrUnauthenticated, s.c.addr(), what)
	}
	return fmt.Errorf("%w: PDU %s refused SNMP SET %s: %s", fault.ErrDevice, s.c.addr(), what, r.Error)
}

// classify wraps a gosnmp error in the fault sentinel it means, never quoting a secret.
func (s *session) classify(what string, err error) error {
	c, ctx := s.c, s.g.Context
	switch {
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
		hint := " (many agents do not answer a wrong community at all)"
		if c.snmp.Version == gosnmp.Version3 {
			hint = " (many agents do not answer an unknown SNMPv3 user or a wrong privacy passphrase at all)"
		}
		return fmt.Errorf("SNMP %s on PDU %s: no answer before the deadline%s: %w", what, c.addr(), hint, context.DeadlineExceeded)
	case errors.Is(err, gosnmp.ErrWrongDigest), strings.Contains(err.Error(), "not authentic"):
		// The agent's report of a wrong digest cannot be authenticated with our key either.
		return fmt.Errorf("%w: PDU %s rejected the authentication passphrase of SNMPv3 user %q (wrong digest)", fault.ErrUnauthenticated, c.addr(), s.user())
	case errors.Is(err, gosnmp.ErrUnknownUsername):
		return fmt.Errorf("%w: PDU %s does not know SNMPv3 user %q", fault.ErrUnauthenticated, c.addr(), s.user())
	case errors.Is(err, gosnmp.ErrDecryption):
		return fmt.Errorf("%w: PDU %s could not decrypt the request of SNMPv3 user %q (wrong privacy passphrase or protocol)", fault.ErrUnauthenticated, c.addr(), s.user())
	case errors.Is(err, gosnmp.ErrUnknownSecurityLevel):
		return fmt.Errorf("%w: PDU %s does not accept security level %s for SNMPv3 user %q", fault.ErrUnauthenticated, c.addr(), c.snmp.MsgFlags, s.user())
	}
	return fmt.Errorf("%w: SNMP %s on PDU %s: %v", fault.ErrUnreachable, what, c.addr(), err)
}

func (s *session) user() string {
	if u := s.c.snmp.SecurityParameters; u != nil {
		return u.UserName
	}
	return ""
}

// model returns the forced or detected PDU model; detections are cached per device address.
func (s *session) model() (*profile, error) {
	if s.c.model != nil {
		return s.c.model, nil
	}
	s.d.mu.Lock()
	p := s.d.detected[s.c.addr()]
	s.d.mu.Unlock()
	if p != nil {
		return p, nil
	}
	v, err := s.get("sysObjectID", ".1.3.6.1.2.1.1.2.0")
	if err != nil {
		return nil, err
	}
	oid, ok := v[0].Value.(string)
	if v[0].Type != gosnmp.ObjectIdentifier || !ok {
		return nil, fmt.Errorf("%w: PDU %s has no sysObjectID to detect its model; set %s", fault.ErrFailedPrecondition, s.c.addr(), ParamDeviceType)
	}
	if p = profileByObjectID(oid); p == nil {
		return nil, fmt.Errorf("%w: PDU %s reports sysObjectID %s, which is not a supported model; set %s to one of %s if it is compatible",
			fault.ErrFailedPrecondition, s.c.addr(), oid, ParamDeviceType, strings.Join(profileNames()[1:], ", "))
	}
	s.d.mu.Lock()
	s.d.detected[s.c.addr()] = p
	s.d.mu.Unlock()
	return p, nil
}

// outlet is a resolved plug.
type outlet struct {
	model *profile
	plug  int // plug number
	index int // OID index
}

// resolve finds the target's outlet: a number is used as is (its existence is checked by the
// status read), a name is looked up in the outlet-name column.
func (s *session) resolve() (outlet, error) {
	m, err := s.model()
	if err != nil {
		return outlet{}, err
	}
	if s.c.plugNum > 0 {
		return outlet{m, s.c.plugNum, m.index(s.c.plugNum)}, nil
	}
	// A name found before is re-checked with one GET of that outlet's name, so a renamed
	// outlet is never switched under its old name and a walk is needed only once.
	cacheKey := s.c.addr() + "\x00" + m.name + "\x00" + s.c.plug
	s.d.mu.Lock()
	n, cached := s.d.named[cacheKey]
	s.d.mu.Unlock()
	if cached {
		v, err := s.get("outlet name", m.nameOID(m.index(n)))
		if err != nil {
			return outlet{}, err
		}
		if b, ok := v[0].Value.([]byte); ok && v[0].Type == gosnmp.OctetString && string(b) == s.c.plug {
			return outlet{m, n, m.index(n)}, nil
		}
	}
	plugs, err := s.walkNames(m)
	if err != nil {
		return outlet{}, err
	}
	var found []int
	for _, p := range plugs {
		if p.GetName() == s.c.plug {
			n, _ := strconv.Atoi(p.GetId())
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		var inv fault.Invalid
		inv.Add(kit.ParamPlug, "PDU %s (%s) has no outlet named %q", s.c.addr(), m.name, s.c.plug)
		return outlet{}, inv.Err()
	case 1:
		s.d.mu.Lock()
		s.d.named[cacheKey] = found[0]
		s.d.mu.Unlock()
		return outlet{m, found[0], m.index(found[0])}, nil
	}
	var inv fault.Invalid
	inv.Add(kit.ParamPlug, "PDU %s has %d outlets named %q (%v): give the outlet number", s.c.addr(), len(found), s.c.plug, found)
	return outlet{}, inv.Err()
}

// walkNames lists the outlets from the model's name column.
func (s *session) walkNames(m *profile) ([]*driverv1.Plug, error) {
	// GETNEXT, not GETBULK: a bulk answer runs on past the name column into the state
	// columns, so one outlet that does not answer would sink the whole list.
	pdus, err := s.g.WalkAll(m.names)
	if err != nil {
		s.bad = true
		return nil, s.classify("walk of the outlet names", err)
	}
	var plugs []*driverv1.Plug
	for _, p := range pdus {
		n, ok := m.plugFromNameRow(p.Name)
		if !ok || n < 1 {
			continue
		}
		name := ""
		if b, ok := p.Value.([]byte); ok {
			name = string(b)
		}
		plugs = append(plugs, &driverv1.Plug{Id: strconv.Itoa(n), Name: name})
	}
	return plugs, nil
}

// readState reads the outlet's status. A missing status OID means the PDU has no such outlet.
func (s *session) readState(o outlet) (driverv1.PowerState, error) {
	v, err := s.get("outlet status", o.model.status(o.index))
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	switch v[0].Type {
	case gosnmp.NoSuchInstance, gosnmp.NoSuchObject, gosnmp.EndOfMibView, gosnmp.Null:
		var inv fault.Invalid
		inv.Add(kit.ParamPlug, "PDU %s (%s) has no outlet %s", s.c.addr(), o.model.name, s.c.plug)
		return driverv1.PowerState_POWER_STATE_UNKNOWN, inv.Err()
	case gosnmp.Integer:
		// Pending, cycling or error values map to UNKNOWN: in doubt, never off.
		return o.model.state(int(gosnmp.ToBigInt(v[0].Value).Int64())), nil
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN, fmt.Errorf("%w: PDU %s answered the outlet status with a %s", fault.ErrDevice, s.c.addr(), v[0].Type)
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
