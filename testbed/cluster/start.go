package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

// checkHost names every Kubernetes binary in assets and every host tool that is missing.
func checkHost(assets string) error {
	var missing []error
	for _, b := range []string{kubeletBin, apiBin, kcmBin, schedulerBin, etcdBin} {
		if st, err := os.Stat(filepath.Join(assets, b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, fmt.Errorf("%w: %s not in %s; build them with `%s` (or `make kube-assets`)",
				kubetest.ErrNoBinaries, b, assets, kubetest.BuildCommand))
		}
	}
	for _, t := range hostTools {
		if _, err := exec.LookPath(t[0]); err != nil {
			missing = append(missing, fmt.Errorf("%s not found: install the Debian package %s (make deps)", t[0], t[1]))
		}
	}
	return errors.Join(missing...)
}

// startNodesAndAPIServer starts every node's containerd and imports the images while the apiserver
// starts.
func (c *Cluster) startNodesAndAPIServer(deadline time.Time) error {
	nodeErrs := make(chan error, len(c.Nodes))
	for _, n := range c.Nodes {
		go func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.running = true
			err := n.newBootID()
			if err == nil {
				err = n.startContainerd()
			}
			if err == nil {
				err = n.waitContainerd(deadline)
			}
			if err == nil {
				err = n.importImages()
			}
			nodeErrs <- err
		}()
	}
	apiErr := c.startAPIServer(deadline)
	var errs []error
	for range c.Nodes {
		errs = append(errs, <-nodeErrs)
	}
	return errors.Join(append(errs, apiErr)...)
}

// startKubelets starts the kubelets one after another and switches on the nodes' power supply.
func (c *Cluster) startKubelets() error {
	for i, n := range c.Nodes {
		if i > 0 {
			time.Sleep(time.Second) // kubelets starting together race for the device-plugin socket
		}
		n.mu.Lock()
		err := n.startKubelet()
		n.mu.Unlock()
		if err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := n.BMC.SetExternalPower(true); err != nil {
			return err
		}
		c.powerWG.Add(1)
		go func() { defer c.powerWG.Done(); n.supply(c.stopPower) }()
	}
	return nil
}

// issueCerts issues the apiserver's serving certificate, the service-account keys and the
// client certificates of the admin, the control plane and every node's kubelet.
func (c *Cluster) issueCerts() error {
	l := c.layout
	if err := c.pki.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{l.APIServerIP.AsSlice(), net.IPv4(127, 0, 0, 1), l.KubeService.AsSlice()},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}); err != nil {
		return err
	}
	if err := c.pki.serviceAccountKeys(); err != nil {
		return err
	}
	clients := []struct{ name, cn, org string }{
		{"admin", "nodefence-testbed-admin", "system:masters"},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"},
		{"kcm", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
	}
	for _, n := range c.Nodes {
		clients = append(clients, struct{ name, cn, org string }{"kubelet-" + n.Name, "system:node:" + n.Name, "system:nodes"})
	}
	for _, cl := range clients {
		var orgs []string
		if cl.org != "" {
			orgs = []string{cl.org}
		}
		if _, err := c.IssueClient(cl.name, cl.cn, orgs...); err != nil {
			return err
		}
	}
	return nil
}
