// Package brocade is the Brocade Fibre Channel switch fence driver: storage isolation by
// disabling the switch port a node's HBA is cabled to, with the parameters of ClusterLabs
// fence_brocade.
//
// "Off" is the port persistently disabled (the node is cut off from its storage), "on" is the port
// enabled. The driver logs in over telnet (options refused, so the switch stays a plain NVT) or
// SSH (password or identity_file, pty and shell), runs `portCfgPersistentDisable N` or
// `portCfgPersistentEnable N`, and reads the state back from `switchshow`: a port is off exactly
// when the column after Proto of its row says "Disabled". A port the switch does not list is an
// invalid target, never off.
//
// SSH host keys are checked: a pinned key (ssh_host_key), or a known_hosts file where an unknown
// switch's key is recorded on first use and a changed key is refused (accept-new). Only the
// explicit ssh_insecure=1 accepts any key.
//
// Logged-in sessions are kept per switch and credentials for a short idle time and reused: a
// read-back costs one `switchshow`, not a login.
package brocade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// Canonical parameter names (ClusterLabs' where fence_brocade has one).
const (
	ParamIdentityFile  = "identity_file"
	ParamSSH           = "ssh"
	ParamCommandPrompt = "command_prompt"
	// ParamSSHHostKey pins the switch's SSH host key (authorized_keys format or SHA256:
	// fingerprint).
	ParamSSHHostKey = "ssh_host_key"
	// ParamSSHKnownHosts is the known_hosts file for accept-new.
	ParamSSHKnownHosts = "ssh_known_hosts"
	// ParamSSHInsecure accepts any SSH host key; for tests only.
	ParamSSHInsecure = "ssh_insecure"
)

// Config configures the driver. Zero fields take the defaults documented on each field.
type Config struct {
	// KnownHostsFile is the known_hosts file used for SSH targets that pin no key and name no
	// file (accept-new). Empty: such targets are invalid.
	KnownHostsFile string
	// IdleTimeout is how long a logged-in session is kept for reuse. Default 10 s; negative
	// disables reuse.
	IdleTimeout time.Duration
	// Log receives host-key and session events. Default slog.Default().
	Log *slog.Logger
}

// Driver is the Brocade FC switch driver. Use New or NewWith.
type Driver struct {
	cfg  Config
	pool *kit.Pool[*session] // logged-in sessions by session key
}

var (
	_ kit.Driver     = (*Driver)(nil)
	_ kit.Lister     = (*Driver)(nil)
	_ kit.Monitorer  = (*Driver)(nil)
	_ kit.Documented = (*Driver)(nil)
)

// New returns the driver with no default known_hosts file.
func New() kit.Driver { return NewWith(Config{}) }

// NewWith returns the driver configured by cfg.
func NewWith(cfg Config) *Driver {
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Driver{cfg: cfg, pool: kit.NewPool(maxIdle, cfg.IdleTimeout, (*session).close)}
}

// Name is "brocade".
func (*Driver) Name() string { return "brocade" }

// Description says what the driver controls.
func (*Driver) Description() string {
	return "Isolates nodes from Fibre Channel storage by disabling their Brocade switch port (portCfgPersistentDisable), " +
		"over telnet or SSH, like fence_brocade; status and verification read switchshow."
}

