package baremetal

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/procs"
)

const unitDir = "../../deploy/systemd"

func TestCommandLineExpansion(t *testing.T) {
	env := map[string]string{"A": "one", "B": "--x 1  --y 2", "E": ""}
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"bin --a ${A} $B end", []string{"bin", "--a", "one", "--x", "1", "--y", "2", "end"}},
		{"bin $E --z", []string{"bin", "--z"}},
		{"bin --e ${E}", []string{"bin", "--e", ""}},
		{"bin --path=/p/${A}/q 'two words'", []string{"bin", "--path=/p/one/q", "two words"}},
	} {
		got, err := CommandLine(tc.in, env)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%q (-want +got):\n%s", tc.in, d)
		}
	}
	for _, bad := range []string{"bin ${UNSET}", "bin $UNSET", "bin ${A", "bin 'open"} {
		if _, err := CommandLine(bad, env); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// host is one simulated machine: its own /etc/nodefence and /var/lib/nodefence below root.
type host struct {
	name, root string
}

func (h host) path(p string) string { return filepath.Join(h.root, p) }

// localize maps the unit's absolute paths into the host's root and /usr/local/bin to the binaries
// just built: the only change made to the command line systemd would run.
func (h host) localize(args []string, bin string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "/usr/local/bin/"):
			a = filepath.Join(bin, strings.TrimPrefix(a, "/usr/local/bin/"))
		case strings.HasPrefix(a, "/etc/nodefence/"), strings.HasPrefix(a, "/var/lib/nodefence/"):
			a = h.path(a)
		}
		out[i] = a
	}
	return out
}

