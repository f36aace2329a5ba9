package kit

import (
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/nodefence/nodefence/services/fault"
)

// Bounds on a driver request. A request comes over the network: nothing in it may be unbounded,
// and no field may carry a control character (a log line, an audit record or a fence agent's stdin
// line would be split by it).
const (
	// MaxTargetName bounds Target.name (a node name: a DNS subdomain is at most 253 bytes).
	MaxTargetName = 253
	// MaxOperationID bounds operation_id (the coordinator's ids are far shorter).
	MaxOperationID = 256
	// MaxParameters bounds how many parameters a target has.
	MaxParameters = 64
	// MaxParamName and MaxParamValue bound one parameter.
	MaxParamName  = 64
	MaxParamValue = 4096
)

// nameChars are the characters of a target name and of an operation id (plus '/', ':' and '@'
// for the latter: the coordinator's ids are <fence id>/<attempt>/<step>/<method>/<action>).
const (
	targetNameChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
	operationChars  = targetNameChars + "/:@+"
)

// checkToken adds a problem to inv unless v is non-empty (when required), at most max bytes and
// made only of chars.
func checkToken(inv *fault.Invalid, field, v string, maxLen int, chars string, required bool) {
	switch {
	case v == "" && required:
		inv.Add(field, "required")
	case len(v) > maxLen:
		inv.Add(field, "at most %d bytes, got %d", maxLen, len(v))
	case strings.ContainsFunc(v, func(r rune) bool { return !strings.ContainsRune(chars, r) }):
		inv.Add(field, "only letters, digits and %s allowed", strings.Join(strings.Split(strings.TrimLeft(chars, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"), ""), " "))
	}
}

// checkParamBounds adds a problem to inv for every parameter name or value out of bounds or
// holding a control character (or invalid UTF-8). Problems name the parameter; secret values are
// never quoted.
func checkParamBounds(inv *fault.Invalid, params map[string]string) {
	if len(params) > MaxParameters {
		inv.Add("target.parameters", "at most %d parameters, got %d", MaxParameters, len(params))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		field := "target.parameters." + k
		if len(k) > MaxParamName || hasControl(k) {
			field = "target.parameters"
			inv.Add(field, "a parameter name is longer than %d bytes or holds a control character", MaxParamName)
			continue
		}
		switch {
		case len(v) > MaxParamValue:
			inv.Add(field, "at most %d bytes, got %d", MaxParamValue, len(v))
		case multiLine[k] && hasControl(strings.ReplaceAll(v, "\n", "")), !multiLine[k] && hasControl(v):
			inv.Add(field, "must not hold control characters (newline, tab, NUL ...) or invalid UTF-8")
		}
	}
}

// multiLine are the parameters whose value is lines by nature (a switch's SSH host keys, one
// known_hosts line each): newlines separate them; no other control character is allowed.
var multiLine = map[string]bool{"ssh_host_key": true}

func hasControl(s string) bool {
	return !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f || r >= 0x80 && r < 0xa0 })
}

// checkRequestBounds checks a target's name and parameters, and the operation id of a mutation
// (opID nil for reads).
func checkRequestBounds(inv *fault.Invalid, name string, params map[string]string, opID *string) {
	checkToken(inv, "target.name", name, MaxTargetName, targetNameChars, false)
	checkParamBounds(inv, params)
	if opID != nil {
		checkToken(inv, "operation_id", *opID, MaxOperationID, operationChars, true)
	}
}
