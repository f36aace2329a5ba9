package fencedriver

import (
	"flag"
	"io"
	"testing"

	"github.com/nodefence/nodefence/testbed/manifests"
)

// Every driver Deployment in deploy/ passes flags the fence-driver accepts: a renamed or removed
// flag, an unknown driver or a refused value fails here instead of in a cluster's crash loop.
func TestDeployedArgsParse(t *testing.T) {
	for _, args := range manifests.Args(t, "../../deploy/fence-drivers.yaml", "fence-driver") {
		args = manifests.Localize(t, args, nil, []string{"/etc/nodefence/", "/var/lib/"},
			"/etc/nodefence/tls/tls.crt", "/etc/nodefence/tls/tls.key", "/etc/nodefence/tls/ca.crt", "/var/lib/nodefence-driver/.keep")
		fs := flag.NewFlagSet("fence-driver", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var cfg Config
		cfg.registerFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Errorf("deploy/fence-drivers.yaml args %q: %v", args, err)
			continue
		}
		if errs := cfg.validate(fs.Args()); len(errs) > 0 {
			t.Errorf("deploy/fence-drivers.yaml args %q: %v", args, errs)
		}
	}
}