// Describe lists the parameters, with ClusterLabs names and aliases.
func (d *Driver) Describe() []*driverv1.Parameter {
	kh := "known_hosts file: an unknown switch key is recorded on first use, a changed key is refused"
	if d.cfg.KnownHostsFile != "" {
		kh += " (default " + d.cfg.KnownHostsFile + ")"
	}
	return []*driverv1.Parameter{
		{Name: kit.ParamIP, Aliases: []string{"ipaddr"}, Required: true, Type: kit.TypeString,
			Description: "IP address or hostname of the switch"},
		{Name: kit.ParamIPPort, Type: kit.TypeInteger, Description: "TCP port (default 23, or 22 with ssh)"},
		{Name: kit.ParamUsername, Aliases: []string{"login"}, Required: true, Type: kit.TypeString,
			Description: "switch login name"},
		{Name: kit.ParamPassword, Aliases: []string{"passwd"}, Secret: true, Type: kit.TypeString,
			Description: "switch password (required for telnet; for SSH unless identity_file is given)"},
		{Name: ParamIdentityFile, Type: kit.TypeString, Description: "SSH private key file (PEM or OpenSSH format, unencrypted)"},
		{Name: kit.ParamPlug, Aliases: []string{"port"}, Required: true, Type: kit.TypeString,
			Description: "switch port index (the Index column of switchshow) the node's HBA is cabled to"},
		{Name: ParamSSH, Aliases: []string{"secure"}, Type: kit.TypeBoolean, Default: "0",
			Description: "use SSH instead of telnet"},
		{Name: ParamSSHHostKey, Type: kit.TypeString,
			Description: "pinned SSH host key of the switch: an authorized_keys line (ssh-ed25519 AAAA...) or a SHA256: fingerprint"},
		{Name: ParamSSHKnownHosts, Type: kit.TypeString, Default: d.cfg.KnownHostsFile, Description: kh},
		{Name: ParamSSHInsecure, Type: kit.TypeBoolean, Default: "0",
			Description: "accept any SSH host key (tests only: a man in the middle could take the password)"},
		{Name: ParamCommandPrompt, Aliases: []string{"cmd_prompt"}, Type: kit.TypeString, Default: "> ",
			Description: "the end of the switch's command prompt"},
	}
}

// Parse checks canonical parameters and returns them typed. It reads no file: the SSH identity
// file is read at each login (withSession), so that checking a configuration offline touches nothing.
func (d *Driver) Parse(params map[string]string) (any, error) { return d.parse(params) }

// DeviceKey is the switch's address and the port index.
func (*Driver) DeviceKey(t kit.Target) string {
	port := t.Params[kit.ParamIPPort]
	if port == "" {
		port = "23"
		if t.Params[ParamSSH] == "1" {
			port = "22"
		}
	}
	return "brocade/" + net.JoinHostPort(strings.ToLower(strings.TrimSpace(t.Params[kit.ParamIP])), kit.KeyPart(port)) + "/" + kit.KeyPart(t.Params[kit.ParamPlug])
}

// sessionKey identifies a session's connection parameters, secrets included (hashed, kept in
// memory only).
func sessionKey(c *config, p map[string]string) string {
	return kit.SessionKey(c.addr(), c.username, c.password, c.ssh, c.prompt, c.policy, p[ParamIdentityFile])
}

// maxIdle bounds the idle sessions kept per switch and credentials: switches allow few sessions.
const maxIdle = 2

// withSession parses t once and runs fn on a logged-in session: an idle one if there is one
// (retried once on a fresh session if the idle one turns out dead), else a new one. The session
// is kept for reuse when fn succeeds.
func (d *Driver) withSession(ctx context.Context, t kit.Target, fn func(*session, *config) error) error {
	c, err := kit.ParsedAs(t, d.parse)
	if err != nil {
		return err
	}
	if c, err = withIdentity(c); err != nil {
		return err
	}
	key := sessionKey(c, t.Params)
	if s, ok := d.pool.Get(key); ok {
		err := fn(s, c)
		d.pool.Put(key, s, err == nil)
		if err == nil || !errors.Is(err, fault.ErrUnreachable) || ctx.Err() != nil {
			return err
		}
		d.cfg.Log.Debug("brocade: reused session failed, logging in again", "switch", c.addr(), "err", err)
	}
	s, err := dial(ctx, c)
	if err != nil {
		return err
	}
	err = fn(s, c)
	d.pool.Put(key, s, err == nil)
	return err
}

// Close logs out of every idle session.
func (d *Driver) Close() { d.pool.Close() }

