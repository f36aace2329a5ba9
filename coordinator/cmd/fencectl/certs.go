package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
)

const certsHelp = `Issues a CA (unless --ca-cert/--ca-key name an existing one, or DIR already holds one) and, for each ROLE/NAME, a certificate
whose URI SAN is spiffe://nodefence/ROLE/NAME, usable as client and server, into DIR as
ROLE-NAME.crt and ROLE-NAME.key (0600). Roles: agent (NAME = the node), operator, viewer,
coordinator, driver, monitoring (a Prometheus scraping --metrics-tls). --hosts are the DNS names and IP addresses servers answer to.
Example: fencectl certs --dir pki --hosts 127.0.0.1,localhost coordinator/c1 driver/ipmi agent/worker-1 operator/alice

An existing DIR/ca.crt is never replaced silently: with its key beside it, certs signs with it (renewal);
without, it refuses. --new-ca issues a new CA: the old one is kept as DIR/ca-previous.crt/.key and
DIR/ca-bundle.crt holds both, the bundle every component trusts during a rollover (deploy/README.md, Renewal).

With --etcd it issues from etcd's own CA instead (DIR/etcd-ca.crt, etcd-ca.key unless --ca-cert/--ca-key
name it), which must never be the nodefence CA: etcd then admits no agent, operator, viewer, driver
or monitoring certificate. Only two kinds: member/NAME (an etcd member's server and peer certificate,
for --hosts) into etcd-member-NAME.crt, and coordinator/NAME (the coordinators' etcd client
certificate, common name NAME) into etcd-coordinator-NAME.crt.
Example: fencectl certs --etcd --dir pki --hosts '*.nodefence-etcd.nodefence.svc' member/nodefence-etcd coordinator/nodefence-coordinator
`

// certsSetup binds the flags of certs, which issues a CA and per-component certificates (offline).
func certsSetup(fs *flag.FlagSet) runFunc {
	dir := fs.String("dir", "", "output directory (required)")
	caCert := fs.String("ca-cert", "", "existing CA certificate (default: issue a new CA into DIR/ca.crt)")
	caKey := fs.String("ca-key", "", "existing CA private key")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated DNS names and IPs of the servers")
	validity := fs.Duration("validity", 365*24*time.Hour, "certificate lifetime")
	etcd := fs.Bool("etcd", false, "issue etcd's certificates (member/NAME, coordinator/NAME) from etcd's own CA")
	newCA := fs.Bool("new-ca", false, "issue a new CA even though DIR holds one (a CA rollover: the old one is kept as DIR/ca-previous.*, DIR/ca-bundle.crt holds both)")
	return func(_ context.Context, c *ctl, args []string) error {
		o := certsOptions{dir: *dir, caCert: *caCert, caKey: *caKey, hosts: *hosts, validity: *validity, etcd: *etcd, newCA: *newCA}
		return codeErr(issueCerts(o, args, c.out, c.err))
	}
}

// certsOptions are the flags of certs.
type certsOptions struct {
	dir, caCert, caKey, hosts string
	validity                  time.Duration
	etcd, newCA               bool
}

// The common names of the CAs fencectl certs creates (cert-manager's manifests in deploy/cert-manager
// use the same), by which it tells one from the other.
const (
	nodefenceCAName = "nodefence CA"
	etcdCAName      = "nodefence etcd CA"
)

// certJob is one certificate to issue: the file base name, the common name, the URI SANs (the
// nodefence identity; none for etcd's), the hosts, and the kind and description printed.
type certJob struct {
	base, commonName, kind, desc string
	uris                         []*url.URL
	hosts                        []string
}

// issueCerts issues the certificates of the identities in args; it returns the exit code.
func issueCerts(o certsOptions, args []string, stdout, stderr io.Writer) int {
	var problems []string
	if o.dir == "" {
		problems = append(problems, "--dir: required")
	}
	if (o.caCert == "") != (o.caKey == "") {
		problems = append(problems, "--ca-cert, --ca-key: go together")
	}
	if o.newCA && o.caCert != "" {
		problems = append(problems, "--new-ca: not with --ca-cert (either issue a new CA or sign with the one named)")
	}
	if o.validity <= 0 {
		problems = append(problems, "--validity: must be positive")
	}
	var hostList []string
	for _, h := range strings.Split(o.hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hostList = append(hostList, h)
		}
	}
	jobs, bad := certJobs(o.etcd, args, hostList)
	if problems = append(problems, bad...); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "fencectl certs:", p)
		}
		return 2
	}
	ca, err := certsCA(o, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "fencectl certs:", err)
		return 1
	}
	for _, j := range jobs {
		pair, err := ca.IssueURIs(j.commonName, j.uris, j.hosts, o.validity)
		if err == nil {
			var c string
			if c, _, err = pair.Write(o.dir, j.base); err == nil {
				fmt.Fprintf(stdout, "%-9s %s  %s\n", j.kind, filepath.Clean(c), j.desc)
			}
		}
		if err != nil {
			fmt.Fprintln(stderr, "fencectl certs:", err)
			return 1
		}
	}
	return 0
}

