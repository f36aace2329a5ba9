// Package ipmi is the IPMI fence driver: it powers machines off and on through their BMC over
// IPMI v2.0 RMCP+ (lanplus), with the parameters of ClusterLabs fence_ipmilan.
//
// Only lanplus is supported (lanplus defaults to 1 here, unlike fence_ipmilan; lanplus=0 is
// rejected), and the cipher suite is always explicit (default 3): auto-negotiation stalls on BMCs
// that do not answer "Get Channel Cipher Suites", and cipher 0 (no authentication) is refused.
// Every operation opens its own session and closes it; opening one costs a few milliseconds.
package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// Canonical parameter names (fence_ipmilan's).
const (
	ParamLanplus = "lanplus"
	ParamCipher  = "cipher"
	ParamPrivlvl = "privlvl"
	// ParamTimeout is fence_ipmilan's ipmitool_timeout: seconds to wait for each IPMI request
	// before retransmitting (fractions allowed). The whole operation is bounded by the request's
	// timeout regardless.
	ParamTimeout = "ipmitool_timeout"
)

// closeTimeout bounds closing a session on a BMC that stopped answering.
const closeTimeout = 500 * time.Millisecond

// privileges maps fence_ipmilan's privlvl values to IPMI privilege levels.
var privileges = map[string]types.PrivilegeLevel{
	"callback":      types.PrivilegeLevelCallback,
	"user":          types.PrivilegeLevelUser,
	"operator":      types.PrivilegeLevelOperator,
	"administrator": types.PrivilegeLevelAdministrator,
}

// Driver is the IPMI fence driver. It holds no state; the zero value is ready to use.
type Driver struct{}

var (
	_ kit.Driver     = Driver{}
	_ kit.Monitorer  = Driver{}
	_ kit.Documented = Driver{}
)

// New returns the IPMI driver.
func New() kit.Driver { return Driver{} }

// Name is "ipmi".
func (Driver) Name() string { return "ipmi" }

// Description says what the driver controls.
func (Driver) Description() string {
	return "Powers machines off and on through their BMC over IPMI v2.0 RMCP+ (lanplus), like fence_ipmilan."
}

// Describe lists fence_ipmilan's parameters that this driver honours.
func (Driver) Describe() []*driverv1.Parameter {
	return []*driverv1.Parameter{
		{Name: kit.ParamIP, Aliases: []string{"ipaddr"}, Required: true, Type: kit.TypeString,
			Description: "IP address or hostname of the BMC"},
		{Name: kit.ParamIPPort, Type: kit.TypeInteger, Default: "623",
			Description: "UDP port of the BMC"},
		{Name: kit.ParamUsername, Aliases: []string{"login"}, Type: kit.TypeString,
			Description: "IPMI user name (at most 16 bytes; empty for the anonymous user)"},
		{Name: kit.ParamPassword, Aliases: []string{"passwd"}, Secret: true, Type: kit.TypeString,
			Description: "IPMI password (at most 20 bytes)"},
		{Name: ParamLanplus, Type: kit.TypeBoolean, Default: "1",
			Description: "use IPMI v2.0 RMCP+; only 1 is supported"},
		{Name: ParamCipher, Type: kit.TypeInteger, Default: "3",
			Description: "RMCP+ cipher suite (ipmitool -C), 1 to 19; 0 (no authentication) is refused"},
		{Name: ParamPrivlvl, Type: kit.TypeString, Default: "administrator",
			Description: "session privilege level: callback, user, operator or administrator"},
		{Name: ParamTimeout, Type: kit.TypeString, Default: "1",
			Description: "seconds to wait for each IPMI request before retrying it (like ipmitool -N)"},
	}
}

// config is a parsed target.
type config struct {
	host       string
	port       int
	user, pass string
	cipher     types.CipherSuiteID
	priv       types.PrivilegeLevel
	privName   string
	reqTimeout time.Duration
}

func (c config) addr() string { return net.JoinHostPort(c.host, strconv.Itoa(c.port)) }

