package fenceagent

import (
	"github.com/nodefence/nodefence/fence-drivers/agentparams"
)

// The allowlist and the typed value checks live in package agentparams, the one validator that
// `fencectl config check`, the coordinator's configuration load and this driver all run.

// checkValue checks one canonical parameter the runner is about to pass: its name allowlisted
// (extra: the administrator's additions) and its value of its name's kind. problem is "" when the
// parameter may pass.
func checkValue(name, v string, extra []string) (problem string) {
	kind, ok := agentparams.KindOf(name, extra)
	if !ok {
		return "is not an allowed parameter: the runner passes only the device, credential, protocol and timing parameters it allowlists, never a program, script, file or command-line option"
	}
	if err := agentparams.Value(kind, v); err != nil {
		return kind.String() + ": " + err.Error()
	}
	return ""
}

// CheckParameters checks a target's parameters against the allowlist and the kinds of their
// values without the agent's metadata (offline, e.g. `fencectl config check` on a machine without
// fence-agents). The agent parameter must name an agent; secret references (*_file, *_secret:
// resolved by the coordinator) pass.
func CheckParameters(params map[string]string, extra []string) error {
	return agentparams.Check(params, extra)
}
