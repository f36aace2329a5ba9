package identity

import (
	"crypto/x509"
	"net/url"
	"strings"
	"testing"
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

func TestFromCert(t *testing.T) {
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name string
		uris []*url.URL
		want Identity
		ok   bool
	}{
		{"one", []*url.URL{u("spiffe://nodefence/agent/n1")}, Identity{Agent, "n1"}, true},
		{"foreign SANs ignored", []*url.URL{u("spiffe://example.org/x"), u("spiffe://nodefence/operator/a")}, Identity{Operator, "a"}, true},
		{"none", nil, Identity{}, false},
		{"two", []*url.URL{u("spiffe://nodefence/agent/n1"), u("spiffe://nodefence/operator/a")}, Identity{}, false},
		{"bad name", []*url.URL{u("spiffe://nodefence/agent/N1")}, Identity{}, false},
		{"port", []*url.URL{u("spiffe://nodefence:1/agent/n1")}, Identity{}, false},
		{"query", []*url.URL{u("spiffe://nodefence/agent/n1?a=b")}, Identity{}, false},
		{"user", []*url.URL{u("spiffe://x@nodefence/agent/n1")}, Identity{}, false},
	}
	for _, c := range cases {
		got, err := FromCert(&x509.Certificate{URIs: c.uris})
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: FromCert = %v, %v; want %v ok=%v", c.name, got, err, c.want, c.ok)
		}
	}
}

func TestPolicy(t *testing.T) {
	const fence = "/nodefence.coordinator.v1.FenceService/Fence"
	const list = "/nodefence.coordinator.v1.FenceService/ListFences"
	const off = "/nodefence.driver.v1.FenceDriverService/PowerOff"
	const status = "/nodefence.driver.v1.FenceDriverService/Status"
	const connect = "/nodefence.agent.v1.AgentService/Connect"
	allow := map[Role][]string{
		Agent:       {connect},
		Operator:    {fence, list},
		Viewer:      {list},
		Coordinator: {off, status},
		Driver:      nil,
		Monitoring:  {MetricsEndpoint},
		Any:         {fence, list, off, status, connect, MetricsEndpoint},
	}
	allow[Operator] = append(allow[Operator], MetricsEndpoint)
	allow[Viewer] = append(allow[Viewer], MetricsEndpoint)
	for role, allowed := range allow {
		for _, m := range []string{fence, list, off, status, connect, MetricsEndpoint, "/x.Y/Z"} {
			want := false
			for _, a := range allowed {
				want = want || a == m
			}
			if got := Default.Allow(Identity{role, "n"}, m) == nil; got != want {
				t.Errorf("%s calling %s: allowed=%v, want %v", role, m, got, want)
			}
		}
	}
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if err := Default.Allow(Identity{}, m); err != nil {
			t.Errorf("%s: %v, want open", m, err)
		}
	}
}

// Parse never panics, accepts only what it prints back, and never accepts more than the caps.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"spiffe://nodefence/agent/n1", "spiffe://nodefence/operator/a.b-c", "spiffe://nodefence//", "spiffe://nodefence/agent/%00"} {
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
