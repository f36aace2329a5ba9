// Package agentparams is the one validator of what the agent driver may hand a ClusterLabs fence
// agent. It is pure (no I/O) and small, so that the three places that must agree run the same
// code: `fencectl config check`, the coordinator when it loads or reloads a fence configuration,
// and the agent driver itself before it runs anything.
//
// Two rules. A parameter's NAME must be on the allowlist (device, credentials, protocol options,
// timing), and never one that names a program, a script, a file or raw command-line options. A
// parameter's VALUE is checked by the type of its name: an address is a host name or an IP address,
// a port a number 1-65535, a plug a short word of a safe character set, a user name has no
// whitespace and does not start with '-', and so on. The type matters because fence agents build
// command lines from some of their parameters and split them at whitespace (`ssh <user>@<ip> -p
// <ipport>`, `telnet <ip> <ipport>`): a user name "-oProxyCommand=<program> x" would otherwise
// become an ssh option that runs <program> as root. Only secrets (passwords, communities, keys)
// keep free text, on one line: agents quote them or send them to the device, never to a shell.
package agentparams

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nodefence/nodefence/services/fault"
)

// Kind is the type of a parameter's value.
type Kind int

// The kinds of value a fence-agent parameter may have.
const (
	// KindWord is a short token: letters, digits and . _ : + - (not first), at most 128 bytes.
	KindWord Kind = iota
	// KindAddress is a host name (RFC 1123 labels) or an IP address, never starting with '-'.
	KindAddress
	// KindPort is a TCP or UDP port, 1-65535.
	KindPort
	// KindPlug names an outlet, port, blade or virtual machine: letters, digits and . _ : @ + - /
	// (not '-' first), at most 64 bytes.
	KindPlug
	// KindUser is a login name: printable, no whitespace, no shell special character, not '-'
	// first, at most 128 bytes.
	KindUser
	// KindSecret is a password, community or key: one line without control characters, at most
	// 512 bytes. It is the only free text: agents quote it or send it to the device.
	KindSecret
	// KindNumber is a whole number 0-86400 (seconds, counts, cipher suites).
	KindNumber
	// KindFlag is a boolean: empty (a bare flag), 1/0, true/false, yes/no, on/off, y/n, t/f.
	KindFlag
	// KindPath is a URI path: '/' first, then letters, digits and . _ ~ % / - , at most 512 bytes.
	KindPath
	// KindSeparator is one character of , : . = / _ + @.
	KindSeparator
	// KindHex is a hexadecimal key, at most 128 digits.
	KindHex
	// KindText is the value of a parameter an administrator allows beyond the built-in list (say
	// status_file for fence_dummy): letters, digits and . _ : @ + - / = , (not '-' first), at most
	// 256 bytes.
	KindText
)

// String names the kind, as problems word it.
func (k Kind) String() string {
	switch k {
	case KindAddress:
		return "address"
	case KindPort:
		return "port"
	case KindPlug:
		return "plug"
	case KindUser:
		return "user name"
	case KindSecret:
		return "secret"
	case KindNumber:
		return "number"
	case KindFlag:
		return "boolean"
	case KindPath:
		return "path"
	case KindSeparator:
		return "separator"
	case KindHex:
		return "hexadecimal key"
	case KindText:
		return "text"
	}
	return "word"
}

// allowed are the parameters a target may hand a fence agent, by canonical (stdin) name, with the
// kind of their value: where the device is, how to log in, which plug, protocol options and
// timeouts. Nothing else reaches an agent. In particular never a parameter that names a program
// (ipmitool_path, ssh_path, sudo_path ...), a script that computes a password (passwd_script), a
// file to read or write (identity_file, debug_file, status_file), raw options for a command line
// (ssh_options), privilege (sudo, use_sudo) or output that would carry secrets (verbose, debug):
// the driver runs agents as root, and a target comes over the network.
var allowed = map[string]Kind{
	// device and plug
	"ip": KindAddress, "ipaddr": KindAddress, "ipport": KindPort, "plug": KindPlug, "port": KindPlug,
	"plug_separator": KindSeparator, "separator": KindSeparator, "port_as_ip": KindFlag,
	"nodename": KindAddress, "target": KindAddress, "inet4_only": KindFlag, "inet6_only": KindFlag,
	// credentials
	"login": KindUser, "username": KindUser, "passwd": KindSecret, "password": KindSecret, "community": KindSecret,
	"auth": KindWord, "privlvl": KindWord, "hexadecimal_kg": KindHex, "cipher": KindNumber, "lanplus": KindFlag,
	"method": KindWord, "snmp_version": KindWord, "snmp_sec_level": KindWord, "snmp_auth_prot": KindWord,
	"snmp_priv_prot": KindWord, "snmp_priv_passwd": KindSecret,
	// protocols
	"ssh": KindFlag, "secure": KindFlag, "ssl": KindFlag, "ssl_insecure": KindFlag, "ssl_secure": KindFlag,
	"notls": KindFlag, "redfish_uri": KindPath, "systems_uri": KindPath,
	// clouds
	"region": KindWord, "zone": KindWord, "project": KindWord, "access_key": KindSecret, "secret_key": KindSecret,
	"tenant_id": KindWord, "subscription_id": KindWord, "resource_group": KindWord, "uuid": KindWord,
	// timing and output
	"delay": KindNumber, "disable_timeout": KindFlag, "login_timeout": KindNumber, "power_timeout": KindNumber,
	"power_wait": KindNumber, "shell_timeout": KindNumber, "stonith_status_sleep": KindNumber, "retry_on": KindNumber,
	"ipmitool_timeout": KindNumber, "quiet": KindFlag,
}

