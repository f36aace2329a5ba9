package fenceagent_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nodefence/nodefence/fence-drivers/fenceagent"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// shellAgents are the installed ClusterLabs agents (Debian fence-agents) that log in to their
// device over ssh or telnet through fencing.py, which builds the command line `ssh <username>@<ip>
// -p <ipport> ...` or `telnet <ip> <ipport>` and splits it at whitespace. ssh is true for those
// that take --ssh (the others speak telnet only). Read from `fence_x -o metadata` of every
// /usr/sbin/fence_*: an agent with a "ssh" parameter, or a "telnet_path" one.
//
// control is added to the stdin of the control run by hand, for agents that need more than the
// common parameters to reach their ssh login: fence_apc's default ssh options (-1 -c blowfish)
// make today's ssh exit before it reads ProxyCommand, fence_lpar needs a managed system.
// noControl says why an agent cannot be shown exploitable by hand here.
var shellAgents = []struct {
	name      string
	ssh       bool
	control   string
	noControl string
}{
	{"fence_alom", true, "", ""}, {"fence_apc", true, "ssh_options=-oLogLevel=ERROR\n", ""}, {"fence_bladecenter", true, "", ""}, {"fence_brocade", true, "", ""},
	{"fence_cdu", false, "", ""}, {"fence_cyberpower_ssh", true, "", ""}, {"fence_drac", false, "", ""}, {"fence_drac5", true, "", ""},
	{"fence_hds_cb", true, "", ""}, {"fence_hpblade", true, "", ""}, {"fence_ilo3_ssh", true, "", ""}, {"fence_ilo4_ssh", true, "", ""},
	{"fence_ilo5_ssh", true, "", ""}, {"fence_ilo_moonshot", true, "", ""}, {"fence_ilo_mp", true, "", ""}, {"fence_ilo_ssh", true, "", ""},
	{"fence_ldom", true, "", ""}, {"fence_lpar", true, "managed=m1\n", ""}, {"fence_netio", false, "", ""}, {"fence_raritan", false, "", ""},
	{"fence_raritan_px3", true, "", ""}, {"fence_rsa", true, "", ""}, {"fence_rsb", true, "", ""}, {"fence_sanbox2", false, "", ""},
	{"fence_vbox", true, "", ""}, {"fence_virsh", true, "", ""},
	{"fence_vmware", true, "", "it needs fence_vmware_helper, which Debian does not ship"}, {"fence_wti", true, "", ""},
}

// TestNoOptionInjectionThroughAnyShellAgent runs, for every fence agent that uses ssh or telnet,
// the REAL agent through the driver with a value that a whitespace-split command line reads as an
// option: the ssh option ProxyCommand naming a script that creates a marker file. Every such call
// is refused with InvalidArgument naming the parameter, and the script never runs. A control run
// of the same agent by hand (no driver) with the user-name attack shows the marker IS created:
// the agents are exploitable, and the driver's typed validation is what stops it. Before the fix,
// username "-oProxyCommand=<script> x" passed the allowlist and ran the script as root.
func TestNoOptionInjectionThroughAnyShellAgent(t *testing.T) {
	d := fenceagent.New().(*fenceagent.Driver)
	c := serve(t, d)
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	script := filepath.Join(dir, "proxy.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"$0\" >> "+marker+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ran := func() bool { _, err := os.Stat(marker); return err == nil }
	proxy := "-oProxyCommand=" + script
	for _, a := range shellAgents {
		t.Run(a.name, func(t *testing.T) {
			m, err := d.Metadata(a.name)
			if err != nil {
				t.Fatalf("metadata: %v", err)
			}
			if _, hasSSH := m.Params["ssh"]; hasSSH != a.ssh {
				t.Fatalf("%s: metadata says ssh=%v, the table %v: re-read the installed agents", a.name, hasSSH, a.ssh)
			}
			base := map[string]string{"agent": a.name, "ip": "127.0.0.1", "ipport": "1", "password": "x",
				"login_timeout": "2", "shell_timeout": "2", "power_timeout": "2"}
			if _, ok := m.Params["username"]; ok {
				base["username"] = "admin"
			}
			if _, ok := m.Params["plug"]; ok {
				base["plug"] = "1"
			}
			if a.ssh {
				base["ssh"] = "1"
			}
			attacks := [][2]string{
				{"username", proxy + " x"}, {"login", proxy}, {"ip", proxy}, {"ip", "127.0.0.1 " + proxy},
				{"ipport", "22 " + proxy}, {"plug", "1 " + proxy}, {"ssh_options", proxy},
				{"identity_file", script}, {"ssh_path", script}, {"telnet_path", script},
			}
			for _, attack := range attacks {
				params := map[string]string{}
				for k, v := range base {
					params[k] = v
				}
				params[attack[0]] = attack[1]
				tg := &driverv1.Target{Name: "n1", Parameters: params}
				ctx := testCtx(t, 30*time.Second)
				_, err := c.Status(ctx, &driverv1.StatusRequest{Target: tg, Timeout: durationpb.New(15 * time.Second)})
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "target.parameters."+attack[0]) {
					t.Errorf("Status with %s=%q: %v, want InvalidArgument naming target.parameters.%s", attack[0], attack[1], err, attack[0])
				}
				_, err = c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: opID(), Epoch: 1, Target: tg, Timeout: durationpb.New(15 * time.Second)})
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("PowerOff with %s=%q: %v, want InvalidArgument", attack[0], attack[1], err)
				}
				if ran() {
					t.Fatalf("%s with %s=%q: the ProxyCommand script ran", a.name, attack[0], attack[1])
				}
			}
			if !a.ssh {
				return
			}
			if a.noControl != "" {
				t.Logf("no control run by hand for %s: %s", a.name, a.noControl)
				return
			}
			// Control: the agent by hand, fed the same user name on stdin, runs the script.
			in := "action=status\nip=127.0.0.1\nipport=1\npassword=x\nssh=1\nlogin_timeout=2\nshell_timeout=2\nusername=" + proxy + " x\n"
			if base["plug"] != "" {
				in += "plug=1\n"
			}
			in += a.control
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join("/usr/sbin", a.name))
			cmd.Stdin = strings.NewReader(in)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			_ = cmd.Run()
			if !ran() {
				t.Fatalf("control: %s run by hand with username %q did not run the script; the test proves nothing for it:\n%s", a.name, proxy+" x", out.String())
			}
			if err := os.Remove(marker); err != nil {
				t.Fatal(err)
			}
		})
	}
}
