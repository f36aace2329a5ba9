package main

import (
	"flag"
	"io"
	"testing"

	"github.com/nodefence/nodefence/coordinator/app"
	"github.com/nodefence/nodefence/testbed/manifests"
)

// The Deployment in deploy/ passes flags the coordinator accepts: a renamed or removed flag, or a
// value it refuses, fails here instead of in a cluster's crash loop.
func TestDeployedArgsParse(t *testing.T) {
	vars := map[string]string{"POD_NAME": "coordinator-0", "POD_IP": "127.0.0.1", "ETCD_ENDPOINTS": "http://127.0.0.1:2379"}
	for _, args := range manifests.Args(t, "../../../deploy/coordinator.yaml", "coordinator") {
		args = manifests.Localize(t, args, vars, []string{"/etc/nodefence/"},
			"/etc/nodefence/tls/tls.crt", "/etc/nodefence/tls/tls.key", "/etc/nodefence/tls/ca.crt", "/etc/nodefence/kube/kubeconfig",
			"/etc/nodefence/etcd/ca.crt", "/etc/nodefence/etcd/tls.crt", "/etc/nodefence/etcd/tls.key")
		fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var cfg app.Config
		cfg.RegisterFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Errorf("deploy/coordinator.yaml args %q: %v", args, err)
			continue
		}
		if errs := cfg.Validate(); len(errs) > 0 || fs.NArg() > 0 {
			t.Errorf("deploy/coordinator.yaml args %q: %v (leftover %q)", args, errs, fs.Args())
		}
	}
}
