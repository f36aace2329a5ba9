package shipped

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// programs are the commands whose flags the README names, with the help invocations that print
// every flag: fencectl lists every command with its own flags in its usage.
var programs = map[string]struct {
	pkg  string
	help [][]string
}{
	"coordinator":            {module + "/coordinator/cmd/coordinator", [][]string{{"-h"}}},
	"fencectl":               {module + "/coordinator/cmd/fencectl", [][]string{{"-h"}, {"certs", "-h"}}},
	"node-agent":             {module + "/node-agent/cmd/node-agent", [][]string{{"-h"}}},
	"fence-driver":           {module + "/fence-drivers/cmd/fence-driver", [][]string{{"-h"}}},
	"nodefence-testbed":      {module + "/testbed/cmd/nodefence-testbed", [][]string{{"-h"}}},
	"bench-ingest":           {module + "/testbed/cmd/bench-ingest", [][]string{{"-h"}}},
	"bench-recovery-cluster": {module + "/testbed/cmd/bench-recovery-cluster", [][]string{{"-h"}}},
}

// foreignFlags are flags the README and docs/ name that belong to programs we do not build, each with its
// owner. A name ending in "-" is a family (`--etcd-tls-*` in the README).
var foreignFlags = map[string]string{
	"--auto-compaction-":            "etcd's own flags, for an etcd the operator runs",
	"--listen-client-urls":          "etcd's, in docs/operations.md (ports)",
	"--listen-peer-urls":            "etcd's, in docs/operations.md (ports)",
	"--listen-metrics-urls":         "etcd's, in docs/operations.md (ports)",
	"--bump-revision":               "etcdutl snapshot restore's, in docs/operations.md (restore)",
	"--mark-compacted":              "etcdutl snapshot restore's, in docs/operations.md (restore)",
	"--node-lease-duration-seconds": "the kubelet's, in docs/how-it-decides.md (its Lease sets the kubelet window)",
}

// foreignPrograms are programs we do not build whose command lines the documents show: their flags
// are theirs to check.
var foreignPrograms = map[string]bool{
	"kubectl": true, "etcd": true, "etcdctl": true, "etcdutl": true, "systemctl": true, "kubelet": true,
	"ipmitool": true, "ctr": true, "grpcurl": true, "curl": true, "go": true, "journalctl": true,
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

// snippet is one piece of code the documentation shows: an inline code span or a line of a code
// block, with the file it is in.
type snippet struct {
	file, code string
}

// docFiles are the documents whose code must be true: the README and every page in docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md: the glob is broken")
	}
	return append([]string{filepath.Join(root(t), "README.md")}, pages...)
}

// readme returns the code of the README and of every page in docs/: their inline code spans and
// the lines of their code blocks.
func readme(t *testing.T) []snippet {
	t.Helper()
	var code []snippet
	for _, path := range docFiles(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		file, _ := filepath.Rel(root(t), path)
		inBlock, cont := false, ""
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), fenceStart) {
				inBlock = !inBlock
				continue
			}
			if inBlock { // a line ending in \ goes on in the next: one command
				if line = cont + strings.TrimSpace(line); strings.HasSuffix(line, "\\") {
					cont = strings.TrimSuffix(line, "\\")
					continue
				}
				code, cont = append(code, snippet{file, line}), ""
				continue
			}
			for _, m := range codeSpanRE.FindAllStringSubmatch(line, -1) {
				code = append(code, snippet{file, strings.TrimSpace(m[1])})
			}
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

// helps builds each program once per test binary and returns its help texts, joined.
var helps = sync.OnceValues(func() (map[string]string, error) {
	dir, err := os.MkdirTemp("", "shipped-help")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir + "/"}
	for _, p := range programs {
		args = append(args, p.pkg)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	texts := map[string]string{}
	for name, p := range programs {
		for _, h := range p.help {
			out, _ := exec.Command(filepath.Join(dir, name), h...).CombinedOutput() // -h exits 0 or 2
			texts[name] += string(out)
		}
	}
	return texts, nil
})

// flagSets reads each program's flags from its help.
func flagSets(t *testing.T) map[string]map[string]bool {
	t.Helper()
	texts, err := helps()
	if err != nil {
		t.Fatal(err)
	}
	sets := map[string]map[string]bool{}
	for name, out := range texts {
		set := map[string]bool{}
		for _, m := range helpFlagRE.FindAllStringSubmatch(out, -1) {
			set["--"+m[1]] = true
		}
		for _, m := range flagRE.FindAllStringSubmatch(out, -1) {
			set["--"+m[1]] = true
		}
		if len(set) == 0 {
			t.Fatalf("%s: no flags in its help", name)
		}
		sets[name] = set
	}
	return sets
}

// Every flag the README and docs/ name exists: in the named program's flag set when the code names the
// program first (`coordinator --kubeconfig PATH`, bin/fencectl ... in a block), else in some
// program's or in foreignFlags.
func TestReadmeFlagsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	sets := flagSets(t)
	for _, sn := range readme(t) {
		prog := "" // the program the words so far call: one of ours, a foreign one, or none
		for _, word := range strings.Fields(sn.code) {
			if p := programOf(word); sets[p] != nil || foreignPrograms[p] {
				prog = p
				continue
			}
			for _, m := range flagRE.FindAllStringSubmatch(word, -1) {
				if msg := checkFlag(sets, prog, "--"+m[1], m[2] == "*" || strings.HasSuffix(m[1], "-")); msg != "" {
					t.Errorf("%s: %q names %s, %s", sn.file, sn.code, "--"+m[1], msg)
				}
			}
		}
	}
}

// programOf returns the program a word names when it is a command: `bin/fencectl` and
// `(systemctl` and `etcd,` are fencectl, systemctl and etcd.
func programOf(word string) string {
	word = strings.TrimRight(strings.TrimLeft(word, "($"), ",;:)")
	if m := programWord.FindStringSubmatch(word); m != nil && len(m[0]) == len(word) {
		return m[1]
	}
	return ""
}

// checkFlag says what is wrong with a flag named after prog ("" when nothing is).
func checkFlag(sets map[string]map[string]bool, prog, flag string, family bool) string {
	switch {
	case foreignPrograms[prog]:
		return ""
	case prog != "":
		if !has(sets[prog], flag, family) {
			return "which " + prog + " does not have"
		}
		return ""
	}
	for name := range foreignFlags {
		if flag == name || strings.HasSuffix(name, "-") && strings.HasPrefix(flag, name) {
			return ""
		}
	}
	for _, set := range sets {
		if has(set, flag, family) {
			return ""
		}
	}
	return "which no program has"
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

// Every `make X` the README and docs/ name is a Makefile target.
func TestReadmeMakeTargetsExist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeRuleRE.FindAllStringSubmatch(string(b), -1) {
		targets[m[1]] = true
	}
	var named []snippet
	for _, sn := range readme(t) {
		if m := makeSpanRE.FindStringSubmatch(sn.code); m != nil {
			named = append(named, snippet{sn.file, m[1]})
		}
	}
	if len(named) == 0 {
		t.Fatal("the README and docs/ name no make target: the extraction is broken")
	}
	for _, n := range named {
		if !targets[n.code] {
			t.Errorf("%s names `make %s`; the Makefile has no such target", n.file, n.code)
		}
	}
}
