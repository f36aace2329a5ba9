// Package redact is the one home of which names hold secrets and how their values are kept out of
// logs, answers and stored records: the fence drivers' parameters (fence-drivers/kit), the
// coordinator's live configuration and device checks (coordinator/app), fencectl's offline checks.
// A name is secret by its words (Name), or because a driver's description says so (the caller's
// rule, passed to Params and Values); a reference to a secret (NAME_file, NAME_secret) is a path or
// a key, shown as it is.
package redact

import "strings"

// Mask is what a secret value is replaced by.
const Mask = "***"

// words mark a name as secret: passwords and passphrases (pass), SNMP communities, secrets, tokens
// and bearer tokens, keys (access_key, secret_key), IPMI's Kg key.
var words = []string{"pass", "community", "secret", "token", "bearer", "key", "kg"}

// Normalize is the form names are compared in: trimmed, lower case, '-' read as '_' (fence agents
// take --snmp-priv-passwd on the command line and snmp_priv_passwd on stdin).
func Normalize(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "-", "_")
}

// Name reports whether name says it holds a secret value.
func Name(name string) bool {
	n := Normalize(name)
	for _, w := range words {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// Reference reports whether name is a reference to a secret kept elsewhere (NAME_file: a path;
// NAME_secret: a Kubernetes Secret's key), whose value is shown.
func Reference(name string) bool {
	n := Normalize(name)
	return strings.HasSuffix(n, "_file") || strings.HasSuffix(n, "_secret")
}

// Setting reports whether a configuration setting's name (a Go field path such as
// "EtcdPassword") holds a secret value; a setting naming a file or directory that holds one
// (EtcdPasswordFile) is a path and is shown.
func Setting(name string) bool {
	n := strings.ToLower(name)
	return !strings.HasSuffix(n, "file") && !strings.HasSuffix(n, "dir") && Name(n)
}

// Params copies params with every secret value (secret(name), references aside) replaced by Mask.
func Params(params map[string]string, secret func(name string) bool) map[string]string {
	out := make(map[string]string, len(params))
	for k, v := range params {
		if !Reference(k) && secret(k) {
			v = Mask
		}
		out[k] = v
	}
	return out
}

// Values replaces in s every value of a secret parameter (secret(name)) by Mask; values shorter
// than 3 bytes are left (they would mask every such run of letters in the text, and say nothing).
func Values(s string, params map[string]string, secret func(name string) bool) string {
	for k, v := range params {
		if len(v) >= 3 && secret(k) {
			s = strings.ReplaceAll(s, v, Mask)
		}
	}
	return s
}