// certJobs turns the arguments into certificates to issue, or problems naming each bad argument.
func certJobs(etcd bool, args, hosts []string) ([]certJob, []string) {
	var jobs []certJob
	var problems []string
	for _, a := range args {
		if !etcd {
			id, err := identity.Parse("spiffe://" + identity.TrustDomain + "/" + a)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: want ROLE/NAME: %v", a, err))
				continue
			}
			u, err := url.Parse(id.String())
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", a, err))
				continue
			}
			jobs = append(jobs, certJob{base: string(id.Role) + "-" + id.Name, commonName: string(id.Role) + "/" + id.Name,
				kind: string(id.Role), desc: id.String(), uris: []*url.URL{u}, hosts: hosts})
			continue
		}
		kind, name, _ := strings.Cut(a, "/")
		if err := identity.ValidName(name); err != nil {
			problems = append(problems, fmt.Sprintf("%s: want member/NAME or coordinator/NAME: name: %v", a, err))
			continue
		}
		switch kind {
		case "member":
			jobs = append(jobs, certJob{base: "etcd-member-" + name, commonName: name, kind: "etcd", desc: "member " + name, hosts: hosts})
		case "coordinator":
			jobs = append(jobs, certJob{base: "etcd-coordinator-" + name, commonName: name, kind: "etcd", desc: "the coordinators' client, common name " + name})
		default:
			problems = append(problems, fmt.Sprintf("%s: with --etcd only member/NAME and coordinator/NAME: etcd must refuse every other role", a))
		}
	}
	return jobs, problems
}

// certsCA loads --ca-cert/--ca-key or issues a new CA into the directory. A loaded CA must be of
// the right kind: the nodefence CA signs agents' certificates, so it never signs etcd's, and etcd's
// CA never signs a nodefence identity (etcd would admit it).
func certsCA(o certsOptions, stdout io.Writer) (*certs.CA, error) {
	name, base := nodefenceCAName, "ca"
	if o.etcd {
		name, base = etcdCAName, "etcd-ca"
	}
	if o.caCert == "" {
		return dirCA(o, name, base, stdout)
	}
	ca, err := certs.LoadCA(o.caCert, o.caKey)
	if err != nil {
		return nil, err
	}
	switch cn := ca.Cert.Subject.CommonName; {
	case o.etcd && cn == nodefenceCAName:
		return nil, fmt.Errorf("--ca-cert %s: this is the nodefence CA, which signs every agent's certificate; etcd needs a CA of its own (leave --ca-cert out to issue one, DIR/etcd-ca.crt)", o.caCert)
	case !o.etcd && cn == etcdCAName:
		return nil, fmt.Errorf("--ca-cert %s: this is etcd's CA; a nodefence identity it signs would be admitted by etcd (use the nodefence CA, DIR/ca.crt)", o.caCert)
	}
	return ca, nil
}

// dirCA is the CA of DIR when no --ca-cert names one: the existing DIR/base.crt with its key
// (never replaced silently: every component trusts it), or a new one when there is none or
// --new-ca asks for it. A new CA replacing an old one keeps the old as base-previous.crt/.key and
// writes base-bundle.crt with both, for the rollover.
func dirCA(o certsOptions, name, base string, stdout io.Writer) (*certs.CA, error) {
	crt, key := filepath.Join(o.dir, base+".crt"), filepath.Join(o.dir, base+".key")
	_, crtErr := os.Stat(crt)
	_, keyErr := os.Stat(key)
	exists := crtErr == nil || keyErr == nil
	switch {
	case exists && !o.newCA && (crtErr != nil || keyErr != nil):
		return nil, fmt.Errorf("%s: the CA's certificate or key is missing, and certs never replaces a CA silently (every component trusts it): "+
			"name it with --ca-cert/--ca-key, or pass --new-ca to issue a new CA (a rollover: deploy/README.md, Renewal)", filepath.Join(o.dir, base+".{crt,key}"))
	case exists && !o.newCA:
		ca, err := certs.LoadCA(crt, key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (certs never replaces a CA silently: pass --new-ca to issue a new one)", crt, err)
		}
		if ca.Cert.Subject.CommonName != name {
			return nil, fmt.Errorf("%s: its common name is %q, not %q; name the CA to sign with by --ca-cert/--ca-key", crt, ca.Cert.Subject.CommonName, name)
		}
		fmt.Fprintf(stdout, "CA        %s (existing, expires %s)\n", crt, ca.Cert.NotAfter.UTC().Format(time.DateOnly))
		return ca, nil
	}
	var old []byte
	if exists {
		var err error
		if old, err = os.ReadFile(crt); err != nil {
			return nil, err
		}
		for _, ext := range []string{".crt", ".key"} {
			if err := os.Rename(filepath.Join(o.dir, base+ext), filepath.Join(o.dir, base+"-previous"+ext)); err != nil {
				return nil, fmt.Errorf("keep the old CA: %w", err)
			}
		}
	}
	ca, err := certs.NewCA(name, o.validity)
	if err != nil {
		return nil, err
	}
	c, _, err := certs.Pair{CertPEM: ca.CertPEM, KeyPEM: ca.KeyPEM()}.Write(o.dir, base)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "CA        %s (and %s.key: keep it offline)\n", c, base)
	if old != nil {
		bundle := filepath.Join(o.dir, base+"-bundle.crt")
		if err := os.WriteFile(bundle, append(append(append([]byte{}, ca.CertPEM...), '\n'), old...), 0o644); err != nil {
			return nil, err
		}
		fmt.Fprintf(stdout, "CA        %s: the new and the previous CA (%s-previous.crt); every component trusts it before any certificate of the new CA is used\n", bundle, base)
	}
	return ca, nil
}
