package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodefence/nodefence/services/identity/certs"
)

// certs --etcd issues etcd's own CA and only a member's and the coordinators' certificates; it
// refuses any other role and the nodefence CA, and without --etcd it refuses etcd's CA.
func TestCertsEtcdCA(t *testing.T) {
	dir := t.TempDir()
	run := func(o certsOptions, args ...string) (int, string) {
		var out, errb bytes.Buffer
		o.dir, o.validity = dir, time.Hour
		if o.hosts == "" {
			o.hosts = "127.0.0.1"
		}
		code := issueCerts(o, args, &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := run(certsOptions{}, "agent/node-a"); code != 0 {
		t.Fatalf("nodefence CA: %d %s", code, out)
	}
	if code, out := run(certsOptions{etcd: true}, "member/nodefence-etcd", "coordinator/nodefence-coordinator"); code != 0 {
		t.Fatalf("etcd CA: %d %s", code, out)
	}
	eca, err := certs.LoadCA(filepath.Join(dir, "etcd-ca.crt"), filepath.Join(dir, "etcd-ca.key"))
	if err != nil || eca.Cert.Subject.CommonName != etcdCAName {
		t.Fatalf("etcd CA: %v %v", eca, err)
	}
	for _, f := range []string{"etcd-member-nodefence-etcd.crt", "etcd-coordinator-nodefence-coordinator.crt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	for _, c := range []struct {
		name string
		o    certsOptions
		args []string
		want string
	}{
		{"an agent from etcd's CA", certsOptions{etcd: true}, []string{"agent/node-a"}, "only member/NAME and coordinator/NAME"},
		{"the nodefence CA for etcd", certsOptions{etcd: true, caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key")},
			[]string{"coordinator/c"}, "this is the nodefence CA"},
		{"etcd's CA for an agent", certsOptions{caCert: filepath.Join(dir, "etcd-ca.crt"), caKey: filepath.Join(dir, "etcd-ca.key")},
			[]string{"agent/node-a"}, "this is etcd's CA"},
	} {
		if code, out := run(c.o, c.args...); code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, output %q, want a refusal with %q", c.name, code, out, c.want)
		}
	}
}
