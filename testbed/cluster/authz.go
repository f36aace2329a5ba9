package cluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/services/identity/certs"
)

// NodeAgentAuthzPort is the port, on the host address (HostIP), where the apiserver asks the node
// agents' authorization webhook of deploy/control-plane/authorization-config.yaml. The first
// coordinator of a testbed deployment serves it there (testbed/nfcluster); when none does, the
// webhook's failurePolicy (Deny) answers the same requests the same way, without a reason.
const NodeAgentAuthzPort = 7443

// shippedAuthzKubeconfig is the path deploy/control-plane/authorization-config.yaml names.
const shippedAuthzKubeconfig = "/etc/kubernetes/nodefence/authorization-webhook.kubeconfig"

// NodefenceCA is the certificate authority of nodefence deployed on the cluster, and its
// certificate's file: the apiserver verifies the node agents' authorization webhook (a
// coordinator's serving certificate) with it, as deploy/control-plane/authorization-webhook.kubeconfig
// does with the nodefence CA, so a deployment issues its certificates from it (testbed/nfcluster).
func (c *Cluster) NodefenceCA() (*certs.CA, string) { return c.nodefenceCA, c.nodefenceCAFile }

// nodefenceCAValidity outlasts any test run and a long `make cluster` session.
const nodefenceCAValidity = 30 * 24 * time.Hour

// writeAuthorizationConfig writes deploy/control-plane/authorization-config.yaml as shipped (Node,
// the node agents' webhook with its match conditions, RBAC), with its webhook kubeconfig in the
// cluster's directory: the coordinator at HostIP:NodeAgentAuthzPort, its certificate verified with
// the cluster's nodefence CA (made here, before the apiserver starts: the apiserver reads the
// kubeconfig once). The rule is the match conditions; the webhook only ever denies.
func (c *Cluster) writeAuthorizationConfig() (string, error) {
	_, f, _, _ := runtime.Caller(0)
	shipped := filepath.Join(filepath.Dir(f), "..", "..", "deploy", "control-plane", "authorization-config.yaml")
	raw, err := os.ReadFile(shipped)
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(raw), shippedAuthzKubeconfig) {
		return "", fmt.Errorf("%s no longer names %s", shipped, shippedAuthzKubeconfig)
	}
	if c.nodefenceCA == nil { // once per cluster: deployments' certificates must stay valid
		ca, err := certs.NewCA("nodefence testbed cluster CA", nodefenceCAValidity)
		if err != nil {
			return "", err
		}
		caFile, _, err := ca.WriteCA(filepath.Join(c.Config.Dir, "nodefence-pki"))
		if err != nil {
			return "", err
		}
		c.nodefenceCA, c.nodefenceCAFile = ca, caFile
	}
	caFile := c.nodefenceCAFile
	kc := filepath.Join(c.Config.Dir, "nodefence-authz.kubeconfig")
	server := "https://" + net.JoinHostPort(c.HostIP().String(), strconv.Itoa(NodeAgentAuthzPort)) + "/authorize/node-agent"
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters:
  - name: nodefence-coordinator
    cluster: {server: "`+server+`", certificate-authority: "`+caFile+`"}
users:
  - name: kube-apiserver
    user: {}
contexts:
  - name: nodefence
    context: {cluster: nodefence-coordinator, user: kube-apiserver}
current-context: nodefence
`), 0o600); err != nil {
		return "", err
	}
	path := filepath.Join(c.Config.Dir, "authorization-config.yaml")
	return path, os.WriteFile(path, []byte(strings.ReplaceAll(string(raw), shippedAuthzKubeconfig, kc)), 0o600)
}