// parse reads canonical parameters, naming every bad one.
func parse(p map[string]string) (config, error) {
	var inv fault.Invalid
	c := config{user: p[kit.ParamUsername], pass: p[kit.ParamPassword]}
	c.host, c.port = kit.ParseAddress(p, &inv, "BMC", "UDP")
	if len(c.user) > 16 {
		inv.Add(kit.ParamUsername, "at most 16 bytes in IPMI, got %d", len(c.user))
	}
	if len(c.pass) > 20 {
		inv.Add(kit.ParamPassword, "at most 20 bytes in IPMI v2.0")
	}
	if p[ParamLanplus] != "1" {
		inv.Add(ParamLanplus, "only lanplus (IPMI v2.0 RMCP+) is supported; IPMI v1.5 lan is not")
	}
	if cs, err := strconv.Atoi(p[ParamCipher]); err != nil || cs < 1 || cs > 19 {
		inv.Add(ParamCipher, "must be a cipher suite 1-19 (0 means no authentication and is refused), got %q", p[ParamCipher])
	} else {
		c.cipher = types.CipherSuiteID(cs)
	}
	c.privName = strings.ToLower(strings.TrimSpace(p[ParamPrivlvl]))
	if lvl, ok := privileges[c.privName]; ok {
		c.priv = lvl
	} else {
		inv.Add(ParamPrivlvl, "must be callback, user, operator or administrator, got %q", p[ParamPrivlvl])
	}
	// A BMC controls one machine: a plug would name something this device does not have, and
	// acting on the BMC anyway could power off the wrong machine.
	for _, name := range []string{"plug", "port", "port_as_ip"} {
		if v := strings.TrimSpace(p[name]); v != "" && !(name == "port_as_ip" && v == "0") {
			inv.Add(name, "a BMC controls one machine and has no plugs (got %q); address the BMC with ip", v)
		}
	}
	if d, err := kit.ParseSeconds(p[ParamTimeout], time.Millisecond, time.Minute); err != nil {
		inv.Add(ParamTimeout, "%v", err)
	} else {
		c.reqTimeout = d
	}
	return c, inv.Err()
}

// Parse checks canonical parameters and returns them typed.
func (Driver) Parse(params map[string]string) (any, error) { return parse(params) }

// DeviceKey is the BMC's address: one BMC controls one machine.
func (Driver) DeviceKey(t kit.Target) string {
	return "ipmi/" + net.JoinHostPort(strings.ToLower(strings.TrimSpace(t.Params[kit.ParamIP])), kit.KeyPart(t.Params[kit.ParamIPPort]))
}

// PowerOff sends Chassis Control "power down".
func (d Driver) PowerOff(ctx context.Context, t kit.Target) error {
	return d.chassisControl(ctx, t, chassis.ChassisControlPowerDown, "power down")
}

// PowerOn sends Chassis Control "power up".
func (d Driver) PowerOn(ctx context.Context, t kit.Target) error {
	return d.chassisControl(ctx, t, chassis.ChassisControlPowerUp, "power up")
}

func (Driver) chassisControl(ctx context.Context, t kit.Target, ctl chassis.ChassisControl, what string) error {
	return withSession(ctx, t, func(c *client.Client, cfg config) error {
		if _, err := c.ChassisControl(ctx, ctl); err != nil {
			return classify(ctx, cfg, "chassis control "+what, err)
		}
		return nil
	})
}

// Status reads Get Chassis Status: ON or OFF as the BMC reports it, UNKNOWN with an error when
// the BMC did not answer properly.
func (Driver) Status(ctx context.Context, t kit.Target) (driverv1.PowerState, error) {
	state := driverv1.PowerState_POWER_STATE_UNKNOWN
	err := withSession(ctx, t, func(c *client.Client, cfg config) error {
		resp, err := c.GetChassisStatus(ctx)
		if err != nil {
			return classify(ctx, cfg, "get chassis status", err)
		}
		if resp.PowerIsOn {
			state = driverv1.PowerState_POWER_STATE_ON
		} else {
			state = driverv1.PowerState_POWER_STATE_OFF
		}
		return nil
	})
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	return state, nil
}

// Monitor opens a session and reads the chassis status without changing power.
func (d Driver) Monitor(ctx context.Context, t kit.Target) error {
	_, err := d.Status(ctx, t)
	return err
}