// ports runs switchshow on s and returns its rows.
func ports(ctx context.Context, s *session, addr string) ([]PortRow, error) {
	out, err := s.command(ctx, "switchshow")
	if err != nil {
		return nil, err
	}
	rows, err := ParseSwitchshow(out)
	if err != nil {
		return nil, fmt.Errorf("%w: switch %s: %w", fault.ErrDevice, addr, err)
	}
	return rows, nil
}

// port returns the row of port n, or a fault.Invalid naming the plug.
func port(rows []PortRow, n int, addr string) (PortRow, error) {
	for _, r := range rows {
		if r.Index == n {
			return r, nil
		}
	}
	return PortRow{}, fault.FieldError{Field: kit.ParamPlug, Problem: fmt.Sprintf("switch %s has no port with index %d (switchshow lists %d ports)", addr, n, len(rows))}
}

// targetPort reads switchshow and returns the target port's row.
func targetPort(ctx context.Context, s *session, c *config) (PortRow, error) {
	rows, err := ports(ctx, s, c.addr())
	if err != nil {
		return PortRow{}, err
	}
	return port(rows, c.plug, c.addr())
}

// Status reads the port's row of switchshow: OFF when it says Disabled.
func (d *Driver) Status(ctx context.Context, t kit.Target) (driverv1.PowerState, error) {
	st := driverv1.PowerState_POWER_STATE_UNKNOWN
	err := d.withSession(ctx, t, func(s *session, c *config) error {
		r, err := targetPort(ctx, s, c)
		if err != nil {
			return err
		}
		st = driverv1.PowerState_POWER_STATE_ON
		if r.Disabled {
			st = driverv1.PowerState_POWER_STATE_OFF
		}
		return nil
	})
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	return st, nil
}

// PowerOff persistently disables the port (isolation).
func (d *Driver) PowerOff(ctx context.Context, t kit.Target) error {
	return d.set(ctx, t, true)
}

// PowerOn persistently enables the port.
func (d *Driver) PowerOn(ctx context.Context, t kit.Target) error {
	return d.set(ctx, t, false)
}

// set checks that the port exists, then sends the command unless the port is already in the
// wanted state. The kit verifies the effect by reading switchshow again.
func (d *Driver) set(ctx context.Context, t kit.Target, disable bool) error {
	return d.withSession(ctx, t, func(s *session, c *config) error {
		r, err := targetPort(ctx, s, c)
		if err != nil {
			return err
		}
		if r.Disabled == disable {
			return nil
		}
		cmd := "portCfgPersistentEnable " + strconv.Itoa(c.plug)
		if disable {
			cmd = "portCfgPersistentDisable " + strconv.Itoa(c.plug)
		}
		out, err := s.command(ctx, cmd)
		if err != nil {
			return err
		}
		if commandFailed(out) {
			return fmt.Errorf("%w: switch %s: %s: %s", fault.ErrDevice, c.addr(), cmd, firstLine(out))
		}
		return nil
	})
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// List returns the switch's ports, with their state.
func (d *Driver) List(ctx context.Context, t kit.Target) ([]*driverv1.Plug, error) {
	var plugs []*driverv1.Plug
	err := d.withSession(ctx, t, func(s *session, c *config) error {
		rows, err := ports(ctx, s, c.addr())
		if err != nil {
			return err
		}
		for _, r := range rows {
			st := driverv1.PowerState_POWER_STATE_ON
			if r.Disabled {
				st = driverv1.PowerState_POWER_STATE_OFF
			}
			plugs = append(plugs, &driverv1.Plug{Id: strconv.Itoa(r.Index), Name: r.State, State: st})
		}
		return nil
	})
	return plugs, err
}

// Monitor logs in and runs switchshow.
func (d *Driver) Monitor(ctx context.Context, t kit.Target) error {
	return d.withSession(ctx, t, func(s *session, c *config) error {
		_, err := ports(ctx, s, c.addr())
		return err
	})
}
