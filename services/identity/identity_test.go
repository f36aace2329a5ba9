package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	good := map[string]Identity{
		"spiffe://nodefence/agent/worker-1":                        {Agent, "worker-1"},
		"spiffe://nodefence/operator/alice":                        {Operator, "alice"},
		"spiffe://nodefence/viewer/grafana.ops":                    {Viewer, "grafana.ops"},
		"spiffe://nodefence/coordinator/coord-0":                   {Coordinator, "coord-0"},
		"spiffe://nodefence/driver/ipmi":                           {Driver, "ipmi"},
		"spiffe://nodefence/agent/" + strings.Repeat("a", MaxName): {Agent, strings.Repeat("a", MaxName)},
	}
	for uri, want := range good {
		got, err := Parse(uri)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", uri, got, err, want)
		}
		if got.String() != uri {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), uri)
		}
	}
	for _, uri := range []string{
		"", "spiffe://nodefence/", "spiffe://nodefence/agent", "spiffe://nodefence/agent/",
		"spiffe://other/agent/a", "https://nodefence/agent/a", "SPIFFE://nodefence/agent/a",
		"spiffe://nodefence/root/a", "spiffe://nodefence/any/a", "spiffe://nodefence/Agent/a",
		"spiffe://nodefence/agent/a/b", "spiffe://nodefence/agent/A", "spiffe://nodefence/agent/-a",
		"spiffe://nodefence/agent/a-", "spiffe://nodefence/agent/a b", "spiffe://nodefence/agent/a%2fb",
		"spiffe://nodefence/agent/" + strings.Repeat("a", MaxName+1), "spiffe://nodefence/agent/a\n",
		"spiffe://nodefence/agent/a?x=1", "spiffe://nodefence/agent/a#x", "spiffe://nodefence/operator/ali_ce",
	} {
		if id, err := Parse(uri); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", uri, id)
		}
	}
}

