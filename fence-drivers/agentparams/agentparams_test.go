package agentparams

import (
	"errors"
	"strings"
	"testing"
	"unicode"

	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/redact"
)

func TestValueByKind(t *testing.T) {
	good := map[Kind][]string{
		KindAddress:   {"127.0.0.1", "10.0.0.2", "::1", "[::1]", "fe80::1", "bmc-1.example.org", "localhost", "pdu7", "a.b.c."},
		KindPort:      {"1", "22", "623", "65535"},
		KindPlug:      {"1", "07", "node-1", "vm_a.b", "Server1/2", "host@lpar"},
		KindUser:      {"admin", "root", "USERID", "a.b@corp", "x_y-z"},
		KindSecret:    {"", "p@ss word; $(x) -o", strings.Repeat("s", 512)},
		KindNumber:    {"0", "3", "86400"},
		KindFlag:      {"", "1", "0", "true", "off", "Yes"},
		KindPath:      {"", "/redfish/v1", "/redfish/v1/Systems/1%20a"},
		KindSeparator: {",", ":"},
		KindHex:       {"", "0123abcdEF"},
		KindWord:      {"md5", "operator", "3", "eu-west-1", "us:a"},
		KindText:      {"/tmp/x/status", "file", "a=b,c"},
	}
	bad := map[Kind][]string{
		KindAddress: {"", "-oProxyCommand=/tmp/x", "10.0.0.2 -oProxyCommand=/tmp/x", "a b", "127.1", "0x7f.1", "017.0.0.1", "1.2.3.4.5",
			"fe80::1%eth0", "host_name", "-host", "host-", "a..b", "h\n", " h", strings.Repeat("a", 64) + ".b"},
		KindPort:      {"", "0", "65536", "22 -oProxyCommand=/tmp/x", "-22", "+22", "022", " 22", "0x16"},
		KindPlug:      {"-1", "1 -oX", "a;b", "a\nb", "a b", strings.Repeat("p", 65), "$(id)", "`id`"},
		KindUser:      {"", "-oProxyCommand=/tmp/x x", "-admin", "ad min", "ad\tmin", "a;b", "a\x00", "ä", strings.Repeat("u", 129), "a$b"},
		KindSecret:    {"a\nb", "a\rb", "a\x00b", strings.Repeat("s", 513)},
		KindNumber:    {"", "-1", "1.5", "86401", "1 2", "01"},
		KindFlag:      {"2", "maybe", "1 -o"},
		KindPath:      {"redfish", "/a b", "/a;b", "-/a"},
		KindSeparator: {"", ";", ",,", " ", "-"},
		KindHex:       {"xyz", "-1", "0a 0b"},
		KindWord:      {"-o", "a b", "a/b", "a;b", strings.Repeat("w", 129)},
		KindText:      {"-o", "a b", "a;b", "$x"},
	}
	for k, vs := range good {
		for _, v := range vs {
			if err := Value(k, v); err != nil {
				t.Errorf("Value(%s, %q) = %v, want accepted", k, v, err)
			}
		}
	}
	for k, vs := range bad {
		for _, v := range vs {
			if err := Value(k, v); err == nil {
				t.Errorf("Value(%s, %q) accepted, want refused", k, v)
			}
		}
	}
}

