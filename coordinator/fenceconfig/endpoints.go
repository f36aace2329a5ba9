package fenceconfig

import (
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/nodefence/nodefence/services/fault"
)

// MaxEndpoints bounds the addresses of one driver service: three driver hosts is the advice, and
// every address is one more connection the coordinator keeps.
const MaxEndpoints = 8

// Addresses returns every address of the driver service in the order they are tried: Endpoint,
// then Endpoints.
func (d Driver) Addresses() []string {
	var out []string
	if d.Endpoint != "" {
		out = append(out, d.Endpoint)
	}
	return append(out, d.Endpoints...)
}

// validateEndpoints checks that the driver has at least one address, each host:port, none twice,
// at most MaxEndpoints. f is the driver's field ("drivers.ipmi").
func (d Driver) validateEndpoints(v *fault.Invalid, f string) {
	all := d.Addresses()
	switch {
	case len(all) == 0:
		v.Add(f+".endpoint", "required: the driver service's host:port (or endpoints: a list of them, one per driver host)")
		return
	case len(all) > MaxEndpoints:
		v.Add(f+".endpoints", "%d addresses, at most %d", len(all), MaxEndpoints)
		return
	}
	if d.Endpoint != "" {
		if _, _, err := net.SplitHostPort(d.Endpoint); err != nil {
			v.Add(f+".endpoint", "%q is not host:port", d.Endpoint)
		}
	}
	seen := map[string]string{}
	if d.Endpoint != "" {
		seen[d.Endpoint] = f + ".endpoint"
	}
	for i, e := range d.Endpoints {
		ef := f + ".endpoints[" + strconv.Itoa(i) + "]"
		if _, _, err := net.SplitHostPort(e); err != nil {
			v.Add(ef, "%q is not host:port", e)
			continue
		}
		if prev, dup := seen[e]; dup {
			v.Add(ef, "%s is also %s", e, prev)
			continue
		}
		seen[e] = ef
	}
}

// SecretFiles says what validation does with secret file references (parameters "<name>_file").
type SecretFiles int

const (
	// SecretFilesExist requires each file to exist, without reading it: the coordinator at start
	// and on reload (the content is read when a driver is called).
	SecretFilesExist SecretFiles = iota
	// SecretFilesSkip leaves the files alone: an offline check on a host that does not hold them
	// (fencectl config check without --check-secrets).
	SecretFilesSkip
	// SecretFilesRead reads each file and requires a value in it; the value is never shown
	// (fencectl config check --check-secrets).
	SecretFilesRead
)

// Checks are the optional parts of validation.
type Checks struct {
	// SecretFiles is what is done with secret file references; the zero value requires them to exist.
	SecretFiles SecretFiles
}

// maxSecretFile bounds a secret file read by a check: a password or key, not a disk image.
const maxSecretFile = 64 << 10

// checkSecretFile applies mode to the secret file at path, named f in problems. A problem never
// holds the file's content.
func checkSecretFile(v *fault.Invalid, f, path string, mode SecretFiles) {
	switch mode {
	case SecretFilesSkip:
		return
	case SecretFilesExist:
		if _, err := os.Stat(path); err != nil {
			v.Add(f, "secret file: %v", err)
		}
		return
	}
	fh, err := os.Open(path)
	if err != nil {
		v.Add(f, "secret file: %v", err)
		return
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxSecretFile+1))
	switch {
	case err != nil:
		v.Add(f, "secret file: %v", err)
	case len(data) > maxSecretFile:
		v.Add(f, "secret file %s: larger than %d bytes", path, maxSecretFile)
	case strings.TrimSpace(string(data)) == "":
		v.Add(f, "secret file %s: empty", path)
	}
}
