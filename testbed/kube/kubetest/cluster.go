package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// StartTimeout bounds how long New waits for etcd and the apiserver to be ready.
const StartTimeout = 90 * time.Second

// Cluster is a running etcd and kube-apiserver on 127.0.0.1. It has no controller manager, no
// scheduler and no kubelet.
type Cluster struct {
	// Dir holds the certificates, keys, data and the two processes' logs (etcd.log, apiserver.log).
	Dir string
	// Host is the apiserver URL, https://127.0.0.1:<port>.
	Host string

	caPEM      []byte
	adminToken string
	etcdURL    string
	etcd, api  *proc
	ownsDir    bool
}

// proc is a started child process; done closes when it has exited and been waited for.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a fresh cluster for the test and stops it when the test ends. It fails the test
// (never skips) when the binaries are missing, naming BuildCommand. For one cluster per test
// package, call New in TestMain instead.
func Start(t testing.TB) *Cluster {
	t.Helper()
	c, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log tail:\n%s", tail(filepath.Join(c.Dir, "apiserver.log"), 40))
		}
		c.Stop()
	})
	return c
}

// New runs a fresh etcd and kube-apiserver on free 127.0.0.1 ports, with their files in dir
// (a new temporary directory when dir is empty, removed by Stop). It returns once /readyz is ok.
// The caller must call Stop.
func New(dir string) (*Cluster, error) {
	apiBin, etcdBin, err := Binaries()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir}
	if dir == "" {
		if c.Dir, err = os.MkdirTemp("", "kubetest-"); err != nil {
			return nil, err
		}
		c.ownsDir = true
	}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	if err := c.writeCredentials(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	// A port found free can be taken before the process binds it: retry the few times that happens.
	for attempt := 1; ; attempt++ {
		err = c.startEtcd(ctx, etcdBin)
		if err == nil {
			break
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		err = c.startAPIServer(ctx, apiBin)
		if err == nil {
			break
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

// Stop kills the apiserver and etcd by their process ids, waits for them, and removes the
// directory if New created it. It is safe to call more than once.
func (c *Cluster) Stop() {
	for _, p := range []**proc{&c.api, &c.etcd} {
		stopProcess(*p)
		*p = nil
	}
	if c.ownsDir {
		os.RemoveAll(c.Dir)
		c.ownsDir = false
	}
}

// stopProcess sends SIGTERM to p's process id, then SIGKILL after 5 s, and waits for it.
func stopProcess(p *proc) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Config returns an admin (system:masters) client configuration. Prefer ConfigForClusterRole to
// test with the RBAC a component really gets.
func (c *Cluster) Config() *rest.Config {
	return &rest.Config{
		Host:            c.Host,
		BearerToken:     c.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		QPS:             100,
		Burst:           200,
	}
}

// Clientset is an admin clientset.
func (c *Cluster) Clientset() *kubernetes.Clientset {
	return kubernetes.NewForConfigOrDie(c.Config())
}

// ServiceAccountConfig returns a client configuration authenticating as the ServiceAccount
// namespace/name, creating the namespace and the ServiceAccount if they do not exist. The token
// comes from the TokenRequest API and lives for an hour.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	cs := c.Clientset()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("serviceaccount %s/%s: %w", namespace, name, err)
	}
	hour := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	cfg := c.Config()
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// ConfigForClusterRole returns a client configuration for the ServiceAccount namespace/name bound
// to the existing ClusterRole clusterRole by a ClusterRoleBinding named after the account. Roles
// and RoleBindings in namespaces are the caller's to create (with the admin Config).
func (c *Cluster) ConfigForClusterRole(ctx context.Context, clusterRole, namespace, name string) (*rest.Config, error) {
	cfg, err := c.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubetest:" + namespace + ":" + name + ":" + clusterRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	if _, err := c.Clientset().RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("clusterrolebinding %s: %w", crb.Name, err)
	}
	if err := c.WaitForClusterRole(ctx, clusterRole, namespace, name); err != nil {
		return nil, err
	}
	return cfg, nil
}

// WaitForClusterRole polls until the authorizer grants the ServiceAccount namespace/name the first
// concrete rule of clusterRole (bound by a ClusterRoleBinding): RBAC changes reach the authorizer's
// cache a moment after they are stored, so call it before the first request after binding.
func (c *Cluster) WaitForClusterRole(ctx context.Context, clusterRole, namespace, name string) error {
	cs := c.Clientset()
	role, err := cs.RbacV1().ClusterRoles().Get(ctx, clusterRole, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("clusterrole %s: %w", clusterRole, err)
	}
	var attrs *authorizationv1.ResourceAttributes
	for _, r := range role.Rules {
		if len(r.APIGroups) > 0 && len(r.Resources) > 0 && len(r.Verbs) > 0 && r.Resources[0] != "*" && r.Verbs[0] != "*" {
			attrs = &authorizationv1.ResourceAttributes{Group: r.APIGroups[0], Resource: r.Resources[0], Verb: r.Verbs[0]}
			if i := strings.IndexByte(attrs.Resource, '/'); i > 0 {
				attrs.Resource, attrs.Subresource = attrs.Resource[:i], attrs.Resource[i+1:]
			}
			break
		}
	}
	if attrs == nil {
		return nil // no rule to probe (empty or wildcard role)
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	for {
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: attrs,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if sar.Status.Allowed {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never got %s %s/%s of clusterrole %s: %w", user, attrs.Verb, attrs.Group, attrs.Resource, clusterRole, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeCredentials writes the serving CA and certificate, the service-account key pair and the
// static token file with the admin token.
func (c *Cluster) writeCredentials() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubetest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPriv, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.adminToken = hex.EncodeToString(tok)
	c.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := map[string][]byte{
		"ca.crt":     c.caPEM,
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: srvKeyDER}),
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saPriv}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		"tokens.csv": []byte(c.adminToken + ",kubetest-admin,kubetest-admin,system:masters\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(c.Dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context, bin string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	data := filepath.Join(c.Dir, "etcd")
	os.RemoveAll(data)
	cmd, err := c.spawn(bin, "etcd.log",
		"--name=kubetest", "--data-dir="+data,
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kubetest="+peer, "--initial-cluster-state=new",
		"--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=1073741824")
	if err != nil {
		return err
	}
	c.etcd = cmd
	if err := waitReady(ctx, cmd, http.DefaultClient, client+"/health", "", func(body []byte) bool {
		return bytes.Contains(body, []byte(`"health":"true"`))
	}); err != nil {
		stopProcess(cmd)
		c.etcd = nil
		return fmt.Errorf("etcd: %w\n%s", err, tail(filepath.Join(c.Dir, "etcd.log"), 20))
	}
	c.etcdURL = client
	return nil
}

func (c *Cluster) startAPIServer(ctx context.Context, bin string) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	port := strconv.Itoa(ports[0])
	f := func(name string) string { return filepath.Join(c.Dir, name) }
	cmd, err := c.spawn(bin, "apiserver.log",
		"--etcd-servers="+c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+port,
		"--cert-dir="+f("certs"), "--tls-cert-file="+f("server.crt"), "--tls-private-key-file="+f("server.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+f("sa.pub"), "--service-account-signing-key-file="+f("sa.key"),
		"--token-auth-file="+f("tokens.csv"), "--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none",
		"--v=1")
	if err != nil {
		return err
	}
	c.api = cmd
	c.Host = "https://127.0.0.1:" + port
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if err := waitReady(ctx, cmd, hc, c.Host+"/readyz", c.adminToken, func(body []byte) bool {
		return strings.TrimSpace(string(body)) == "ok"
	}); err != nil {
		stopProcess(cmd)
		c.api = nil
		return fmt.Errorf("kube-apiserver: %w\n%s", err, tail(f("apiserver.log"), 30))
	}
	return nil
}

// spawn starts bin with args, its output appended to logName in c.Dir. The child gets its own
// process group and SIGKILL if the test binary dies first (Pdeathsig), so no orphan outlives a
// crashed test.
func (c *Cluster) spawn(bin, logName string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(filepath.Join(c.Dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

// waitReady polls url until ok(body) holds with status 200, the process exits, or ctx ends.
func waitReady(ctx context.Context, p *proc, hc *http.Client, url, token string, ok func([]byte) bool) error {
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			var buf bytes.Buffer
			buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && ok(buf.Bytes()) {
				return nil
			}
			last = fmt.Sprintf("%s: %d %.200s", url, resp.StatusCode, buf.String())
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("process %d exited before ready (%v; last probe: %s)", p.cmd.Process.Pid, p.cmd.ProcessState, last)
		case <-ctx.Done():
			return fmt.Errorf("not ready in time (last probe: %s): %w", last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
