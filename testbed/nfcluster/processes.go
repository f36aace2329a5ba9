package nfcluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/cluster"
	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/procs"
)

func (d *Deployment) startEtcd() error {
	assets, err := kubetest.AssetsDir()
	if err != nil {
		return err
	}
	ports, err := freePorts("127.0.0.1", 2)
	if err != nil {
		return err
	}
	// The store is locked as deploy/'s: etcd has a CA of its own, and only the coordinators hold a
	// client certificate of it.
	client, peer := "https://127.0.0.1:"+strconv.Itoa(ports[0]), "http://127.0.0.1:"+strconv.Itoa(ports[1])
	dir := filepath.Join(d.Opts.Dir, "pki")
	etcdCA, err := certs.NewCA("nodefence etcd CA", 24*time.Hour)
	if err != nil {
		return err
	}
	etcdCAFile, _, err := certs.Pair{CertPEM: etcdCA.CertPEM, KeyPEM: etcdCA.KeyPEM()}.Write(dir, "etcd-ca")
	if err != nil {
		return err
	}
	pair, err := etcdCA.IssueURIs("nodefence-etcd", nil, []string{"127.0.0.1"}, 24*time.Hour)
	if err != nil {
		return err
	}
	cert, key, err := pair.Write(dir, "etcd-member")
	if err != nil {
		return err
	}
	if pair, err = etcdCA.IssueURIs("nodefence-coordinator", nil, nil, 24*time.Hour); err != nil {
		return err
	}
	d.etcdClient = tlsfiles.Files{CAFile: etcdCAFile}
	if d.etcdClient.CertFile, d.etcdClient.KeyFile, err = pair.Write(dir, "etcd-coordinator"); err != nil {
		return err
	}
	data := filepath.Join(d.Opts.Dir, "etcd")
	_ = os.RemoveAll(data)
	d.etcd, err = procs.StartAppend("nodefence-etcd", d.logPath("etcd"), filepath.Join(assets, kubetest.EtcdBinary),
		"--name=nodefence", "--data-dir="+data, "--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--cert-file="+cert, "--key-file="+key, "--trusted-ca-file="+etcdCAFile, "--client-cert-auth",
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=nodefence="+peer,
		"--initial-cluster-state=new", "--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	d.etcdURL = client
	tlsConf, err := d.etcdClient.Client()
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConf}}
	return d.etcd.WaitUntil(time.Now().Add(30*time.Second), func() bool {
		resp, err := hc.Get(client + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (d *Deployment) logPath(name string) string {
	return filepath.Join(d.Opts.Dir, "log", name+".log")
}

func (d *Deployment) startDriver() error {
	ports, err := freePorts("127.0.0.1", 1)
	if err != nil {
		return err
	}
	d.DriverAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
	tls, err := d.issue(identity.Driver, "ipmi")
	if err != nil {
		return err
	}
	d.driver, err = procs.StartAppend("fence-driver", d.logPath("fence-driver"), filepath.Join(d.Opts.BinDir, "fence-driver"), append(pki.Args("", tls),
		"--driver=ipmi", "--state-dir="+filepath.Join(d.Opts.Dir, "driver"), "--listen="+d.DriverAddr,
		"--poll-interval=100ms", "--default-timeout=20s")...)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(d.Opts.Dir, "driver"), 0o700); err != nil {
		return err
	}
	return d.driver.WaitUntil(time.Now().Add(30*time.Second), func() bool { return dialable(d.DriverAddr) })
}

func (d *Deployment) startCoordinator(i int, kubeconfig string) (*Coordinator, error) {
	host := d.Cluster.HostIP().String()
	ports, err := freePorts(host, 2)
	if err != nil {
		return nil, err
	}
	o := d.Opts
	co := &Coordinator{ID: "coordinator-" + strconv.Itoa(i), Addr: net.JoinHostPort(host, strconv.Itoa(ports[0])),
		AdmissionAddr: net.JoinHostPort(host, strconv.Itoa(ports[1]))}
	if i == 1 {
		// The first one also answers the apiserver's authorization webhook (testbed/cluster).
		co.AdmissionAddr = net.JoinHostPort(host, strconv.Itoa(cluster.NodeAgentAuthzPort))
	}
	tls, err := d.issue(identity.Coordinator, co.ID)
	if err != nil {
		return nil, err
	}
	args := append(append(pki.Args("", tls), pki.Args("driver-", tls)...), pki.Args("etcd-", d.etcdClient)...)
	args = append(args,
		"--id="+co.ID, "--listen="+co.Addr,
		"--etcd-endpoints="+d.etcdURL, "--kubeconfig="+kubeconfig, "--fence-namespace="+Namespace,
		"--driver-endpoint=ipmi="+d.DriverAddr, "--kdump-listen=", "--admission-listen="+co.AdmissionAddr)
	if o.Shipped {
		args = append(args, ShippedFlags...)
	} else {
		args = append(args, testbedFlags(o)...)
	}
	co.log, co.bin, co.args = d.logPath(co.ID), filepath.Join(o.BinDir, "coordinator"), append(args, o.CoordinatorArgs...)
	if err := co.start(); err != nil {
		return nil, err
	}
	return co, nil
}

// start runs the replica's process and waits until it accepts connections.
func (co *Coordinator) start() error {
	p, err := procs.StartAppend(co.ID, co.log, co.bin, co.args...)
	if err != nil {
		return err
	}
	co.p = p
	return p.WaitUntil(time.Now().Add(30*time.Second), func() bool { return dialable(co.Addr) })
}

// Restart starts a replica that was killed again, with the same flags and address, and waits
// until it accepts connections.
func (co *Coordinator) Restart() error {
	if co.Alive() {
		return fmt.Errorf("%s still runs", co.ID)
	}
	return co.start()
}

// ShippedFlags are the flags deploy/coordinator.yaml passes besides where things are (addresses,
// certificates, kubeconfig, namespace, drivers): with Options.Shipped the coordinators get these
// and no other setting.
var ShippedFlags = []string{"--fence-policy=stateful"}

// testbedFlags are the testbed's lifecycle settings: short grace periods and timeouts, no fence
// budget, a fast election and heartbeat.
func testbedFlags(o Options) []string {
	return []string{
		"--node-monitor-grace-period=" + o.Grace.String(), "--node-startup-grace-period=" + (2 * o.Grace).String(),
		"--fence-timeout=" + o.FenceTimeout.String(), "--node-eviction-rate=1", "--fence-budget=0",
		"--fence-op-timeout=" + o.FenceOpTimeout.String(), "--fence-retries=" + strconv.Itoa(o.Retries),
		"--fence-retry-backoff=" + o.Backoff.String(), "--election-ttl=2s",
		"--power-management-polls=3", "--power-management-poll-interval=1s",
		"--agent-heartbeat-interval=500ms", "--agent-sample-interval=1s"}
}

// startAgents starts a node-agent on every node as one of its services, with the node's watchdog
// device and its peer checks when Options.Watchdog is set.
func (d *Deployment) startAgents(ctx context.Context, admin *kubernetes.Clientset, addrs []string) error {
	for _, n := range d.Cluster.Nodes {
		tls, err := d.issue(identity.Agent, n.Name)
		if err != nil {
			return err
		}
		kc, err := d.agentKubeconfig(ctx, admin, n)
		if err != nil {
			return err
		}
		// Kubernetes mode with the node's kubelet directories; no eviction threshold unless the
		// test sets one, as the testbed's kubelets have none (the nodes share one machine).
		args := append(pki.Args("", tls),
			"--coordinator="+strings.Join(addrs, ","), "--node-name="+n.Name, "--zone="+n.Zone, "--region="+d.Cluster.Config.Region,
			"--boot-id-file="+n.BootIDFile(), "--nodefs-path="+n.Dir, "--log-level=info",
			"--container-runtime-endpoint=unix://"+filepath.Join(n.Dir, "containerd.sock"),
			"--kubeconfig="+kc, "--kubelet-root-dir="+filepath.Join(n.Dir, "kubelet"), "--pod-log-dir="+filepath.Join(n.Dir, "pod-logs"),
			"--cgroup-driver=cgroupfs", "--kubelet-cgroup-root="+n.CgroupRoot, "--eviction-hard=")
		if d.Opts.Watchdog > 0 {
			if _, err := n.StartWatchdog(d.Opts.Watchdog); err != nil {
				return err
			}
			d.watchdogs = append(d.watchdogs, n)
			args = append(args, "--watchdog-device="+n.WatchdogPath(), "--watchdog-timeout="+d.Opts.Watchdog.String())
			args = append(args, peerArgs(d.Cluster, n)...)
		}
		if d.Opts.AgentArgs != nil {
			args = append(args, d.Opts.AgentArgs(n)...)
		}
		if err := n.AddService(cluster.Service{Name: "node-agent", Bin: filepath.Join(d.Opts.BinDir, "node-agent"), Args: args}); err != nil {
			return err
		}
	}
	return nil
}

// PeerPort is the port each node's agent answers the other agents' lease checks on (--peer-listen)
// at the node's address, in watchdog mode.
const PeerPort = 7102

// peerArgs are node n's agent's peer flags: it answers on its own address, and asks every other
// node's agent.
func peerArgs(c *cluster.Cluster, n *cluster.Node) []string {
	args := []string{"--peer-listen=" + net.JoinHostPort(n.IP.String(), strconv.Itoa(PeerPort))}
	for _, o := range c.Nodes {
		if o != n {
			args = append(args, "--peer="+o.Name+"="+net.JoinHostPort(o.IP.String(), strconv.Itoa(PeerPort)))
		}
	}
	return args
}

// SignalEtcd sends sig to the deployment's etcd (SIGSTOP: the store is gone for everyone, as when
// its quorum is lost; SIGCONT: back).
func (d *Deployment) SignalEtcd(sig syscall.Signal) error {
	return syscall.Kill(d.etcd.PID(), sig)
}
