// Package images builds nodefence's container images without a container engine or a registry:
// every layer is a tar made here (binaries from `go build`, a minimal root filesystem, and for the
// fence-driver the files of the Debian fence-agents package and its dependencies as installed on
// this machine), assembled with go-containerregistry and written as OCI image-layout tarballs that
// `ctr images import` and `docker load`-compatible tools accept.
//
// Images are reproducible: every file time, the image's creation time and its history are one fixed
// instant (SOURCE_DATE_EPOCH, by default the last commit's time), owners are numeric, entries are
// sorted and gzip writes no name or time, so the same inputs give the same digest.
package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the uid and gid images run as unless a manifest says otherwise (distroless's
// "nonroot", so existing securityContexts with runAsUser 65532 fit).
const NonRoot = 65532

// Entry is one file, directory or symlink of a layer, at an absolute path inside the image.
type Entry struct {
	// Path is absolute, e.g. /usr/local/bin/coordinator.
	Path string
	// Mode holds the permission bits (and setuid/setgid/sticky); the type comes from the fields below.
	Mode int64
	// Dir makes a directory; Link (non-empty) a symlink to Link; otherwise a regular file.
	Dir  bool
	Link string
	// Data is the file's content, or Source names a file on this machine to copy.
	Data   []byte
	Source string
	// UID and GID own the entry (numeric only: no names, so the result does not depend on /etc/passwd).
	UID, GID int
}

// Layer is a named set of entries; the name goes into the image's history.
type Layer struct {
	Name    string
	Entries []Entry
}

// Spec describes one image.
type Spec struct {
	// Name is the repository, e.g. nodefence/coordinator; Version the tag.
	Name, Version string
	// Entrypoint is the program and its fixed arguments.
	Entrypoint []string
	// User is "uid:gid".
	User string
	// Env entries are KEY=value.
	Env []string
	// Labels are OCI annotations of the image config (org.opencontainers.image.*).
	Labels map[string]string
	// Layers, bottom first.
	Layers []Layer
	// Created is the fixed time of the image, its history and every file.
	Created time.Time
	// GzipLevel is the compression level (gzip.BestSpeed .. gzip.BestCompression; 0 = default).
	GzipLevel int
}

// Ref is the image's name:tag.
func (s Spec) Ref() string { return s.Name + ":" + s.Version }

// Build assembles the image.
func Build(s Spec) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	level := s.GzipLevel
	if level == 0 {
		level = gzip.DefaultCompression
	}
	var adds []mutate.Addendum
	for _, l := range s.Layers {
		data, err := tarLayer(l.Entries, s.Created)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithCompressionLevel(level), tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.Name, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: "nodefence images: " + l.Name, Comment: l.Name},
		})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: s.Created}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.User = s.User
	cf.Config.Env = s.Env
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = s.Labels
	return mutate.ConfigFile(img, cf)
}

// tarLayer writes entries as a tar, sorted by path, every parent directory present, every time
// fixed at created.
func tarLayer(entries []Entry, created time.Time) ([]byte, error) {
	byPath := map[string]Entry{}
	for _, e := range entries {
		p := path.Clean(e.Path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("%q: want an absolute path below /", e.Path)
		}
		e.Path = p
		if prev, dup := byPath[p]; dup && !(prev.Dir && e.Dir) {
			return nil, fmt.Errorf("%s: given twice", p)
		}
		byPath[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = Entry{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		h := &tar.Header{
			Name: strings.TrimPrefix(p, "/"), Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			ModTime: created, Format: tar.FormatPAX,
		}
		var body []byte
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		default:
			h.Typeflag = tar.TypeReg
			body = e.Data
			if e.Source != "" {
				b, err := os.ReadFile(e.Source)
				if err != nil {
					return nil, err
				}
				body = b
			}
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if _, err := tw.Write(body); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BaseLayer is the minimal root filesystem every image starts from: users root and nonroot
// (65532), /tmp, name-service and CA files.
func BaseLayer() Layer {
	es := []Entry{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/root", Dir: true, Mode: 0o700},
		{Path: "/home/nonroot", Dir: true, Mode: 0o755, UID: NonRoot, GID: NonRoot},
	}
	// Redfish over TLS and the AWS API need the public CAs; take this machine's bundle when there.
	if _, err := os.Stat("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		es = append(es, Entry{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Source: "/etc/ssl/certs/ca-certificates.crt"})
	}
	return Layer{Name: "base", Entries: es}
}

// BinaryLayer puts the executable file src at /usr/local/bin/name.
func BinaryLayer(name, src string) Layer {
	return Layer{Name: name, Entries: []Entry{{Path: "/usr/local/bin/" + name, Mode: 0o755, Source: src}}}
}
