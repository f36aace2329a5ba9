package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// scrape GETs url with a client presenting files' certificate (none when CertFile is empty).
func scrape(t *testing.T, url string, files tlsfiles.Files) (int, string, error) {
	t.Helper()
	cfg, err := files.Client()
	if err != nil {
		t.Fatal(err)
	}
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// /metrics over mutual TLS answers the identities the default policy names for it (monitoring,
// operator, viewer) and nobody else: a certificate of another role gets 403, no certificate fails
// the handshake, and a plaintext request gets no metrics.
func TestMetricsOverMutualTLS(t *testing.T) {
	p := newPKI(t)
	s := start(t, Config{
		TLS:           tlsfiles.Files{CertFile: p.serverCert, KeyFile: p.serverKey, CAFile: p.ca},
		MetricsListen: "127.0.0.1:0", MetricsTLS: true, Policy: identity.Default,
	})
	url := "https://" + s.MetricsAddr() + "/metrics"
	for _, who := range []string{"monitoring", "viewer", "operator"} {
		code, body, err := scrape(t, url, p.clients[who])
		if err != nil || code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
			t.Fatalf("%s: %d %v, want 200 with metrics:\n%.300s", who, code, err, body)
		}
	}
	for _, who := range []string{"agent", "coordinator"} {
		code, body, err := scrape(t, url, p.clients[who])
		if err != nil || code != http.StatusForbidden || strings.Contains(body, "go_goroutines") {
			t.Fatalf("%s: %d %v, want 403 without metrics:\n%.300s", who, code, err, body)
		}
	}
	if code, _, err := scrape(t, url, p.clients["bare"]); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("certificate without identity: %d %v, want 401", code, err)
	}
	if code, _, err := scrape(t, url, tlsfiles.Files{CAFile: p.ca}); err == nil {
		t.Fatalf("no client certificate: answered %d, want the handshake refused", code)
	}
	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "go_goroutines") {
			t.Fatal("plaintext request read the metrics")
		}
	}
}

func TestMetricsTLSNeedsMutualTLS(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Listen: "127.0.0.1:0", MetricsTLS: true, TLS: tlsfiles.Files{Insecure: true}}, "--metrics-tls: needs --metrics-listen"},
		{Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", MetricsTLS: true, TLS: tlsfiles.Files{Insecure: true}}, "--metrics-tls: needs TLS"},
		{Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", MetricsTLS: true, AllowUnauthenticatedClients: true,
			TLS: tlsfiles.Files{CertFile: "c", KeyFile: "k"}}, "--metrics-tls: needs --tls-ca"},
	} {
		var all []string
		for _, e := range c.cfg.Validate() {
			all = append(all, e.Error())
		}
		if joined := strings.Join(all, "\n"); !strings.Contains(joined, c.want) {
			t.Errorf("%+v: missing %q in:\n%s", c.cfg, c.want, joined)
		}
	}
}