// TestCheckNamesTheField: the exploit of issue 22 (a user name that becomes ssh's ProxyCommand)
// and its siblings in every address-like field are refused, each problem naming its parameter.
func TestCheckNamesTheField(t *testing.T) {
	const evil = "-oProxyCommand=/tmp/pwn"
	for _, tc := range []struct {
		params map[string]string
		field  string
	}{
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "username": evil + " x"}, "username"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "login": evil}, "login"},
		{map[string]string{"agent": "fence_wti", "ip": evil}, "ip"},
		{map[string]string{"agent": "fence_wti", "ipaddr": "10.0.0.1 " + evil}, "ipaddr"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "ipport": "22 " + evil}, "ipport"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "plug": "1 " + evil}, "plug"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "ssh_options": evil}, "ssh_options"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "ssh_path": "/tmp/pwn"}, "ssh_path"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "identity_file": "/root/.ssh/id_rsa"}, "identity_file"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "power_wait": "1 " + evil}, "power_wait"},
		{map[string]string{"agent": "../../bin/sh", "ip": "10.0.0.1"}, "agent"},
		{map[string]string{"agent": "fence_wti", "ip": "10.0.0.1", "password": "x\n" + "ssh_options=" + evil}, "password"},
	} {
		err := Check(tc.params, nil)
		var inv fault.Invalid
		if !errors.As(err, &inv) || len(inv) != 1 || inv[0].Field != tc.field {
			t.Errorf("Check(%q) = %v, want one problem naming %s", tc.params, err, tc.field)
		}
	}
	ok := map[string]string{"agent": "fence_wti", "ip": "pdu1.example.org", "ipport": "22", "ssh": "1", "username": "admin",
		"password_file": "/etc/nodefence/pdu", "plug": "3", "power_wait": "5", "Login-Timeout": "10"}
	if err := Check(ok, nil); err != nil {
		t.Errorf("Check(%q) = %v, want nil", ok, err)
	}
	if err := Check(map[string]string{"status_file": "/tmp/s"}, nil); err == nil {
		t.Error("status_file passed without being an extra parameter")
	}
	if err := Check(map[string]string{"status_file": "/tmp/s"}, []string{"status_file"}); err != nil {
		t.Errorf("status_file as an extra parameter: %v", err)
	}
	if err := Check(map[string]string{"ssh_path": "/tmp/s"}, []string{AnyExtra}); err == nil {
		t.Error("AnyExtra let a forbidden name pass")
	}
}

// FuzzCheck feeds the validator arbitrary parameters: it never panics, and whatever it accepts is
// safe on a command line split at whitespace: no value but a secret holds whitespace, a control
// or shell character, or starts with '-'; a secret is one line.
func FuzzCheck(f *testing.F) {
	f.Add("username", "-oProxyCommand=/tmp/pwn x")
	f.Add("ip", "127.0.0.1")
	f.Add("ipport", "22")
	f.Add("plug", "node-1")
	f.Add("password", "p w;$")
	f.Add("agent", "fence_wti")
	f.Add("redfish_uri", "/redfish/v1")
	f.Add("status_file", "/tmp/s")
	f.Fuzz(func(t *testing.T, name, value string) {
		err := Check(map[string]string{name: value}, []string{"status_file"})
		if err != nil {
			var inv fault.Invalid
			if !errors.As(err, &inv) || len(inv) == 0 || inv[0].Field == "" {
				t.Fatalf("Check(%q=%q) = %v: not a fault.Invalid naming a field", name, value, err)
			}
			return
		}
		n := Normalize(name)
		if Reference(n) {
			if strings.ContainsAny(value, "\n\r\x00") {
				t.Fatalf("secret reference %q=%q holds a line break", name, value)
			}
			return
		}
		if n == Agent || n == AgentAlias {
			if !IsAgentName(strings.TrimSpace(value)) {
				t.Fatalf("agent %q accepted", value)
			}
			return
		}
		kind, ok := KindOf(n, []string{"status_file"})
		if !ok {
			t.Fatalf("%q accepted but not allowed", name)
		}
		if kind == KindSecret {
			if strings.ContainsAny(value, "\n\r\x00") || len(value) > 512 {
				t.Fatalf("secret %q=%q accepted", name, value)
			}
			return
		}
		if strings.HasPrefix(value, "-") || strings.ContainsFunc(value, unicode.IsSpace) ||
			strings.ContainsFunc(value, isControl) || strings.ContainsAny(value, shellChars) {
			t.Fatalf("%s %q=%q accepted: unsafe on a command line", kind, name, value)
		}
	})
}

// Every parameter the allowlist passes as a secret is one by services/redact's names too, so the
// drivers' logs, the coordinator's answers and fencectl mask it whichever rule they apply.
func TestSecretKindsAreRedactedNames(t *testing.T) {
	for name, kind := range Allowed() {
		if kind == KindSecret && !redact.Name(name) {
			t.Errorf("%s is a secret here but not by services/redact's names", name)
		}
	}
}