// start reads unit (with instance for a template unit) as systemd would on h, writes env as its
// environment file, and starts the resulting command line.
func (h host) start(t *testing.T, unit, instance string, env map[string]string, bin string) *procs.Proc {
	t.Helper()
	u, err := ReadUnit(filepath.Join(unitDir, unit))
	if err != nil {
		t.Fatal(err)
	}
	if len(u.EnvironmentFiles) != 1 {
		t.Fatalf("%s: want one EnvironmentFile, got %q", unit, u.EnvironmentFiles)
	}
	envPath, err := Specifiers(u.EnvironmentFiles[0], instance)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for k, v := range env {
		lines = append(lines, k+"="+v)
	}
	slices.Sort(lines)
	writeFile(t, h.path(envPath), strings.Join(lines, "\n")+"\n")
	readEnv, err := ReadEnvFile(h.path(envPath))
	if err != nil {
		t.Fatal(err)
	}
	execStart, err := Specifiers(u.ExecStart, instance)
	if err != nil {
		t.Fatal(err)
	}
	args, err := CommandLine(execStart, readEnv)
	if err != nil {
		t.Fatalf("%s: %v", unit, err)
	}
	// What systemd's StateDirectory= would create.
	for _, a := range args {
		if strings.HasPrefix(a, "/var/lib/nodefence/") {
			if err := os.MkdirAll(h.path(a), 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	args = h.localize(args, bin)
	name := h.name + "/" + strings.TrimSuffix(strings.ReplaceAll(unit, "@", "@"+instance), ".service")
	t.Logf("%s: %s", name, strings.Join(args, " "))
	p, err := procs.Start(name, filepath.Join(t.TempDir(), "log"), args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		if t.Failed() {
			if b, err := os.ReadFile(p.Log); err == nil {
				t.Logf("%s log:\n%s", name, lastLines(string(b), 30))
			}
		}
	})
	return p
}

// TestUnitsStartHealthy runs what deploy/baremetal.md describes, scaled to one machine: three
// coordinator hosts on one etcd (each with a coordinator and an IPMI fence driver, the three
// drivers one driver's endpoints, and h01 with a PDU driver beside its IPMI one) and agents on two hosts, every process started from its unit's exact ExecStart= with
// the host's environment file, over mutual TLS. It checks every process serves, the agents reach
// the leader with the zone and region of their environment files, and the drivers answer.
func TestUnitsStartHealthy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	bin := buildBinaries(t, "coordinator", "fence-driver", "node-agent")
	base := t.TempDir()
	hosts := map[string]host{}
	for _, n := range []string{"h01", "h02", "h03", "h04"} {
		hosts[n] = host{name: n, root: filepath.Join(base, n)}
	}
	ca, etcdCA := newCA(t, "nodefence CA"), newCA(t, "nodefence etcd CA")
	for _, h := range hosts {
		ca.issue(t, h.path("/etc/nodefence/tls/coordinator"), "coordinator/"+h.name, true)
		// As deploy/baremetal.md: every driver host presents the one identity fence.yaml names.
		ca.issue(t, h.path("/etc/nodefence/tls/driver"), "driver/fence", true)
		ca.issue(t, h.path("/etc/nodefence/tls/agent"), "agent/"+h.name, false)
		writeFile(t, h.path("/etc/nodefence/tls/ca.crt"), ca.pem)
		// As deploy/baremetal.md: etcd's own CA and the coordinator's etcd client certificate.
		etcdCA.issue(t, h.path("/etc/nodefence/tls/etcd-client"), "coordinator/"+h.name, false)
		writeFile(t, h.path("/etc/nodefence/tls/etcd-ca.crt"), etcdCA.pem)
	}
	etcdEndpoint := startEtcdCluster(t, etcdCA, filepath.Join(base, "etcd"))
	operator := filepath.Join(base, "operator")
	ca.issue(t, operator, "operator/admin", false)
	writeFile(t, filepath.Join(base, "ca.crt"), ca.pem)
	opTLS := tlsfiles.Files{CertFile: operator + ".crt", KeyFile: operator + ".key", CAFile: filepath.Join(base, "ca.crt")}

	port := func() string {
		p, err := procs.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(p)
	}
	// Three driver hosts for IPMI (h01-h03), and a PDU driver beside the first.
	ipmiAddrs := map[string]string{"h01": "127.0.0.1:" + port(), "h02": "127.0.0.1:" + port(), "h03": "127.0.0.1:" + port()}
	pduAddr := "127.0.0.1:" + port()
	driverMetrics := map[string]string{"ipmi": "127.0.0.1:" + port(), "pdu": "127.0.0.1:" + port(),
		"ipmi-h02": "127.0.0.1:" + port(), "ipmi-h03": "127.0.0.1:" + port()}

	var coordAddrs, coordMetrics []string
	for _, n := range []string{"h01", "h02", "h03"} {
		h := hosts[n]
		writeFile(t, h.path("/etc/nodefence/bmc-password"), "secret\n")
		writeFile(t, h.path("/etc/nodefence/fence.yaml"), fmt.Sprintf(`drivers:
  ipmi: {endpoints: ["%s", "%s", "%s"], identity: fence}
  pdu: {endpoint: "%s", identity: fence}
templates:
  bmc:
    driver: ipmi
    parameters: {lanplus: "1", cipher: "3", username: admin, password_file: %s}
nodes:
  h01: {zone: rack-1, region: dc-1}
host_maps:
  - template: bmc
    parameters:
      ip: "h01:127.0.0.1;h04:127.0.0.1"
      ipport: "h01:9;h04:10"
`, ipmiAddrs["h01"], ipmiAddrs["h02"], ipmiAddrs["h03"], pduAddr, h.path("/etc/nodefence/bmc-password")))
		addr, metrics := "127.0.0.1:"+port(), "127.0.0.1:"+port()
		coordAddrs, coordMetrics = append(coordAddrs, addr), append(coordMetrics, metrics)
		h.start(t, "nodefence-coordinator.service", "", map[string]string{
			"NODEFENCE_ID":             n,
			"NODEFENCE_LISTEN":         addr,
			"NODEFENCE_ADVERTISE":      addr,
			"NODEFENCE_METRICS_LISTEN": metrics,
			"NODEFENCE_KDUMP_LISTEN":   "127.0.0.1:" + port(),
			"NODEFENCE_ETCD_ENDPOINTS": etcdEndpoint,
			// As deploy/baremetal.md: a client certificate of etcd's own CA, which signs no agent.
			"NODEFENCE_ETCD_ARGS": "--etcd-tls-ca /etc/nodefence/tls/etcd-ca.crt --etcd-tls-cert /etc/nodefence/tls/etcd-client.crt --etcd-tls-key /etc/nodefence/tls/etcd-client.key",
			"NODEFENCE_ARGS":      "--election-ttl 2s",
		}, bin)
	}
	// Two driver kinds on one host: each instance its own environment file and ports.
	for kind, addr := range map[string]string{"ipmi": ipmiAddrs["h01"], "pdu": pduAddr} {
		hosts["h01"].start(t, "nodefence-fence-driver@.service", kind, map[string]string{
			"NODEFENCE_DRIVER":         kind,
			"NODEFENCE_LISTEN":         addr,
			"NODEFENCE_METRICS_LISTEN": driverMetrics[kind],
			"NODEFENCE_ARGS":           "",
		}, bin)
	}
	// The second and third IPMI driver hosts.
	for _, n := range []string{"h02", "h03"} {
		hosts[n].start(t, "nodefence-fence-driver@.service", "ipmi", map[string]string{
			"NODEFENCE_DRIVER":         "ipmi",
			"NODEFENCE_LISTEN":         ipmiAddrs[n],
			"NODEFENCE_METRICS_LISTEN": driverMetrics["ipmi-"+n],
			"NODEFENCE_ARGS":           "",
		}, bin)
	}
	agentZones := map[string][2]string{"h01": {"rack-1", "dc-1"}, "h04": {"rack-2", "dc-1"}}
	for n, zr := range agentZones {
		hosts[n].start(t, "nodefence-node-agent.service", "", map[string]string{
			"NODEFENCE_COORDINATORS":   strings.Join(coordAddrs, ","),
			"NODEFENCE_NODE_NAME":      n,
			"NODEFENCE_ZONE":           zr[0],
			"NODEFENCE_REGION":         zr[1],
			"NODEFENCE_METRICS_LISTEN": "127.0.0.1:" + port(),
			// This machine is no logind host: the agent's graceful-shutdown support stays off.
			"NODEFENCE_ARGS": "--manage-inhibit-delay=false",
		}, bin)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, addr := range append(slices.Clone(coordAddrs), ipmiAddrs["h01"], ipmiAddrs["h02"], ipmiAddrs["h03"], pduAddr) {
		waitServing(ctx, t, addr, opTLS)
	}
	for _, m := range append(slices.Clone(coordMetrics), driverMetrics["ipmi"], driverMetrics["pdu"], driverMetrics["ipmi-h02"], driverMetrics["ipmi-h03"]) {
		waitHTTP(ctx, t, "http://"+m+"/metrics")
	}
	// The agents reach the leader, with the zone and region of their environment files.
	var leader string
	for _, addr := range coordAddrs {
		conn, err := dial.New(addr, opTLS)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for ctx.Err() == nil {
			r, err := coordv1.NewClusterServiceClient(conn).GetLeader(ctx, &coordv1.GetLeaderRequest{})
			if err == nil && r.GetAddress() != "" {
				leader = r.GetAddress()
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !slices.Contains(coordAddrs, leader) {
		t.Fatalf("leader %q is none of the coordinators %q", leader, coordAddrs)
	}
	conn, err := dial.New(leader, opTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := map[string][2]string{}
	for n, zr := range agentZones {
		want[n] = zr
	}
	var got map[string][2]string
	for ctx.Err() == nil {
		r, err := coordv1.NewClusterServiceClient(conn).ListNodes(ctx, &coordv1.ListNodesRequest{})
		got = map[string][2]string{}
		if err == nil {
			for _, n := range r.GetNodes() {
				if n.GetConnected() {
					got[n.GetName()] = [2]string{n.GetZone(), n.GetRegion()}
				}
			}
		}
		if cmp.Equal(want, got) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("connected agents at the leader %s (-want +got):\n%s", leader, d)
	}
}

// startEtcdCluster runs three etcd members on 127.0.0.1 (the etcd v3.6 the Kubernetes tests use)
// with TLS between members and to clients and client certificates of etcd's own CA required, as
// deploy/baremetal.md sets it up, and returns the client URLs.
func startEtcdCluster(t *testing.T, ca *testCA, dir string) string {
	t.Helper()
	_, etcd, err := kubetest.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ca.crt"), ca.pem)
	ca.issue(t, filepath.Join(dir, "server"), "viewer/etcd", true)
	type member struct{ name, client, peer string }
	var ms []member
	var cluster, clients []string
	for i := 1; i <= 3; i++ {
		c, err1 := procs.FreePort()
		p, err2 := procs.FreePort()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		m := member{fmt.Sprintf("m%d", i), fmt.Sprintf("https://127.0.0.1:%d", c), fmt.Sprintf("https://127.0.0.1:%d", p)}
		ms = append(ms, m)
		cluster = append(cluster, m.name+"="+m.peer)
		clients = append(clients, m.client)
	}
	tls := func(prefix string) []string {
		return []string{"--" + prefix + "trusted-ca-file", filepath.Join(dir, "ca.crt"),
			"--" + prefix + "cert-file", filepath.Join(dir, "server.crt"), "--" + prefix + "key-file", filepath.Join(dir, "server.key")}
	}
	for _, m := range ms {
		args := []string{"--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
			"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
			"--initial-cluster", strings.Join(cluster, ","), "--initial-cluster-state", "new",
			"--client-cert-auth", "--peer-client-cert-auth", "--unsafe-no-fsync", "--log-level", "warn"}
		args = append(append(args, tls("")...), tls("peer-")...)
		p, err := procs.Start("etcd-"+m.name, filepath.Join(dir, m.name+".log"), etcd, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
	}
	return strings.Join(clients, ",")
}

func waitServing(ctx context.Context, t *testing.T, addr string, files tlsfiles.Files) {
	t.Helper()
	conn, err := dial.New(addr, files)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var last error
	for ctx.Err() == nil {
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never served health: %v", addr, last)
}

func waitHTTP(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	var last error
	for ctx.Err() == nil {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: %v", url, last)
}

// buildBinaries builds the named binaries of this module into a temporary directory.
func buildBinaries(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	pkgs := map[string]string{
		"coordinator":  "../../coordinator/cmd/coordinator",
		"fencectl":     "../../coordinator/cmd/fencectl",
		"fence-driver": "../../fence-drivers/cmd/fence-driver",
		"node-agent":   "../../node-agent/cmd/node-agent",
	}
	for _, n := range names {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, n), pkgs[n]).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", n, err, out)
		}
	}
	return dir
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

var serial int64 = 1

// issue writes prefix.crt and prefix.key: a certificate for role (as a SPIFFE URI SAN
// spiffe://nodefence/<role>), for servers also valid for 127.0.0.1 and localhost.
func (ca *testCA) issue(t *testing.T, prefix, role string, server bool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	uri, err := url.Parse("spiffe://nodefence/" + role)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: role},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{uri},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, prefix+".crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, prefix+".key", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})))
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
