package main

import (
	"bytes"
	"testing"

	"github.com/nodefence/nodefence/testbed/manifests"
)

// The DaemonSet in deploy/ passes flags this agent accepts: a renamed or removed flag, or a value the
// agent refuses, fails here instead of in a cluster's crash loop.
func TestDeployedArgsParse(t *testing.T) {
	for _, args := range manifests.Args(t, "../../../deploy/node-agent.yaml", "node-agent") {
		args = manifests.Localize(t, args, map[string]string{"NODE_NAME": "worker-1"}, []string{"/host/", "/etc/nodefence/"},
			"/host/proc/sys/kernel/random/boot_id", "/etc/nodefence/tls/tls.crt", "/etc/nodefence/tls/tls.key", "/etc/nodefence/tls/ca.crt")
		var stderr bytes.Buffer
		if _, errs, help := parse(args, &stderr); help || len(errs) > 0 || stderr.Len() > 0 {
			t.Errorf("deploy/node-agent.yaml args %q: help=%v, problems %v\n%s", args, help, errs, stderr.String())
		}
	}
}
