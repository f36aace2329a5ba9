package nodeagent

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/pki"

	"github.com/nodefence/nodefence/testbed/manifests"
)

// The DaemonSet in deploy/ passes flags this agent accepts: a renamed or removed flag, or a value the
// agent refuses, fails here instead of in a cluster's crash loop.
func TestDeployedArgsParse(t *testing.T) {
	for _, args := range manifests.Args(t, "../../deploy/node-agent.yaml", "node-agent") {
		args = manifests.Localize(t, args, map[string]string{"NODE_NAME": "worker-1"}, []string{"/host/", "/etc/nodefence/"},
			"/host/proc/sys/kernel/random/boot_id", "/etc/nodefence/tls/tls.crt", "/etc/nodefence/tls/tls.key", "/etc/nodefence/tls/ca.crt")
		// The agent checks that its certificate names its node: give it worker-1's.
		installAgentCert(t, args, "worker-1")
		var stderr bytes.Buffer
		opts, errs, help := parse(args, &stderr)
		if help || len(errs) > 0 || stderr.Len() > 0 {
			t.Errorf("deploy/node-agent.yaml args %q: help=%v, problems %v\n%s", args, help, errs, stderr.String())
		}
		// Without Kubernetes mode the DaemonSet's agent would see no pod and evict none.
		if opts.kubeconfig != "in-cluster" {
			t.Errorf("deploy/node-agent.yaml: --kubeconfig %q; want in-cluster (Kubernetes mode with the pod's ServiceAccount)", opts.kubeconfig)
		}
	}
}

// installAgentCert writes a certificate for node where args' --tls-cert and --tls-key point.
func installAgentCert(t *testing.T, args []string, node string) {
	t.Helper()
	files := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			files[k] = v
		}
	}
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.Files(identity.Agent, node)
	if err != nil {
		t.Fatal(err)
	}
	for flag, src := range map[string]string{"--tls-cert": f.CertFile, "--tls-key": f.KeyFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(files[flag], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
