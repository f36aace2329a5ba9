package fenceagent

import (
	"slices"
	"strings"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/fault"
)

// allowed are the parameters a target may hand a fence agent: where the device is, how to log in,
// which plug, protocol options and timeouts. Nothing else reaches an agent. In particular never a
// parameter that names a program (ipmitool_path, ssh_path, sudo_path ...), a script that computes
// a password (passwd_script), a file to read or write (identity_file, debug_file, status_file), raw
// options for a command line (ssh_options), privilege (sudo, use_sudo) or output that would carry
// secrets (verbose, debug): the driver runs agents as root, and a target comes over the network.
var allowed = map[string]bool{
	// device and plug
	"ip": true, "ipaddr": true, "ipport": true, "plug": true, "port": true, "plug_separator": true, "separator": true,
	"port_as_ip": true, "nodename": true, "target": true, "inet4_only": true, "inet6_only": true,
	// credentials
	"login": true, "username": true, "passwd": true, "password": true, "community": true, "auth": true,
	"privlvl": true, "hexadecimal_kg": true, "cipher": true, "lanplus": true, "method": true,
	"snmp_version": true, "snmp_sec_level": true, "snmp_auth_prot": true, "snmp_priv_prot": true, "snmp_priv_passwd": true,
	// protocols
	"ssh": true, "secure": true, "ssl": true, "ssl_insecure": true, "ssl_secure": true, "notls": true,
	"redfish_uri": true, "systems_uri": true,
	// clouds
	"region": true, "zone": true, "project": true, "access_key": true, "secret_key": true, "tenant_id": true,
	"subscription_id": true, "resource_group": true, "uuid": true,
	// timing and output
	"delay": true, "disable_timeout": true, "login_timeout": true, "power_timeout": true, "power_wait": true,
	"shell_timeout": true, "stonith_status_sleep": true, "retry_on": true, "ipmitool_timeout": true, "quiet": true,
}

// forbiddenName reports names that can never be allowed, even by Config.ExtraParameters.
func forbiddenName(name string) bool {
	for _, suffix := range []string{"_path", "_script", "_options"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	switch name {
	case "sudo", "use_sudo", "identity_file", "debug_file", "debug", "verbose", "verbose_level":
		return true
	}
	return false
}

// shellChars are characters no value but a secret's may hold: an agent builds command lines from
// some of its parameters.
const shellChars = ";|&$`<>\\\"'(){}[]*?!~#\t"

// allowValue reports whether a parameter's value is acceptable: one line, and for everything but
// secrets none of the shell's special characters.
func allowValue(name, v string) bool {
	if strings.ContainsAny(v, "\n\r\x00") {
		return false
	}
	return kit.IsSecret(name, nil) || !strings.ContainsAny(v, shellChars)
}

// CheckParameters checks a target's parameters against the allowlist without the agent's
// metadata (offline, e.g. `fencectl config check` on a machine without fence-agents). The agent
// parameter itself and secret references (*_file, *_secret: resolved by the coordinator) pass.
func CheckParameters(params map[string]string, extra []string) error {
	var inv fault.Invalid
	for k, v := range params {
		name := kit.NormalizeName(k)
		if name == ParamAgent || name == "agent_name" || strings.HasSuffix(name, "_secret") {
			continue
		}
		if base, ok := strings.CutSuffix(name, "_file"); ok && kit.IsSecret(base, nil) {
			continue
		}
		switch {
		case forbiddenName(name) || !allowed[name] && !slices.Contains(extra, name):
			inv.Add(k, "is not an allowed fence-agent parameter (never a program, script, file or command-line option)")
		case !allowValue(name, v):
			inv.Add(k, "must be one line without shell special characters")
		}
	}
	return inv.Err()
}
