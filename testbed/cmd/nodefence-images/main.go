// Command nodefence-images writes one OCI image-layout tarball per nodefence binary, without a
// container engine and without pulling anything (see package testbed/images). `make images` runs it:
//
//	nodefence-images --bin bin/linux-amd64 --out bin/images --version v0.3.0
//
// Each line of output names an image, its manifest digest and its file; import one into
// containerd with `ctr -n k8s.io images import bin/images/nodefence-coordinator.oci.tar`.
package main

import (
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/testbed/images"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nodefence-images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "", "directory of the static linux/amd64 binaries (required)")
	out := fs.String("out", "", "directory for the OCI tarballs (required)")
	version := fs.String("version", "", "image tag (required)")
	revision := fs.String("revision", "", "source revision for the images' labels")
	epoch := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "fixed time of every image and file, in Unix seconds (default $SOURCE_DATE_EPOCH, else 0)")
	fast := fs.Bool("fast", false, "compress with gzip's fastest level (a different digest than the default level)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	var errs []string
	if *bin == "" {
		errs = append(errs, "--bin: required")
	}
	if *out == "" {
		errs = append(errs, "--out: required")
	}
	if *version == "" || strings.ContainsAny(*version, ":/@ ") {
		errs = append(errs, fmt.Sprintf("--version: required, a tag without ':', '/', '@' or spaces, got %q", *version))
	}
	var secs int64
	if *epoch != "" {
		var err error
		if secs, err = strconv.ParseInt(*epoch, 10, 64); err != nil || secs < 0 {
			errs = append(errs, fmt.Sprintf("--source-date-epoch: %q is not a non-negative number of seconds", *epoch))
		}
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Sprintf("unexpected arguments: %q", fs.Args()))
	}
	if len(errs) > 0 {
		fmt.Fprintln(stderr, "nodefence-images: "+strings.Join(errs, "\n  "))
		return 2
	}
	o := images.Options{Version: *version, Revision: *revision, BinDir: *bin, Created: time.Unix(secs, 0).UTC()}
	if *fast {
		o.GzipLevel = gzip.BestSpeed
	}
	if err := build(o, *out, stdout); err != nil {
		fmt.Fprintln(stderr, "nodefence-images:", err)
		return 1
	}
	return 0
}

func build(o images.Options, out string, stdout io.Writer) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	specs, err := images.Specs(o)
	if err != nil {
		return err
	}
	for _, s := range specs {
		img, err := images.Build(s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Ref(), err)
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		file := filepath.Join(out, strings.ReplaceAll(s.Name, "/", "-")+".oci.tar")
		if err := images.WriteOCI(img, s.Ref(), file, o.Created); err != nil {
			return fmt.Errorf("%s: %w", s.Ref(), err)
		}
		fi, err := os.Stat(file)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s %s %.1f MB\n", s.Ref(), d, file, float64(fi.Size())/1e6)
	}
	return nil
}
