package nodeagent

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/pki"
)

func TestRunInvalidFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // every line expected on stderr
	}{
		{
			name: "every error listed",
			args: []string{
				"--coordinator=nohost,127.0.0.1:7400,", "--node-name=Bad_Name", "--label=noequals", "--label=-x=v",
				"--heartbeat-interval=soon", "--sample-interval=-1s", "--cgroup-version=3", "--zone=bad zone",
				"--eviction-hard=foo<1", "--eviction-soft=memory.available<1Gi", "--eviction-minimum-reclaim=memory.available=1MB",
				"--eviction-max-pod-grace-period=ten", "--eviction-pressure-transition-period=-5m",
				"--log-level=loud", "--boot-id-file=/nonexistent", "extra",
			},
			want: []string{
				`--boot-id-file: open /nonexistent`,
				`--cgroup-version: "3"`,
				`--coordinator: "nohost": want host:port`,
				`--eviction-hard: "foo<1": unknown signal "foo"`,
				`--eviction-max-pod-grace-period: "ten"`,
				`--eviction-minimum-reclaim: memory.available`,
				`--eviction-pressure-transition-period: -5m0s must not be negative`,
				`--eviction-soft: memory.available: a grace period must be set`,
				`--heartbeat-interval: "soon"`,
				`--label: "noequals": want key=value`,
				`--label: key "-x"`,
				`--log-level: "loud"`,
				`--node-name: "Bad_Name"`,
				`--sample-interval: -1s: must be positive`,
				`--tls-ca: required unless --insecure is set`,
				`--zone: "bad zone"`,
				`unexpected arguments: ["extra"]`,
				`17 invalid flag(s)`,
			},
		},
		{name: "pressure and shutdown flags", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t),
			"--housekeeping-interval=0s", "--memory-fast-interval=-1s", "--shutdown-grace-period=10s",
			"--shutdown-grace-period-critical-pods=20s", "--shutdown-grace-period-by-pod-priority=100:1s,x"},
			want: []string{
				"--housekeeping-interval: 0s: must be positive",
				"--memory-fast-interval: -1s: must not be negative",
				"--shutdown-grace-period-by-pod-priority: \"100:1s,x\"",
				"--shutdown-grace-period-critical-pods: 20s must not exceed --shutdown-grace-period 10s",
				"4 invalid flag(s)",
			}},
		{name: "logind conf dir without management", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t),
			"--manage-inhibit-delay=false", "--logind-conf-dir=/run/systemd/logind.conf.d"},
			want: []string{"--logind-conf-dir: has no effect with --manage-inhibit-delay=false", "1 invalid flag(s)"}},
		{name: "relative logind conf dir", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t),
			"--logind-conf-dir=logind.conf.d"},
			want: []string{`--logind-conf-dir: "logind.conf.d": must be an absolute path`, "1 invalid flag(s)"}},
		{name: "empty logind conf dir", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t),
			"--manage-inhibit-delay", "--logind-conf-dir="},
			want: []string{"--logind-conf-dir: must not be empty with --manage-inhibit-delay", "1 invalid flag(s)"}},
		{name: "kubernetes flags", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t),
			"--cgroup-driver=upstart"},
			want: []string{`--cgroup-driver: "upstart": cgroup driver "upstart": want auto, cgroupfs or systemd`, "1 invalid flag(s)"}},
		{name: "relative kubelet directories", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t),
			"--kubelet-root-dir=var/lib/kubelet", "--pod-log-dir=", "--kubelet-cgroup-root=nf-node-1"},
			want: []string{`--kubelet-root-dir: "var/lib/kubelet": must be an absolute path`,
				`--pod-log-dir: "": must be an absolute path`, `--kubelet-cgroup-root: "nf-node-1": must be an absolute path`, "3 invalid flag(s)"}},
		{name: "no coordinator", args: []string{"--insecure", "--boot-id-file=" + bootID(t)},
			want: []string{"--coordinator: at least one coordinator address is required", "1 invalid flag(s)"}},
		{name: "empty boot id", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + writeFile(t, "")},
			want: []string{"boot_id is empty", "1 invalid flag(s)"}},
		{name: "metrics over TLS without TLS", args: []string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t), "--metrics-tls"},
			want: []string{"--metrics-tls: needs --metrics-listen", "--metrics-tls: needs TLS (not --insecure)",
				"--metrics-tls: needs --tls-cert and --tls-key", "--metrics-tls: needs --tls-ca", "4 invalid flag(s)"}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, want: []string{"flag provided but not defined: -no-such-flag"}},
		{name: "certificate of another node", args: append([]string{"--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t), "--node-name=node-a"},
			agentCert(t, "node-b")...),
			want: []string{"--tls-cert: the certificate is spiffe://nodefence/agent/node-b, but an agent for node \"node-a\" needs spiffe://nodefence/agent/node-a", "1 invalid flag(s)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			if code := Main(ctx, tt.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit %d; want 2", code)
			}
			t.Log(stderr.String())
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if !strings.Contains(tt.name, "unknown") && len(lines) != len(tt.want) {
				t.Errorf("%d lines on stderr; want %d", len(lines), len(tt.want))
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q", w)
				}
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
	for _, f := range []string{"-coordinator", "-insecure", "-eviction-hard", "-cgroup-version", "-manage-inhibit-delay", "-logind-conf-dir", "-kubelet-root-dir", "-pod-log-dir"} {
		if !strings.Contains(stderr.String(), f) {
			t.Errorf("usage lacks %s", f)
		}
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "boot_id")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func bootID(t *testing.T) string { return writeFile(t, "0b6a3c1e-1111-4222-8333-444455556666\n") }

// helloCatcher is a real AgentService that reports the first hello and acks.
type helloCatcher struct {
	agentv1.UnimplementedAgentServiceServer
	once  sync.Once
	hello chan *agentv1.Hello
}

func (h *helloCatcher) Connect(st agentv1.AgentService_ConnectServer) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if hello := m.GetHello(); hello != nil {
			h.once.Do(func() { h.hello <- hello })
		}
		if err := st.Send(&agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: m.Seq}}}); err != nil {
			return err
		}
	}
}

