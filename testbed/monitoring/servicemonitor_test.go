package monitoring

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nodefence/nodefence/services/identity"
)

// docs reads the YAML documents of a file as generic maps.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, d := range strings.Split(string(b), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// get walks nested maps.
func get(m any, keys ...string) any {
	for _, k := range keys {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[k]
	}
	return m
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// The ServiceMonitors scrape the coordinator, the drivers and the agents over https with a client
// certificate that cert-manager issues for an identity the policy lets read /metrics, verify each
// server by a DNS name a deploy/ certificate carries, and every component serves its metrics port
// with --metrics-tls.
func TestServiceMonitorsScrapeOverMutualTLS(t *testing.T) {
	certs := map[string]map[string]any{} // secretName -> Certificate spec
	var dnsNames []string
	for _, c := range docs(t, "../../deploy/cert-manager/certificates.yaml") {
		if c["kind"] != "Certificate" {
			continue
		}
		spec := c["spec"].(map[string]any)
		certs[spec["secretName"].(string)] = spec
		if d := spec["dnsNames"]; d != nil {
			dnsNames = append(dnsNames, strs(d)...)
		}
	}
	secure := map[string]bool{}
	for _, sm := range docs(t, dir+"/servicemonitor.yaml") {
		app, _ := get(sm, "spec", "selector", "matchLabels", "app.kubernetes.io/name").(string)
		ep := get(sm, "spec", "endpoints").([]any)[0]
		if app == "nodefence-etcd" {
			continue
		}
		secure[app] = true
		if get(ep, "scheme") != "https" {
			t.Errorf("%s: scheme %v, want https", app, get(ep, "scheme"))
		}
		secret, _ := get(ep, "tlsConfig", "cert", "secret", "name").(string)
		if get(ep, "tlsConfig", "keySecret", "name") != secret || get(ep, "tlsConfig", "ca", "secret", "name") != secret {
			t.Errorf("%s: tlsConfig does not take certificate, key and CA from one Secret: %v", app, get(ep, "tlsConfig"))
		}
		spec, ok := certs[secret]
		if !ok {
			t.Errorf("%s: Secret %q is issued by no Certificate of deploy/cert-manager", app, secret)
			continue
		}
		uris := strs(spec["uris"])
		id, err := identity.Parse(uris[0])
		if err != nil || len(uris) != 1 {
			t.Errorf("%s: client certificate URIs %v: %v", app, uris, err)
		} else if err := identity.Default.Allow(id, identity.MetricsEndpoint); err != nil || id.Role != identity.Monitoring {
			t.Errorf("%s: client certificate %s: %v (want a monitoring identity)", app, id, err)
		}
		if name, _ := get(ep, "tlsConfig", "serverName").(string); app != "nodefence-node-agent" && !slices.Contains(dnsNames, name) {
			t.Errorf("%s: serverName %q is in no deploy/cert-manager certificate", app, name)
		}
	}
	for _, want := range []string{"nodefence-coordinator", "nodefence-fence-driver", "nodefence-node-agent"} {
		if !secure[want] {
			t.Errorf("no https ServiceMonitor for %s", want)
		}
	}
	workloads := 0
	for _, f := range []string{"coordinator.yaml", "fence-drivers.yaml", "node-agent.yaml"} {
		for _, o := range docs(t, "../../deploy/"+f) {
			if o["kind"] != "Deployment" && o["kind"] != "DaemonSet" {
				continue
			}
			workloads++
			c := get(o, "spec", "template", "spec", "containers").([]any)[0]
			args := strs(get(c, "args"))
			var port string
			for _, p := range get(c, "ports").([]any) {
				if get(p, "name") == "metrics" {
					port = fmt.Sprint(get(p, "containerPort"))
				}
			}
			if !slices.Contains(args, "--metrics-tls") || port == "" || !slices.Contains(args, "--metrics-listen=0.0.0.0:"+port) {
				t.Errorf("%s %v: metrics port %q, args %v: want --metrics-listen=0.0.0.0:<metrics port> --metrics-tls", o["kind"], get(o, "metadata", "name"), port, args)
			}
		}
	}
	if workloads < 5 {
		t.Fatalf("only %d workloads found", workloads)
	}
}