// Allowed returns the allowlist: every parameter name a target may hand a fence agent, with the
// kind of its value (a copy; fencectl describe agent lists it).
func Allowed() map[string]Kind { return maps.Clone(allowed) }

// Agent is the parameter that names the fence agent to run (alias AgentAlias).
const (
	Agent      = "agent"
	AgentAlias = "agent_name"
)

// agentName is what an agent's name must look like (it becomes a path).
var agentName = regexp.MustCompile(`^fence_[a-z0-9_]{1,64}$`)

// Normalize is the form parameter names are compared in: trimmed, lower case, '-' read as '_'.
func Normalize(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "-", "_")
}

// Forbidden reports names that can never be allowed, even as an administrator's extra parameter:
// they name a program, a script, a file, command-line options, privilege or debug output.
func Forbidden(name string) bool {
	name = Normalize(name)
	for _, suffix := range []string{"_path", "_script", "_options"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	switch name {
	case "sudo", "use_sudo", "identity_file", "debug_file", "debug", "verbose", "verbose_level", "action":
		return true
	}
	return false
}

// AnyExtra, as the only element of extra, allows every name that is not Forbidden, with a text
// value: for the coordinator, which cannot know which extra parameters each driver host allows
// (the driver refuses those it does not).
const AnyExtra = "*"

// KindOf returns the kind of an allowed parameter; ok is false for a name not on the allowlist.
// extra are names the driver host's administrator allows beyond it (their values are KindText).
func KindOf(name string, extra []string) (k Kind, ok bool) {
	name = Normalize(name)
	if Forbidden(name) || name == "" {
		return 0, false
	}
	if k, ok := allowed[name]; ok {
		return k, true
	}
	if slices.Contains(extra, name) || len(extra) == 1 && extra[0] == AnyExtra {
		return KindText, true
	}
	return 0, false
}

// IsAgentName reports whether s may name a fence agent.
func IsAgentName(s string) bool { return agentName.MatchString(s) }

// Value checks v as a value of kind k and says what is wrong, or returns nil.
func Value(k Kind, v string) error {
	if k != KindSecret && v != strings.TrimSpace(v) {
		return fmt.Errorf("must not start or end with whitespace")
	}
	if strings.ContainsFunc(v, isControl) {
		return fmt.Errorf("must not hold control characters (newline, tab, NUL ...)")
	}
	if k != KindSecret && strings.HasPrefix(v, "-") {
		return fmt.Errorf("must not start with '-' (it would be read as a command-line option)")
	}
	switch k {
	case KindAddress:
		return address(v)
	case KindPort:
		if n, err := strconv.Atoi(v); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != v {
			return fmt.Errorf("must be a port number 1-65535")
		}
	case KindNumber:
		if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 86400 || strconv.Itoa(n) != v {
			return fmt.Errorf("must be a whole number 0-86400")
		}
	case KindFlag:
		switch strings.ToLower(v) {
		case "", "1", "0", "true", "false", "yes", "no", "on", "off", "y", "n", "t", "f":
		default:
			return fmt.Errorf("must be a boolean (1/0, true/false, yes/no, on/off)")
		}
	case KindPlug:
		return charset(v, 64, plugChars)
	case KindUser:
		if v == "" {
			return fmt.Errorf("must not be empty")
		}
		if len(v) > 128 || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune(shellChars, r) }) {
			return fmt.Errorf("must be at most 128 printable ASCII characters without whitespace or shell special characters")
		}
	case KindSecret:
		if len(v) > 512 {
			return fmt.Errorf("must be at most 512 bytes")
		}
	case KindPath:
		if v != "" && !strings.HasPrefix(v, "/") {
			return fmt.Errorf("must be a URI path starting with '/'")
		}
		return charset(v, 512, pathChars)
	case KindSeparator:
		if len(v) != 1 || !strings.Contains(",:.=/_+@", v) {
			return fmt.Errorf("must be one of the characters , : . = / _ + @")
		}
	case KindHex:
		return charset(v, 128, hexChars)
	case KindText:
		return charset(v, 256, textChars)
	default:
		return charset(v, 128, wordChars)
	}
	return nil
}

