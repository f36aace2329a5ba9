package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Help never needs a coordinator or TLS files, goes to stdout and exits 0, in every spelling.
func TestHelpExitsZeroWithoutTLS(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "commands:"},
		{[]string{"-h"}, "commands:"},
		{[]string{"help"}, "commands:"},
		{[]string{"help", "fence"}, "usage: fencectl fence NODE"},
		{[]string{"help", "config", "show"}, "usage: fencectl config show"},
		{[]string{"help", "config"}, "config check PATH"},
		{[]string{"fence", "--help"}, "-no-watch"},
		{[]string{"fence", "n1", "-h"}, "-reason"},
		{[]string{"--coordinator", "x:1", "test", "--help"}, "Monitor"},
		{[]string{"config", "check", "--help"}, "usage: fencectl config check PATH"},
		{[]string{"config", "--help"}, "subcommands:"},
		{[]string{"certs", "--help"}, "-ca-cert"},
		{[]string{"--version"}, "fencectl "},
		{[]string{"version"}, "fencectl "},
		{[]string{"nodes", "--version"}, "fencectl "},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != 0 || !strings.Contains(out.String(), tc.want) || errb.Len() != 0 {
			t.Errorf("fencectl %q: exit %d, stdout lacks %q or stderr not empty:\n%s\nstderr: %s", tc.args, code, tc.want, out.String(), errb.String())
		}
	}
	// Every command of the table has a summary and answers help both ways.
	for _, cmd := range commands {
		for _, args := range [][]string{{"help", cmd.name}, append(strings.Fields(cmd.name), "--help")} {
			var out, errb bytes.Buffer
			if code := run(context.Background(), args, &out, &errb); code != 0 || cmd.summary == "" || !strings.Contains(out.String(), cmd.summary) {
				t.Errorf("fencectl %q: exit %d, stdout:\n%s\nstderr: %s", args, code, out.String(), errb.String())
			}
		}
	}
	// A command's help lists its own flags, not another command's.
	var out bytes.Buffer
	run(context.Background(), []string{"help", "nodes"}, &out, &out)
	if strings.Contains(out.String(), "-no-watch") || strings.Contains(out.String(), "-force") {
		t.Errorf("help nodes lists another command's flags:\n%s", out.String())
	}
}

// A wrong command line exits 2 and names what is wrong; nothing is sent.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "COMMAND: missing"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"fence"}, "want NODE"},
		{[]string{"fence", "a", "b"}, "want NODE"},
		{[]string{"nodes", "extra"}, "want no arguments"},
		{[]string{"nodes", "--frob"}, "unknown flag -frob"},
		{[]string{"nodes", "--no-watch"}, "unknown flag -no-watch"},
		{[]string{"--frob", "nodes"}, "unknown flag --frob"},
		{[]string{"config"}, "want a subcommand: show, view, get-contexts, use-context, set-context, check"},
		{[]string{"config", "check"}, "want PATH"},
		{[]string{"nodes", "-o", "xml"}, `-o: "xml" is not one of table, json, yaml`},
		{[]string{"config", "check", "x", "-o", "json"}, "prints text only"},
		{[]string{"--coordinator", "", "nodes"}, "--coordinator: at least one address is required"},
		{[]string{"list", "--status", "bogus"}, `--status: "bogus"`},
		{[]string{"list", "--would", "--status", "done"}, `--would lists observed records`},
		{[]string{"watch"}, "want ID or --node NODE"},
		{[]string{"nodes", "--timeout", "soon"}, "invalid value"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"--insecure"}, tc.args...), &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("fencectl %q: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
	// Without TLS flags, a command that calls the coordinator asks for them, after the command too.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"nodes"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--tls-ca") {
		t.Errorf("nodes without TLS: exit %d, stderr %q", code, errb.String())
	}
}

// Global flags are found before and after the command and its arguments, "--" ends the flags.
func TestGlobalFlagsAnywhere(t *testing.T) {
	c := &ctl{}
	global := c.globalFlags()
	name, rest, _, err := splitCommand(global, []string{"--coordinator", "a:1", "-o", "json", "--insecure", "fence", "n1", "--timeout", "5s", "--reason", "r"})
	if err != nil || name != "fence" {
		t.Fatalf("splitCommand: %q %v", name, err)
	}
	fs, _ := lookup("fence").flagSet(global)
	pos, err := parseInterleaved(fs, rest)
	if err != nil || len(pos) != 1 || pos[0] != "n1" || c.addrs != "a:1" || c.output != "json" || !c.tls.Insecure || c.timeout.String() != "5s" {
		t.Fatalf("pos %q err %v, ctl %+v", pos, err, c)
	}
	fs, _ = lookup("watch").flagSet((&ctl{}).globalFlags())
	if pos, err := parseInterleaved(fs, []string{"--node", "x", "--", "-odd-id"}); err != nil || len(pos) != 1 || pos[0] != "-odd-id" {
		t.Fatalf("-- : pos %q err %v", pos, err)
	}
	if name, _, _, _ := splitCommand(global, []string{"--insecure", "config", "show", "-o", "yaml"}); name != "config show" {
		t.Fatalf("group: %q", name)
	}
}
