package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/services/identity/certs"
)

const certsHelp = `Issues a CA (unless --ca-cert/--ca-key name an existing one) and, for each ROLE/NAME, a certificate
whose URI SAN is spiffe://nodefence/ROLE/NAME, usable as client and server, into DIR as
ROLE-NAME.crt and ROLE-NAME.key (0600). Roles: agent (NAME = the node), operator, viewer,
coordinator, driver, monitoring (a Prometheus scraping --metrics-tls). --hosts are the DNS names and IP addresses servers answer to.
Example: fencectl certs --dir pki --hosts 127.0.0.1,localhost coordinator/c1 driver/ipmi agent/worker-1 operator/alice
`

// certsSetup binds the flags of certs, which issues a CA and per-component certificates (offline).
func certsSetup(fs *flag.FlagSet) runFunc {
	dir := fs.String("dir", "", "output directory (required)")
	caCert := fs.String("ca-cert", "", "existing CA certificate (default: issue a new CA into DIR/ca.crt)")
	caKey := fs.String("ca-key", "", "existing CA private key")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated DNS names and IPs of the servers")
	validity := fs.Duration("validity", 365*24*time.Hour, "certificate lifetime")
	return func(_ context.Context, c *ctl, args []string) error {
		return codeErr(issueCerts(certsOptions{dir: *dir, caCert: *caCert, caKey: *caKey, hosts: *hosts, validity: *validity}, args, c.out, c.err))
	}
}

// certsOptions are the flags of certs.
type certsOptions struct {
	dir, caCert, caKey, hosts string
	validity                  time.Duration
}

// issueCerts issues the certificates of the identities in args; it returns the exit code.
func issueCerts(o certsOptions, args []string, stdout, stderr io.Writer) int {
	dir, caCert, caKey, hosts, validity := &o.dir, &o.caCert, &o.caKey, &o.hosts, &o.validity
	var problems []string
	if *dir == "" {
		problems = append(problems, "--dir: required")
	}
	if (*caCert == "") != (*caKey == "") {
		problems = append(problems, "--ca-cert, --ca-key: go together")
	}
	if *validity <= 0 {
		problems = append(problems, "--validity: must be positive")
	}
	var ids []identity.Identity
	for _, a := range args {
		id, err := identity.Parse("spiffe://" + identity.TrustDomain + "/" + a)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: want ROLE/NAME: %v", a, err))
			continue
		}
		ids = append(ids, id)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "fencectl certs:", p)
		}
		return 2
	}
	var ca *certs.CA
	var err error
	if *caCert != "" {
		ca, err = certs.LoadCA(*caCert, *caKey)
	} else {
		if ca, err = certs.NewCA("nodefence CA", *validity); err == nil {
			var c string
			if c, _, err = ca.WriteCA(*dir); err == nil {
				fmt.Fprintf(stdout, "CA        %s (and ca.key: keep it offline)\n", c)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencectl certs:", err)
		return 1
	}
	var hostList []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hostList = append(hostList, h)
		}
	}
	for _, id := range ids {
		pair, err := ca.Issue(id, hostList, *validity)
		if err == nil {
			var c string
			if c, _, err = pair.Write(*dir, string(id.Role)+"-"+id.Name); err == nil {
				fmt.Fprintf(stdout, "%-9s %s  %s\n", id.Role, filepath.Clean(c), id)
			}
		}
		if err != nil {
			fmt.Fprintln(stderr, "fencectl certs:", err)
			return 1
		}
	}
	return 0
}