// withSession opens an RMCP+ session for t, runs fn and closes the session.
func withSession(ctx context.Context, t kit.Target, fn func(*client.Client, config) error) error {
	cfg, err := kit.ParsedAs(t, parse)
	if err != nil {
		return err
	}
	c, err := client.NewClient(cfg.host, cfg.port, cfg.user, cfg.pass)
	if err != nil {
		return fmt.Errorf("IPMI client for %s: %w", cfg.addr(), err)
	}
	c.WithInterface(client.InterfaceLanplus).
		WithCipherSuiteID(cfg.cipher).
		WithMaxPrivilegeLevel(cfg.priv).
		WithTimeout(cfg.reqTimeout).
		WithRetry(client.DefaultLanplusRetries)
	if err := c.Connect(ctx); err != nil {
		// No session to close, but the UDP socket must be: close with an ended context so
		// nothing waits for the BMC.
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_ = c.Close(ended)
		return classify(ctx, cfg, "open session", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = c.Close(cctx)
	}()
	return fn(c, cfg)
}

// unreachable is the fault of a BMC that did not answer during what: fault.ErrNotSent while the
// session was being opened (no command that changes power can have left before the session), so
// the coordinator knows the operation did not happen and need not wait out read-backs of a dark
// BMC; fault.ErrUnreachable after (a chassis command may have reached the BMC).
func unreachable(what string) error {
	if what == "open session" {
		return fault.ErrNotSent
	}
	return fault.ErrUnreachable
}

// classify wraps a go-ipmi error in the fault sentinel it means, with a message an operator can
// act on. It never includes the password.
func classify(ctx context.Context, cfg config, what string, err error) error {
	var rs *types.RmcpStatusError
	var nerr net.Error
	deadline, hasDeadline := ctx.Deadline()
	switch {
	case ctx.Err() != nil, hasDeadline && !time.Now().Before(deadline):
		// A read that timed out at the deadline can return a moment before the context ends.
		return fmt.Errorf("IPMI %s on BMC %s: no answer before the deadline: %w", what, cfg.addr(), context.DeadlineExceeded)
	// go-ipmi v0.9.1 flattens session-setup errors to text (connect20 formats them with %v), so
	// the typed checks are backed by the texts of the same errors.
	case errors.Is(err, client.ErrRAKPAuthentication), strings.Contains(err.Error(), client.ErrRAKPAuthentication.Error()):
		return fmt.Errorf("%w: BMC %s rejected the password of user %q (RAKP authentication failed, cipher suite %d)",
			fault.ErrUnauthenticated, cfg.addr(), cfg.user, cfg.cipher)
	case errors.As(err, &rs):
		switch rs.StatusCode() {
		case types.RmcpStatusCodeUnauthorizedName, types.RmcpStatusCodeInvalidNameLength:
			return fmt.Errorf("%w: BMC %s does not know user %q (%v)", fault.ErrUnauthenticated, cfg.addr(), cfg.user, rs)
		case types.RmcpStatusCodeInvalidRole, types.RmcpStatusCodeUnauthorizedRoleOfPriLevel:
			return fmt.Errorf("%w: BMC %s refused privilege %s for user %q (%v)", fault.ErrUnauthenticated, cfg.addr(), cfg.privName, cfg.user, rs)
		case types.RmcpStatusCodeInvalidIntegrityCheckValue:
			return fmt.Errorf("%w: BMC %s rejected the credentials of user %q (%v)", fault.ErrUnauthenticated, cfg.addr(), cfg.user, rs)
		case types.RmcpStatusCodeNoCipherSuiteMatch, types.RmcpStatusCodeInvalidAuthAlg,
			types.RmcpStatusCodeInvalidIntegrityAlg, types.RmcpStatusCodeInvalidConfidentAlg:
			return fmt.Errorf("%w: BMC %s does not support cipher suite %d (%v)", fault.ErrFailedPrecondition, cfg.addr(), cfg.cipher, rs)
		}
		return fmt.Errorf("%w: IPMI %s on BMC %s refused: %v", fault.ErrDevice, what, cfg.addr(), rs)
	case strings.Contains(err.Error(), "Unauthorized name"):
		return fmt.Errorf("%w: BMC %s does not know user %q (RMCP+ status 0x0d: Unauthorized name)", fault.ErrUnauthenticated, cfg.addr(), cfg.user)
	case errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &nerr):
		return fmt.Errorf("%w: IPMI %s on BMC %s: %v", unreachable(what), what, cfg.addr(), err)
	case what == "open session":
		// Anything else while opening a session means the BMC never answered usefully.
		return fmt.Errorf("%w: IPMI %s on BMC %s: %v", fault.ErrNotSent, what, cfg.addr(), err)
	}
	return fmt.Errorf("%w: IPMI %s on BMC %s failed: %v", fault.ErrDevice, what, cfg.addr(), err)
}