func TestRunConnects(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &helloCatcher{hello: make(chan *agentv1.Hello, 1)}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{
			"--coordinator=" + lis.Addr().String(), "--insecure", "--node-name=node-b2", "--zone=b", "--region=eu",
			"--label=rack=r7", "--boot-id-file=" + bootID(t),
			"--proc-root=../signals/testdata/proc", "--cgroup-root=../signals/testdata/v1", "--cgroup-version=1",
			"--eviction-soft=memory.available<1.5Gi", "--eviction-soft-grace-period=memory.available=1m",
		}, &stdout, &stderr)
	}()
	var h *agentv1.Hello
	select {
	case h = <-c.hello:
	case code := <-done:
		t.Fatalf("run exited with %d before a hello:\n%s", code, stderr.String())
	case <-ctx.Done():
		t.Fatal("no hello")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d after cancel; want 0:\n%s", code, stderr.String())
	}
	t.Log(stderr.String())
	if h.NodeName != "node-b2" || h.Zone != "b" || h.Region != "eu" || h.Labels["rack"] != "r7" ||
		h.BootId != "0b6a3c1e-1111-4222-8333-444455556666" || h.Capacity.GetMemoryBytes() != 16<<30 || h.Capacity.GetPids() != 4194304 {
		t.Errorf("hello = %v", h)
	}
}

// TestRunBadKubeconfig: Kubernetes mode that cannot load its kubeconfig stops at once.
func TestRunBadKubeconfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"--coordinator=127.0.0.1:1", "--insecure", "--boot-id-file=" + bootID(t),
		"--proc-root=../signals/testdata/proc", "--cgroup-root=../signals/testdata/v1", "--cgroup-version=1",
		"--nodefs-path=" + t.TempDir(), "--kubeconfig=/nonexistent/kubeconfig"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "cannot start Kubernetes mode") || !strings.Contains(stderr.String(), "--kubeconfig") {
		t.Errorf("exit %d; want 1 naming --kubeconfig:\n%s", code, stderr.String())
	}
}

// agentCert issues a CA and an agent certificate for node and returns the --tls-* flags.
func agentCert(t *testing.T, node string) []string {
	t.Helper()
	p, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.Files(identity.Agent, node)
	if err != nil {
		t.Fatal(err)
	}
	return pki.Args("", f)
}

// TestKubeletCgroupRoot: the pods cgroup allocatableMemory.available is measured on, and the
// pods' cgroups, are under kubelet's --cgroup-root.
func TestKubeletCgroupRoot(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"/kubepods.slice", "/kubepods"}},
		{[]string{"--kubelet-cgroup-root=/nf-node-1"}, []string{"/nf-node-1/kubepods.slice", "/nf-node-1/kubepods"}},
		{[]string{"--kubelet-cgroup-root=/nf-node-1", "--enforce-node-allocatable=none"}, nil},
	} {
		var stderr bytes.Buffer
		args := append([]string{"--insecure", "--coordinator=127.0.0.1:1", "--boot-id-file=" + bootID(t)}, tt.args...)
		opts, errs, _ := parse(args, &stderr)
		if len(errs) > 0 {
			t.Fatalf("%v: %v", tt.args, errs)
		}
		if !slices.Equal(opts.reader.PodsCgroups, tt.want) {
			t.Errorf("%v: pods cgroups %q; want %q", tt.args, opts.reader.PodsCgroups, tt.want)
		}
	}
}
