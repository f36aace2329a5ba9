package app

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEtcdAccessValidate(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		name     string
		access   EtcdAccess
		external bool
		want     []string
	}{
		{"external, nothing", EtcdAccess{}, true, nil},
		{"external, user and password", EtcdAccess{Username: "nodefence", PasswordFile: pw}, true, nil},
		{"embedded with flags", EtcdAccess{Username: "nodefence", PasswordFile: pw}, false, []string{"only with --etcd-endpoints"}},
		{"user without password", EtcdAccess{Username: "nodefence"}, true, []string{"--etcd-password-file: --etcd-username and"}},
		{"cert without key, missing files", EtcdAccess{CertFile: missing, CAFile: missing}, true,
			[]string{"--etcd-tls-key: --etcd-tls-cert and", "--etcd-tls-ca: stat", "--etcd-tls-cert: stat"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := c.access.Validate(c.external)
			if len(errs) != len(c.want) {
				t.Fatalf("errors %v, want %d", errs, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(errs[i].Error(), w) {
					t.Errorf("error %d = %v, want it to contain %q", i, errs[i], w)
				}
			}
		})
	}
}

func TestEtcdAccessClientConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	log := slog.New(slog.DiscardHandler)
	cc, _, err := EtcdAccess{Username: "nodefence", PasswordFile: write("pw", "s3cret\r\n")}.clientConfig([]string{"http://127.0.0.1:2379"}, log)
	if err != nil || cc.Username != "nodefence" || cc.Password != "s3cret" || cc.TLS != nil {
		t.Fatalf("plaintext with a user: %+v, %v", cc, err)
	}
	if cc, _, err = (EtcdAccess{}).clientConfig([]string{"https://127.0.0.1:2379"}, log); err != nil || cc.TLS == nil {
		t.Fatalf("https endpoint: TLS %v, %v; want TLS with the system roots", cc.TLS, err)
	}
	for name, a := range map[string]EtcdAccess{
		"empty password":    {Username: "u", PasswordFile: write("empty", "\n")},
		"huge password":     {Username: "u", PasswordFile: write("huge", strings.Repeat("x", maxPasswordFile+1))},
		"CA without PEM":    {CAFile: write("ca", "not pem")},
		"unreadable client": {CAFile: write("ca2", "not pem"), CertFile: filepath.Join(dir, "nope"), KeyFile: filepath.Join(dir, "nope")},
	} {
		if _, _, err := a.clientConfig([]string{"https://127.0.0.1:2379"}, log); err == nil || !strings.Contains(err.Error(), "--etcd-") {
			t.Errorf("%s: err = %v, want one naming the flag", name, err)
		}
	}
}
