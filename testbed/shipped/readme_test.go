package shipped

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// programs are the commands whose flags the README names, with the help invocations that print
// every flag: fencectl lists every command with its own flags in its usage.
var programs = map[string]struct {
	pkg  string
	help [][]string
}{
	"coordinator":       {module + "/coordinator/cmd/coordinator", [][]string{{"-h"}}},
	"fencectl":          {module + "/coordinator/cmd/fencectl", [][]string{{"-h"}, {"certs", "-h"}}},
	"node-agent":        {module + "/node-agent/cmd/node-agent", [][]string{{"-h"}}},
	"fence-driver":      {module + "/fence-drivers/cmd/fence-driver", [][]string{{"-h"}}},
	"nodefence-testbed": {module + "/testbed/cmd/nodefence-testbed", [][]string{{"-h"}}},
	"bench-ingest":      {module + "/testbed/cmd/bench-ingest", [][]string{{"-h"}}},
}

// foreignFlags are flags the README names that belong to programs we do not build, each with its
// owner. A name ending in "-" is a family (`--etcd-tls-*` in the README).
var foreignFlags = map[string]string{
	"--auto-compaction-": "etcd's own flags, for an etcd the operator runs",
}

var (
	flagRE      = regexp.MustCompile(`--([a-z][a-z0-9-]*)(\*)?`)
	helpFlagRE  = regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)
	codeSpanRE  = regexp.MustCompile("`([^`\n]+)`")
	makeSpanRE  = regexp.MustCompile(`^make ([a-z][a-z0-9-]*)`)
	makeRuleRE  = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*)\s*:`)
	fenceStart  = "```"
	programWord = regexp.MustCompile(`^(?:\./)?(?:bin/)?([a-z][a-z0-9-]*)\b`)
)

// readme returns the README's code: its inline code spans and the lines of its code blocks.
func readme(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var code []string
	inBlock := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, fenceStart) {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			code = append(code, strings.TrimSpace(line))
			continue
		}
		for _, m := range codeSpanRE.FindAllStringSubmatch(line, -1) {
			code = append(code, strings.TrimSpace(m[1]))
		}
	}
	return code
}

func root(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// flagSets builds each program and reads its flags from its help.
func flagSets(t *testing.T) map[string]map[string]bool {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-o", dir + "/"}
	for _, p := range programs {
		args = append(args, p.pkg)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sets := map[string]map[string]bool{}
	for name, p := range programs {
		set := map[string]bool{}
		for _, h := range p.help {
			out, _ := exec.Command(filepath.Join(dir, name), h...).CombinedOutput() // -h exits 0 or 2
			for _, m := range helpFlagRE.FindAllStringSubmatch(string(out), -1) {
				set["--"+m[1]] = true
			}
			for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
				set["--"+m[1]] = true
			}
		}
		if len(set) == 0 {
			t.Fatalf("%s: no flags in its help", name)
		}
		sets[name] = set
	}
	return sets
}

// Every flag the README names exists: in the named program's flag set when the code names the
// program first (`coordinator --kubeconfig PATH`, bin/fencectl ... in a block), else in some
// program's or in foreignFlags.
func TestReadmeFlagsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	sets := flagSets(t)
	for _, code := range readme(t) {
		prog := ""
		if m := programWord.FindStringSubmatch(code); m != nil && sets[m[1]] != nil {
			prog = m[1]
		}
		for _, m := range flagRE.FindAllStringSubmatch(code, -1) {
			flag, family := "--"+m[1], m[2] == "*" || strings.HasSuffix(m[1], "-")
			if prog != "" {
				if !has(sets[prog], flag, family) {
					t.Errorf("README: %q names %s, which %s does not have", code, flag, prog)
				}
				continue
			}
			if _, ok := foreignFlags[flag]; ok {
				continue
			}
			found := false
			for _, set := range sets {
				found = found || has(set, flag, family)
			}
			if !found {
				t.Errorf("README: %q names %s, which no program has", code, flag)
			}
		}
	}
}

func has(set map[string]bool, flag string, family bool) bool {
	if !family {
		return set[flag]
	}
	for f := range set {
		if strings.HasPrefix(f, flag) {
			return true
		}
	}
	return false
}

// Every `make X` the README names is a Makefile target.
func TestReadmeMakeTargetsExist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeRuleRE.FindAllStringSubmatch(string(b), -1) {
		targets[m[1]] = true
	}
	var named []string
	for _, code := range readme(t) {
		if m := makeSpanRE.FindStringSubmatch(code); m != nil {
			named = append(named, m[1])
		}
	}
	if len(named) == 0 {
		t.Fatal("the README names no make target: the extraction is broken")
	}
	sort.Strings(named)
	for _, n := range named {
		if !targets[n] {
			t.Errorf("README names `make %s`; the Makefile has no such target", n)
		}
	}
}