// certWithURIs signs a certificate whose subjectAltName holds exactly the given URI texts, as
// written: crypto/x509 would print a *url.URL back in its canonical spelling.
func certWithURIs(t testing.TB, key *ecdsa.PrivateKey, uris ...string) (*x509.Certificate, error) {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0)}
	if len(uris) > 0 {
		names := make([]asn1.RawValue, len(uris))
		for i, u := range uris {
			names[i] = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(u)}
		}
		val, err := asn1.Marshal(names)
		if err != nil {
			return nil, err
		}
		tmpl.ExtraExtensions = []pkix.Extension{{Id: oidSubjectAltName, Value: val}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func testKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestFromCert(t *testing.T) {
	key := testKey(t)
	cases := []struct {
		name string
		uris []string
		want Identity
		ok   bool
	}{
		{"one", []string{"spiffe://nodefence/agent/n1"}, Identity{Agent, "n1"}, true},
		{"foreign SANs ignored", []string{"spiffe://example.org/x", "https://nodefence/agent/a", "spiffe://nodefence/operator/a"}, Identity{Operator, "a"}, true},
		{"none", nil, Identity{}, false},
		{"two", []string{"spiffe://nodefence/agent/n1", "spiffe://nodefence/operator/a"}, Identity{}, false},
		{"bad name", []string{"spiffe://nodefence/agent/N1"}, Identity{}, false},
		{"port", []string{"spiffe://nodefence:1/agent/n1"}, Identity{}, false},
		{"query", []string{"spiffe://nodefence/agent/n1?a=b"}, Identity{}, false},
		{"user", []string{"spiffe://x@nodefence/agent/n1"}, Identity{}, false},
		// Any spelling of the nodefence trust domain but the canonical one is refused, not ignored
		// (url.Parse would have lower-cased the scheme and unescaped the host).
		{"upper-case scheme", []string{"SPIFFE://nodefence/agent/n1"}, Identity{}, false},
		{"mixed-case scheme", []string{"Spiffe://nodefence/operator/a"}, Identity{}, false},
		{"upper-case host", []string{"spiffe://NODEFENCE/agent/n1"}, Identity{}, false},
		{"upper-case next to canonical", []string{"spiffe://nodefence/agent/n1", "SPIFFE://nodefence/operator/a"}, Identity{}, false},
		{"escaped path", []string{"spiffe://nodefence/agent/n%31"}, Identity{}, false},
	}
	for _, c := range cases {
		cert, err := certWithURIs(t, key, c.uris...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := FromCert(cert)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: FromCert = %v, %v; want %v ok=%v", c.name, got, err, c.want, c.ok)
		}
	}
	// A certificate value without its DER (never one from a TLS handshake) has no identity.
	if id, err := FromCert(&x509.Certificate{URIs: []*url.URL{{Scheme: "spiffe", Host: TrustDomain, Path: "/agent/n1"}}}); err == nil {
		t.Errorf("FromCert of a certificate without extensions = %v, want an error", id)
	}
}

// FromCert never panics and accepts a certificate only when exactly one of its URI SANs claims the
// nodefence trust domain, and that one is written exactly as the identity prints.
func FuzzFromCert(f *testing.F) {
	f.Add("spiffe://nodefence/agent/n1", "")
	f.Add("SPIFFE://nodefence/agent/n1", "spiffe://example.org/x")
	f.Add("spiffe://nodefence/agent/n1", "spiffe://NodeFence/operator/a")
	f.Add("spiffe://nodefence:7/agent/n1", "https://nodefence/agent/a")
	key := testKey(f)
	f.Fuzz(func(t *testing.T, a, b string) {
		var uris []string
		for _, u := range []string{a, b} {
			if u != "" {
				uris = append(uris, u)
			}
		}
		cert, err := certWithURIs(t, key, uris...)
		if err != nil {
			return // crypto/x509 refuses it already
		}
		id, err := FromCert(cert)
		if err != nil {
			return
		}
		exact := 0
		for _, u := range uris {
			switch {
			case u == id.String():
				exact++
			case inTrustDomain(u):
				t.Fatalf("FromCert(%q) = %v although %q claims the trust domain too", uris, id, u)
			}
		}
		if exact != 1 || id.Validate() != nil {
			t.Fatalf("FromCert(%q) = %v, which is not written exactly once", uris, id)
		}
	})
}

// Parse never panics, accepts only what it prints back, and never accepts more than the caps.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"spiffe://nodefence/agent/n1", "spiffe://nodefence/operator/a.b-c", "spiffe://nodefence//", "spiffe://nodefence/agent/%00",
		"SPIFFE://nodefence/agent/n1", "spiffe://NODEFENCE/agent/n1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		if id.String() != s {
			t.Fatalf("Parse(%q) = %v, which prints as %q", s, id, id.String())
		}
		if len(id.Name) > MaxName || id.Validate() != nil {
			t.Fatalf("Parse(%q) accepted %v", s, id)
		}
	})
}

// A device check is a login on a BMC or PDU: operators only. The live configuration is a read.
func TestPolicyOfDeviceChecksAndConfig(t *testing.T) {
	const check = "/nodefence.coordinator.v1.ClusterService/CheckNode"
	const cfg = "/nodefence.coordinator.v1.ClusterService/GetConfig"
	for _, tc := range []struct {
		role       Role
		check, cfg bool
	}{
		{Operator, true, true}, {Viewer, false, true}, {Agent, false, false}, {Driver, false, false}, {Coordinator, false, false},
	} {
		if got := Default.Allow(Identity{tc.role, "n"}, check) == nil; got != tc.check {
			t.Errorf("%s calling CheckNode: allowed=%v, want %v", tc.role, got, tc.check)
		}
		if got := Default.Allow(Identity{tc.role, "n"}, cfg) == nil; got != tc.cfg {
			t.Errorf("%s calling GetConfig: allowed=%v, want %v", tc.role, got, tc.cfg)
		}
	}
}
