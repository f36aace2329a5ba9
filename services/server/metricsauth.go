package server

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// MetricsTLSFlagHelp is the help text of every binary's --metrics-tls flag.
const MetricsTLSFlagHelp = "serve --metrics-listen over mutual TLS with --tls-cert, --tls-key and --tls-ca: only callers whose certificate identity the policy allows (spiffe://nodefence/monitoring/NAME, operator, viewer) read /metrics (default off: plaintext, loopback only)"

// ValidateMetricsTLS returns the problems with serving metrics over mutual TLS with files.
func ValidateMetricsTLS(files tlsfiles.Files) []error {
	var errs []error
	if files.Insecure {
		errs = append(errs, errors.New("--metrics-tls: needs TLS (not --insecure)"))
	}
	if files.CertFile == "" || files.KeyFile == "" {
		errs = append(errs, errors.New("--metrics-tls: needs --tls-cert and --tls-key"))
	}
	if files.CAFile == "" {
		errs = append(errs, errors.New("--metrics-tls: needs --tls-ca to verify the scraper's client certificate"))
	}
	return errs
}

// SecureMetrics returns the TLS configuration of a metrics endpoint served over mutual TLS (the
// component's own certificate, clients verified against files' CA: a client without a certificate
// fails the handshake; both read again when the files change) and a wrapper that answers a
// handler only to a caller whose certificate identity policy (nil: identity.Default) allows for
// identity.MetricsEndpoint; any other caller gets 403 (401 for a certificate without an identity).
func SecureMetrics(files tlsfiles.Files, policy identity.Policy, log *slog.Logger) (*tls.Config, func(http.Handler) http.Handler, error) {
	return secureMetrics(nil, files, policy, log)
}

// secureMetrics is SecureMetrics over certs, the reloader of files (nil: one of its own).
func secureMetrics(certs *tlsfiles.Reloader, files tlsfiles.Files, policy identity.Policy, log *slog.Logger) (*tls.Config, func(http.Handler) http.Handler, error) {
	if errs := ValidateMetricsTLS(files); len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	if certs == nil {
		var err error
		if certs, err = files.Watch(log, "the metrics endpoint's certificate"); err != nil {
			return nil, nil, err
		}
	}
	if policy == nil {
		policy = identity.Default
	}
	return certs.ServerConfig(), func(h http.Handler) http.Handler { return authorizeMetrics(policy, h, log) }, nil
}

// authorizeMetrics answers h only to callers policy allows for identity.MetricsEndpoint.
func authorizeMetrics(policy identity.Policy, h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := identity.FromTLS(r.TLS)
		if err != nil {
			http.Error(w, "unauthenticated: "+err.Error(), http.StatusUnauthorized)
			return
		}
		if err := policy.Allow(id, identity.MetricsEndpoint); err != nil {
			log.Warn("metrics request refused", "caller", id.String(), "path", r.URL.Path, "remote", r.RemoteAddr)
			http.Error(w, "permission denied: "+err.Error(), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
