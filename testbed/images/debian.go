package images

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Package is one installed Debian package.
type Package struct {
	Name, Version string
	// Depends are the names this package needs (Depends and Pre-Depends, each alternative resolved
	// to the first one installed, virtual names to an installed provider).
	Depends []string
	// Size is dpkg's Installed-Size in KiB.
	Size int
}

// Installed reads dpkg's database: every installed package by name.
func Installed() (map[string]*Package, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\t${Version}\t${Installed-Size}\t${Provides}\t${Pre-Depends}, ${Depends}\n").Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query: %w", err)
	}
	type raw struct {
		pkg  *Package
		deps string
	}
	var all []raw
	installed := map[string]*Package{}
	provider := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 6 || !strings.HasPrefix(f[1], "ii") {
			continue
		}
		p := &Package{Name: f[0], Version: f[2]}
		fmt.Sscan(f[3], &p.Size)
		installed[p.Name] = p
		for _, v := range splitDeps(f[4]) {
			if _, ok := provider[v[0]]; !ok {
				provider[v[0]] = p.Name
			}
		}
		all = append(all, raw{p, f[5]})
	}
	for _, r := range all {
		for _, alts := range splitDeps(r.deps) {
			for _, a := range alts {
				if _, ok := installed[a]; ok {
					r.pkg.Depends = append(r.pkg.Depends, a)
					break
				}
				if p, ok := provider[a]; ok {
					r.pkg.Depends = append(r.pkg.Depends, p)
					break
				}
			}
		}
	}
	return installed, nil
}

// splitDeps parses "a (>= 1) | b:any, c" into [[a b] [c]].
func splitDeps(s string) [][]string {
	var out [][]string
	for _, group := range strings.Split(s, ",") {
		var alts []string
		for _, a := range strings.Split(group, "|") {
			a = strings.TrimSpace(a)
			if i := strings.IndexAny(a, " ("); i >= 0 {
				a = a[:i]
			}
			a, _, _ = strings.Cut(a, ":")
			if a != "" {
				alts = append(alts, a)
			}
		}
		if len(alts) > 0 {
			out = append(out, alts)
		}
	}
	return out
}

// Closure returns roots and everything they depend on, skipping the excluded names (and what only
// they pulled in), sorted. A root that is not installed is an error.
func Closure(installed map[string]*Package, roots []string, exclude map[string]string) ([]*Package, error) {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		if seen[n] || exclude[n] != "" || installed[n] == nil {
			return
		}
		seen[n] = true
		for _, d := range installed[n].Depends {
			walk(d)
		}
	}
	for _, r := range roots {
		if installed[r] == nil {
			return nil, fmt.Errorf("the Debian package %s is not installed (make deps installs it)", r)
		}
		walk(r)
	}
	var out []*Package
	for n := range seen {
		out = append(out, installed[n])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// PackageLayer copies the files of pkgs as installed on this machine into a layer. Paths through
// the merged-/usr symlinks (/bin, /lib, ...) are stored at their real place and the symlinks
// themselves are recreated, as on the host.
func PackageLayer(name string, pkgs []*Package) (Layer, error) {
	l := Layer{Name: name}
	seen := map[string]bool{}
	add := func(e Entry) {
		if !seen[e.Path] {
			seen[e.Path] = true
			l.Entries = append(l.Entries, e)
		}
	}
	for _, top := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		if target, err := os.Readlink(top); err == nil {
			add(Entry{Path: top, Link: target, Mode: 0o777})
		}
	}
	for _, p := range pkgs {
		paths, err := packageFiles(p.Name)
		if err != nil {
			return Layer{}, err
		}
		for _, f := range paths {
			dir, err := filepath.EvalSymlinks(filepath.Dir(f))
			if err != nil {
				continue // a directory the package lists but this machine lacks
			}
			real := filepath.Join(dir, filepath.Base(f))
			fi, err := os.Lstat(real)
			if err != nil {
				continue // a conffile removed by the admin, a diverted file
			}
			// Permission bits only: setuid and setgid are dropped in an image that runs unprivileged.
			e := Entry{Path: real, Mode: int64(fi.Mode().Perm())}
			switch {
			case fi.IsDir():
				e.Dir = true
			case fi.Mode()&os.ModeSymlink != 0:
				if e.Link, err = os.Readlink(real); err != nil {
					return Layer{}, err
				}
				e.Mode = 0o777
			case fi.Mode().IsRegular():
				e.Source = real
			default:
				continue
			}
			add(e)
		}
	}
	alternatives(seen, add)
	return l, nil
}

// alternatives adds the update-alternatives links (/usr/bin/telnet -> /etc/alternatives/telnet
// -> /usr/bin/inetutils-telnet) whose chosen target the layer holds: dpkg's file lists do not
// name them.
func alternatives(seen map[string]bool, add func(Entry)) {
	const db = "/var/lib/dpkg/alternatives"
	entries, err := os.ReadDir(db)
	if err != nil {
		return
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(db, e.Name()))
		if err != nil {
			continue
		}
		lines := strings.Split(string(b), "\n")
		if len(lines) < 2 {
			continue
		}
		// Line 2 is the master link; then slave name and slave link in pairs, up to a blank line.
		links := map[string]string{e.Name(): lines[1]}
		for i := 2; i+1 < len(lines) && lines[i] != ""; i += 2 {
			links[lines[i]] = lines[i+1]
		}
		for name, link := range links {
			alt := "/etc/alternatives/" + name
			target, err := os.Readlink(alt)
			if err != nil || !seen[target] {
				continue
			}
			add(Entry{Path: alt, Link: target, Mode: 0o777})
			if dir, err := filepath.EvalSymlinks(filepath.Dir(link)); err == nil {
				add(Entry{Path: filepath.Join(dir, filepath.Base(link)), Link: alt, Mode: 0o777})
			}
		}
	}
}

// packageFiles lists a package's paths from dpkg's database.
func packageFiles(pkg string) ([]string, error) {
	var f *os.File
	var err error
	for _, n := range []string{pkg + ".list", pkg + ":amd64.list"} {
		if f, err = os.Open(filepath.Join("/var/lib/dpkg/info", n)); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("files of Debian package %s: %w", pkg, err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p := sc.Text(); p != "/." && p != "" {
			out = append(out, p)
		}
	}
	return out, sc.Err()
}
