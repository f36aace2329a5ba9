package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodefence/nodefence/coordinator/admit"
)

// DefaultAdmissionAgentUser is the node agents' ServiceAccount user (deploy/rbac-node-agent.yaml).
const DefaultAdmissionAgentUser = "system:serviceaccount:nodefence:nodefence-node-agent"

// admissionServer serves the node-agent admission webhook (coordinator/admit) over TLS with the
// coordinator's server certificate. The apiserver presents no client certificate to a webhook
// unless its own configuration says so, so none is asked for: the webhook only answers whether a
// request of the agents' ServiceAccount concerns the caller's own node, and reveals nothing else.
type admissionServer struct {
	ln  net.Listener
	srv *http.Server
}

// validateAdmission checks the webhook's flags.
func (c *Config) validateAdmission() []error {
	if c.AdmissionListen == "" {
		return nil
	}
	var errs []error
	if !c.kubeMode() {
		errs = append(errs, errors.New("--admission-listen: needs Kubernetes mode (--kubeconfig)"))
	}
	if _, _, err := net.SplitHostPort(c.AdmissionListen); err != nil {
		errs = append(errs, fmt.Errorf("--admission-listen: %q is not host:port", c.AdmissionListen))
	}
	if c.Server.TLS.Insecure || c.Server.TLS.CertFile == "" || c.Server.TLS.KeyFile == "" {
		errs = append(errs, errors.New("--admission-listen: needs --tls-cert and --tls-key (the apiserver calls webhooks over TLS only)"))
	}
	if c.AdmissionAgentUser == "" {
		errs = append(errs, errors.New("--admission-agent-user: empty"))
	}
	return errs
}

// listenAdmission binds the webhook's address. Its certificate is read again when the files
// change (cert-manager renews it in place; the apiserver checks it at every connection).
func (a *App) listenAdmission() error {
	files := a.cfg.Server.TLS
	files.CAFile = "" // no client certificate: see admissionServer
	tc, certs, err := files.ServerReloading()
	if err != nil {
		return fmt.Errorf("--admission-listen: %w", err)
	}
	certs.Now = a.now
	certs.OnError = func(err error) { a.log.Warn("admission webhook certificate not reloaded", "err", err) }
	tc.MinVersion = tls.VersionTLS12
	ln, err := net.Listen("tcp", a.cfg.AdmissionListen)
	if err != nil {
		return fmt.Errorf("--admission-listen: %w", err)
	}
	core := a.kube.core
	h := &admit.Handler{AgentUser: a.cfg.AdmissionAgentUser, Log: a.log.With("component", "admission"),
		Pods: func(ctx context.Context, ns, name string) (*corev1.Pod, error) {
			p, err := core.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return p, err
		}}
	mux := http.NewServeMux()
	mux.Handle(admit.Path, h)
	mux.Handle(admit.AuthorizePath, &admit.AuthorizeHandler{AgentUser: a.cfg.AdmissionAgentUser})
	a.admission = &admissionServer{ln: tls.NewListener(ln, tc), srv: &http.Server{Handler: mux,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second,
		MaxHeaderBytes: 64 << 10, ErrorLog: nil}}
	a.log.Info("admission and authorization webhooks for the node agents listening", "addr", ln.Addr().String(),
		"admission", admit.Path, "authorization", admit.AuthorizePath)
	return nil
}

// AdmissionAddr is the webhook's address ("" when off).
func (a *App) AdmissionAddr() string {
	if a.admission == nil {
		return ""
	}
	return a.admission.ln.Addr().String()
}

func (s *admissionServer) serve() error {
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (s *admissionServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}
