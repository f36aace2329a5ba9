package redact

import (
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	for name, want := range map[string]bool{
		"password": true, "passwd": true, "Snmp-Priv-Passwd": true, "community": true, "access_key": true,
		"secret_key": true, "hexadecimal_kg": true, "token": true, "bearer_token": true,
		"login": false, "ipaddr": false, "plug": false, "username": false, "power_wait": false,
	} {
		if got := Name(name); got != want {
			t.Errorf("Name(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{"EtcdPassword": true, "EtcdPasswordFile": false, "SecretsDir": false, "ID": false} {
		if got := Setting(name); got != want {
			t.Errorf("Setting(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestParamsAndValues(t *testing.T) {
	params := map[string]string{"login": "admin", "passwd": "hunter2", "passwd_file": "/etc/pw", "community_secret": "snmp/community"}
	got := Params(params, Name)
	if got["passwd"] != Mask || got["login"] != "admin" || got["passwd_file"] != "/etc/pw" || got["community_secret"] != "snmp/community" {
		t.Fatalf("Params: %v", got)
	}
	s := Values("login admin with hunter2 failed", params, Name)
	if strings.Contains(s, "hunter2") || !strings.Contains(s, "admin") {
		t.Fatalf("Values: %q", s)
	}
}
