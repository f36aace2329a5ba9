package images

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Binaries are the programs that get an image each, named nodefence/<binary>.
var Binaries = []string{"coordinator", "node-agent", "fence-driver", "fencectl"}

// EtcdVersion tags the nodefence/etcd image, built (when bin/linux-amd64/etcd exists) from the
// etcd server module testbed/kube/tools/etcd pins, for deploy/etcd.yaml.
const EtcdVersion = "v3.6.16"

// AgentPackages are the Debian packages whose files the fence-driver image carries for
// `--driver agent`: the ClusterLabs fence agents (Python), the programs they run (ipmitool,
// net-snmp's tools, ssh and telnet for switches and PDUs) and a shell.
var AgentPackages = []string{"fence-agents", "ipmitool", "snmp", "openssh-client", "telnet", "dash"}

// AgentExcluded are dependencies left out of the fence-driver image, with the reason (it goes into
// the image's labels, so `ctr image inspect` shows what is missing).
var AgentExcluded = map[string]string{
	"python3-boto3":      "fence_aws: use --driver aws",
	"python3-botocore":   "fence_aws: use --driver aws",
	"python3-s3transfer": "fence_aws: use --driver aws",
	"dpkg":               "package management",
	"debconf":            "package management",
}

// Options select what Specs builds.
type Options struct {
	// Version tags every image; Revision (a commit) goes into its labels.
	Version, Revision string
	// BinDir holds the binaries, built statically (CGO_ENABLED=0) for linux/amd64.
	BinDir string
	// Created is the fixed time of every image and file.
	Created time.Time
	// GzipLevel: see Spec.
	GzipLevel int
}

// Specs returns the image of each binary. The fence-driver's carries the fence agents as a layer
// of its own below the binary, so a new build of the binary ships only its own layer.
func Specs(o Options) ([]Spec, error) {
	var out []Spec
	for _, b := range Binaries {
		src := filepath.Join(o.BinDir, b)
		if _, err := os.Stat(src); err != nil {
			return nil, fmt.Errorf("binary %s: %w (make images builds it)", b, err)
		}
		s := Spec{
			Name: "nodefence/" + b, Version: o.Version,
			Entrypoint: []string{"/usr/local/bin/" + b},
			User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
			Env:        []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Labels: map[string]string{
				"org.opencontainers.image.title":    "nodefence " + b,
				"org.opencontainers.image.version":  o.Version,
				"org.opencontainers.image.revision": o.Revision,
				"org.opencontainers.image.created":  o.Created.UTC().Format(time.RFC3339),
			},
			Layers:    []Layer{BaseLayer()},
			Created:   o.Created,
			GzipLevel: o.GzipLevel,
		}
		if b == "fence-driver" {
			l, pkgs, err := AgentLayer()
			if err != nil {
				return nil, err
			}
			s.Layers = append(s.Layers, l)
			var names []string
			for _, p := range pkgs {
				names = append(names, p.Name+"="+p.Version)
			}
			s.Labels["io.nodefence.fence-agents.packages"] = strings.Join(names, " ")
			var ex []string
			for n, why := range AgentExcluded {
				ex = append(ex, n+" ("+why+")")
			}
			sort.Strings(ex)
			s.Labels["io.nodefence.fence-agents.excluded"] = strings.Join(ex, "; ")
			// The driver keeps its epochs here when no volume is mounted.
			s.Layers = append(s.Layers, Layer{Name: "state", Entries: []Entry{
				{Path: "/var/lib/nodefence-driver", Dir: true, Mode: 0o700, UID: NonRoot, GID: NonRoot},
			}})
		}
		s.Layers = append(s.Layers, BinaryLayer(b, src))
		out = append(out, s)
	}
	if src := filepath.Join(o.BinDir, "etcd"); fileExists(src) {
		out = append(out, Spec{
			Name: "nodefence/etcd", Version: EtcdVersion,
			Entrypoint: []string{"/usr/local/bin/etcd"},
			User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
			Labels: map[string]string{
				"org.opencontainers.image.title":   "etcd for nodefence",
				"org.opencontainers.image.version": EtcdVersion,
				"org.opencontainers.image.created": o.Created.UTC().Format(time.RFC3339),
			},
			Layers: []Layer{BaseLayer(), {Name: "data", Entries: []Entry{
				{Path: "/var/lib/etcd", Dir: true, Mode: 0o700, UID: NonRoot, GID: NonRoot},
			}}, BinaryLayer("etcd", src)},
			Created:   o.Created,
			GzipLevel: o.GzipLevel,
		})
	}
	return out, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// AgentLayer is the fence agents and their dependencies, from this machine's Debian packages.
func AgentLayer() (Layer, []*Package, error) {
	installed, err := Installed()
	if err != nil {
		return Layer{}, nil, err
	}
	pkgs, err := Closure(installed, AgentPackages, AgentExcluded)
	if err != nil {
		return Layer{}, nil, err
	}
	l, err := PackageLayer("fence-agents", pkgs)
	return l, pkgs, err
}

// WriteOCI writes img as an OCI image-layout tarball at file, the index naming it ref (as
// org.opencontainers.image.ref.name) and its fully qualified form (containerd's
// io.containerd.image.name, see QualifiedRef), so `ctr images import` stores it under the name the
// kubelet asks containerd's CRI for. The tar is deterministic: sorted entries, fixed times,
// numeric owners.
func WriteOCI(img v1.Image, ref, file string, created time.Time) error {
	dir, err := os.MkdirTemp(filepath.Dir(file), ".oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref,
		"io.containerd.image.name":          QualifiedRef(ref),
	})); err != nil {
		return err
	}
	tmp := file + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := tarDir(f, dir, created); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// QualifiedRef is ref as containerd's CRI names it: the kubelet asks for an image named
// "nodefence/coordinator:v1" as "docker.io/nodefence/coordinator:v1" (a reference without a
// registry host is Docker Hub's; one without a path is in its "library"), so an image imported
// under the short name is "not present" to the kubelet. A ref that names a host (a first component
// with a dot or a port, or "localhost") is returned as it is.
func QualifiedRef(ref string) string {
	first, rest, found := strings.Cut(ref, "/")
	if !found {
		return "docker.io/library/" + ref
	}
	if strings.ContainsAny(first, ".:") || first == "localhost" {
		return ref
	}
	return "docker.io/" + first + "/" + rest
}

func tarDir(w io.Writer, root string, created time.Time) error {
	var files []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	tw := tar.NewWriter(w)
	for _, p := range files {
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: created, Mode: 0o644, Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