// shellChars are characters no value but a secret's may hold.
const shellChars = ";|&$`<>\\\"'(){}[]*?!~#%^"

const (
	alnum     = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	wordChars = alnum + "._:+-"
	plugChars = alnum + "._:@+-/"
	pathChars = alnum + "._~%/-"
	hexChars  = "0123456789abcdefABCDEF"
	textChars = alnum + "._:@+-/=,"
)

func charset(v string, maxLen int, chars string) error {
	if len(v) > maxLen || strings.ContainsFunc(v, func(r rune) bool { return !strings.ContainsRune(chars, r) }) {
		return fmt.Errorf("must be at most %d of the characters %s", maxLen, describe(chars))
	}
	return nil
}

func describe(chars string) string {
	rest := strings.TrimPrefix(chars, alnum)
	if rest == chars {
		return "0-9 a-f"
	}
	return "a-z A-Z 0-9 " + strings.Join(strings.Split(rest, ""), " ")
}

func isControl(r rune) bool { return r < ' ' || r == 0x7f || r >= 0x80 && r < 0xa0 }

// hostLabel is one label of an RFC 1123 host name.
var hostLabel = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// address accepts an IP address (v4 dotted quad, v6, optionally in brackets) or a host name whose
// last label is not all digits: "127.1" and "0x7f.1" are refused, because resolvers read them as
// IP addresses in forms the epoch table would not recognise as 127.0.0.1.
func address(v string) error {
	if v == "" {
		return fmt.Errorf("must be a host name or an IP address")
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(v, "["), "]")); err == nil && a.Zone() == "" {
		return nil
	}
	labels := strings.Split(strings.TrimSuffix(v, "."), ".")
	if len(v) > 253 || slices.ContainsFunc(labels, func(l string) bool { return !hostLabel.MatchString(l) }) {
		return fmt.Errorf("must be a host name (letters, digits, '-' inside labels, '.') or an IP address")
	}
	last := strings.ToLower(labels[len(labels)-1])
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") && strings.Trim(last[2:], hexChars) == "" {
		return fmt.Errorf("must be a host name or an IP address written in full (a.b.c.d or IPv6)")
	}
	return nil
}

// Reference reports a secret reference (name_file, name_secret), resolved by the coordinator at
// call time and checked as the secret it names by the driver.
func Reference(name string) bool {
	name = Normalize(name)
	if strings.HasSuffix(name, "_secret") {
		return true
	}
	base, ok := strings.CutSuffix(name, "_file")
	return ok && allowed[base] == KindSecret
}

// Check validates a target's parameters without the agent's metadata: every name allowlisted and
// every value of its name's kind. The agent parameter must name a fence agent; secret references
// pass (the driver checks what they resolve to). Problems name the parameter as given.
func Check(params map[string]string, extra []string) error {
	var inv fault.Invalid
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		name := Normalize(k)
		switch {
		case len(k) > 64:
			inv.Add(k[:64]+"...", "parameter name longer than 64 bytes")
		case name == Agent || name == AgentAlias:
			if !IsAgentName(strings.TrimSpace(v)) {
				inv.Add(k, "must name a ClusterLabs fence agent (fence_ and lower-case letters, digits, _)")
			}
		case Reference(name):
			if strings.ContainsFunc(v, isControl) || len(v) > 512 {
				inv.Add(k, "a secret reference must be one line of at most 512 bytes")
			}
		default:
			kind, ok := KindOf(name, extra)
			if !ok {
				inv.Add(k, "is not an allowed fence-agent parameter (never a program, script, file or command-line option)")
				continue
			}
			if err := Value(kind, v); err != nil {
				inv.Add(k, "%s: %v", kind, err)
			}
		}
	}
	return inv.Err()
}
