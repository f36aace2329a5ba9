package kit

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/redact"
)

// Parameter types understood by Canonicalize (Parameter.Type).
const (
	TypeString  = "string"
	TypeInteger = "integer"
	TypeBoolean = "boolean"
)

// NormalizeName is the form parameter names are compared in: trimmed, lower case, '-' read as '_'
// (fence agents take --snmp-priv-passwd on the command line and snmp_priv_passwd on stdin).
func NormalizeName(name string) string { return redact.Normalize(name) }

// IsSecret reports whether the parameter name denotes a secret, by description or by name
// (services/redact: passwords and passphrases, SNMP communities, keys and tokens are never logged).
func IsSecret(name string, desc []*driverv1.Parameter) bool {
	n := NormalizeName(name)
	for _, p := range desc {
		if p.GetSecret() && (NormalizeName(p.GetName()) == n || slices.ContainsFunc(p.GetAliases(), func(a string) bool { return NormalizeName(a) == n })) {
			return true
		}
	}
	return redact.Name(n)
}

// Masked returns params with every secret value replaced by "***", for logs.
func Masked(params map[string]string, desc []*driverv1.Parameter) map[string]string {
	out := make(map[string]string, len(params))
	for k, v := range params {
		if IsSecret(k, desc) {
			v = "***"
		}
		out[k] = v
	}
	return out
}

// Canonicalize resolves the parameter names in params against desc: aliases become the canonical
// name, missing parameters take their default, required ones must be present and non-empty,
// integers must parse and booleans become "1" or "0" (an empty boolean means true, as a bare
// fence-agent flag does). A parameter given under two names with different values is an error.
// Parameters not described are passed through under their normalised name. Problems are returned
// together as a fault.Invalid whose field names are the canonical parameter names.
func Canonicalize(params map[string]string, desc []*driverv1.Parameter) (map[string]string, error) {
	canon := map[string]*driverv1.Parameter{}
	for _, p := range desc {
		canon[NormalizeName(p.GetName())] = p
		for _, a := range p.GetAliases() {
			canon[NormalizeName(a)] = p
		}
	}
	var inv fault.Invalid
	out := map[string]string{}
	givenAs := map[string]string{} // canonical name -> name it was given as
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		name := NormalizeName(k)
		if p, ok := canon[name]; ok {
			name = NormalizeName(p.GetName())
		}
		if prev, dup := givenAs[name]; dup && out[name] != v {
			inv.Add(name, "given as both %q and %q with different values", prev, k)
			continue
		}
		givenAs[name] = k
		out[name] = v
	}
	for _, p := range desc {
		name := NormalizeName(p.GetName())
		v, ok := out[name]
		if !ok && p.GetDefault() != "" {
			v, ok = p.GetDefault(), true
			out[name] = v
		}
		if !ok || (strings.TrimSpace(v) == "" && p.GetType() != TypeBoolean) {
			if p.GetRequired() {
				inv.Add(name, "required: %s", p.GetDescription())
			}
			continue
		}
		switch p.GetType() {
		case TypeInteger:
			if _, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
				inv.Add(name, "must be an integer, got %s", quoteUnlessSecret(v, p))
				continue
			}
			out[name] = strings.TrimSpace(v)
		case TypeBoolean:
			b, err := parseBool(v)
			if err != nil {
				inv.Add(name, "must be a boolean (1/0, true/false, yes/no, on/off), got %s", quoteUnlessSecret(v, p))
				continue
			}
			out[name] = b
		}
	}
	if err := inv.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func parseBool(v string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "1", "true", "yes", "on", "y", "t":
		return "1", nil
	case "0", "false", "no", "off", "n", "f":
		return "0", nil
	}
	return "", fmt.Errorf("not a boolean")
}

func quoteUnlessSecret(v string, p *driverv1.Parameter) string {
	if p.GetSecret() {
		return "a secret value"
	}
	return strconv.Quote(v)
}
