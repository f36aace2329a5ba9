package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
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

// certs never replaces the CA of DIR silently: a second run signs with the CA already there; a CA
// certificate without its key is refused, naming --new-ca; --new-ca issues a new CA, keeps the old
// one as ca-previous.* and writes the bundle of both.
func TestCertsKeepsTheExistingCA(t *testing.T) {
	dir := t.TempDir()
	run := func(o certsOptions, args ...string) (int, string) {
		var out, errb bytes.Buffer
		o.dir, o.validity, o.hosts = dir, time.Hour, "127.0.0.1"
		code := issueCerts(o, args, &out, &errb)
		return code, out.String() + errb.String()
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if code, out := run(certsOptions{}, "coordinator/c1"); code != 0 {
		t.Fatalf("first run: %d %s", code, out)
	}
	first := read("ca.crt")
	if code, out := run(certsOptions{}, "agent/node-a"); code != 0 || !strings.Contains(out, "existing") {
		t.Fatalf("second run: %d %s; want the existing CA reused", code, out)
	}
	if !bytes.Equal(read("ca.crt"), first) {
		t.Fatal("a second run replaced ca.crt")
	}
	ca, err := certs.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyBy(ca.CertPEM, read("agent-node-a.crt")); err != nil {
		t.Fatalf("the second run's certificate is not of the existing CA: %v", err)
	}

	key := read("ca.key")
	if err := os.Remove(filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	if code, out := run(certsOptions{}, "agent/node-b"); code == 0 || !strings.Contains(out, "--new-ca") || !bytes.Equal(read("ca.crt"), first) {
		t.Fatalf("CA without its key: exit %d, %q; want a refusal naming --new-ca and ca.crt untouched", code, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := run(certsOptions{newCA: true, caCert: "x", caKey: "y"}, "agent/node-b"); code != 2 || !strings.Contains(out, "--new-ca: not with --ca-cert") {
		t.Fatalf("--new-ca with --ca-cert: %d %s", code, out)
	}

	if code, out := run(certsOptions{newCA: true}, "agent/node-b"); code != 0 || !strings.Contains(out, "ca-bundle.crt") {
		t.Fatalf("--new-ca: %d %s", code, out)
	}
	second := read("ca.crt")
	if bytes.Equal(second, first) || !bytes.Equal(read("ca-previous.crt"), first) || !bytes.Equal(read("ca-previous.key"), key) {
		t.Fatal("--new-ca: want a new ca.crt and the old CA kept as ca-previous.crt/.key")
	}
	bundle := read("ca-bundle.crt")
	for _, leaf := range []string{"agent-node-a.crt", "agent-node-b.crt"} {
		if err := verifyBy(bundle, read(leaf)); err != nil {
			t.Errorf("the bundle does not verify %s: %v", leaf, err)
		}
	}
	if err := verifyBy(second, read("agent-node-b.crt")); err != nil {
		t.Errorf("agent-node-b is not of the new CA: %v", err)
	}
}

// verifyBy verifies the leaf PEM against the CA bundle PEM.
func verifyBy(bundle, leafPEM []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return errors.New("no CA in the bundle")
	}
	b, _ := pem.Decode(leafPEM)
	if b == nil {
		return errors.New("no PEM leaf")
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return err
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
