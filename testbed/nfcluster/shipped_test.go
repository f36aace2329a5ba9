package nfcluster

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// placeFlags say where things are (addresses, certificates, the kubeconfig, the namespace, the
// drivers): the testbed passes its own. Every other flag deploy/coordinator.yaml passes is a
// setting, and Options.Shipped must pass it as shipped.
var placeFlags = []string{"--id", "--listen", "--advertise", "--metrics-listen", "--metrics-tls", "--etcd-endpoints",
	"--etcd-tls-ca", "--etcd-tls-cert", "--etcd-tls-key", "--kubeconfig", "--fence-namespace", "--driver-endpoint",
	"--driver-identity", "--kdump-listen", "--admission-listen", "--tls-cert", "--tls-key", "--tls-ca",
	"--driver-tls-cert", "--driver-tls-key", "--driver-tls-ca"}

// TestShippedFlags: ShippedFlags are exactly the settings deploy/coordinator.yaml passes the
// coordinator, so the no-fence scenarios run on what an operator installs.
func TestShippedFlags(t *testing.T) {
	f, err := os.Open(filepath.Join(DeployDir(), "coordinator.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var settings []string
	in, sc := false, bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "command: [/usr/local/bin/coordinator]"):
			in = true
		case in && line == "args:", in && strings.HasPrefix(line, "#"):
		case in && strings.HasPrefix(line, "- --"):
			arg := strings.TrimPrefix(line, "- ")
			name, _, _ := strings.Cut(arg, "=")
			if !slices.Contains(placeFlags, name) {
				settings = append(settings, arg)
			}
		case in:
			in = false
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(settings) == 0 {
		t.Fatal("no coordinator args found in deploy/coordinator.yaml")
	}
	slices.Sort(settings)
	shipped := slices.Sorted(slices.Values(ShippedFlags))
	if !slices.Equal(settings, shipped) {
		t.Errorf("deploy/coordinator.yaml passes the settings %q; ShippedFlags are %q", settings, shipped)
	}
}
