// Package identity names nodefence's callers and what each may call. A caller is identified by
// its X.509 client certificate, by exactly one SPIFFE-style URI SAN:
//
//	spiffe://nodefence/agent/<node>           a node-agent, speaking only for <node>
//	spiffe://nodefence/operator/<name>        a person: fence, unfence, acknowledge, pause, read
//	spiffe://nodefence/viewer/<name>          a person or tool that only reads
//	spiffe://nodefence/coordinator/<id>       a coordinator replica: the only caller of drivers
//	spiffe://nodefence/driver/<name>          a fence-driver service (serves; calls nothing)
//	spiffe://nodefence/monitoring/<name>      a metrics scraper (Prometheus): reads /metrics only
//
// Who did something is always the certificate's identity, never a field of a request. Parsing is
// strict (one scheme, one trust domain, one role, one name of the Kubernetes object-name alphabet)
// and every part is length-capped, so nothing an attacker writes into a certificate reaches a
// log line or an audit entry unchecked.
package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// TrustDomain is the SPIFFE trust domain of every nodefence identity.
const TrustDomain = "nodefence"

// MaxName is the longest name an identity may carry (a Kubernetes node name's DNS-subdomain cap).
const MaxName = 253

// maxURI bounds the URI text examined at all.
const maxURI = len("spiffe://"+TrustDomain+"/coordinator/") + MaxName

// Role is what a caller is.
type Role string

// The roles. Any is not in any certificate: it is the identity a plaintext server grants every
// caller only when told to (tests and demos).
const (
	Agent       Role = "agent"
	Operator    Role = "operator"
	Viewer      Role = "viewer"
	Coordinator Role = "coordinator"
	Driver      Role = "driver"
	Monitoring  Role = "monitoring"
	Any         Role = "any"
)

// Roles are the roles a certificate may carry.
var Roles = []Role{Agent, Operator, Viewer, Coordinator, Driver, Monitoring}

// Identity is one caller.
type Identity struct {
	// Role is what the caller is.
	Role Role
	// Name is the node of an agent, the person of an operator or viewer, the replica of a
	// coordinator, the driver of a driver.
	Name string
}

// String is the identity's URI, or "any (plaintext, trusted by flag)" for Any.
func (id Identity) String() string {
	if id.Role == Any {
		return "any (plaintext, trusted by --unauthenticated-caller)"
	}
	return "spiffe://" + TrustDomain + "/" + string(id.Role) + "/" + id.Name
}

// ErrNoIdentity is returned when a caller presented no usable identity.
var ErrNoIdentity = errors.New("no caller identity")

// Parse reads one identity URI strictly.
func Parse(uri string) (Identity, error) {
	if len(uri) > maxURI {
		return Identity{}, fmt.Errorf("identity URI is %d bytes, more than %d", len(uri), maxURI)
	}
	rest, ok := strings.CutPrefix(uri, "spiffe://"+TrustDomain+"/")
	if !ok {
		return Identity{}, fmt.Errorf("identity URI %q is not spiffe://%s/<role>/<name>", clip(uri), TrustDomain)
	}
	role, name, ok := strings.Cut(rest, "/")
	if !ok {
		return Identity{}, fmt.Errorf("identity URI %q has no name", clip(uri))
	}
	id := Identity{Role: Role(role), Name: name}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("identity URI %q: %w", clip(uri), err)
	}
	return id, nil
}

// Validate checks the role and the name.
func (id Identity) Validate() error {
	known := false
	for _, r := range Roles {
		known = known || r == id.Role
	}
	if !known {
		return fmt.Errorf("unknown role %q (want agent, operator, viewer, coordinator, driver or monitoring)", clip(string(id.Role)))
	}
	if err := ValidName(id.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	return nil
}

// ValidName checks a name by the rules of a Kubernetes object name (RFC 1123 subdomain): 1-253
// characters of lower-case letters, digits, '-' and '.', starting and ending with a letter or digit.
// Node names, zone names and identity names all follow it.
func ValidName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > MaxName:
		return fmt.Errorf("%d characters, more than %d", len(s), MaxName)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && c != '-' && c != '.' {
			return fmt.Errorf("%q: only lower-case letters, digits, '-' and '.' are allowed", clip(s))
		}
		if !alnum && (i == 0 || i == len(s)-1) {
			return fmt.Errorf("%q: must start and end with a letter or digit", clip(s))
		}
	}
	return nil
}

// FromCert reads the identity of a certificate: exactly one nodefence URI SAN, written exactly as
// Parse accepts it. A URI SAN that claims the nodefence trust domain in another spelling
// ("SPIFFE://nodefence/...", "spiffe://NodeFence/...", an escaped host, a port, user information)
// makes the certificate unusable rather than being ignored; other trust domains are ignored.
func FromCert(c *x509.Certificate) (Identity, error) {
	uris, err := uriSANs(c)
	if err != nil {
		return Identity{}, err
	}
	var found []Identity
	for _, u := range uris {
		if !inTrustDomain(u) {
			continue
		}
		id, err := Parse(u)
		if err != nil {
			return Identity{}, err
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: the certificate has no spiffe://%s/ URI SAN", ErrNoIdentity, TrustDomain)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("the certificate has %d spiffe://%s/ URI SANs; one is allowed", len(found), TrustDomain)
}

type ctxKey struct{}

// With returns ctx carrying id; the server's authorization interceptor puts the caller's there.
func With(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// From returns the identity the server authorized for this call.
func From(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// FromPeer reads the verified client certificate of the call's peer. It returns ErrNoIdentity
// when the connection carries no verified certificate (plaintext, or TLS without client CA).
func FromPeer(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no peer", ErrNoIdentity)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, fmt.Errorf("%w: the connection is not TLS", ErrNoIdentity)
	}
	return FromTLS(&ti.State)
}

// FromTLS reads the verified client certificate of a TLS connection (an HTTP request's r.TLS). It
// returns ErrNoIdentity when there is none (nil state, or no verified chain).
func FromTLS(state *tls.ConnectionState) (Identity, error) {
	if state == nil {
		return Identity{}, fmt.Errorf("%w: the connection is not TLS", ErrNoIdentity)
	}
	chains := state.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return Identity{}, fmt.Errorf("%w: no verified client certificate", ErrNoIdentity)
	}
	return FromCert(chains[0][0])
}

// Name is who the caller in ctx is, for records and logs: the identity's URI, or "unknown".
func Name(ctx context.Context) string {
	if id, ok := From(ctx); ok {
		return id.String()
	}
	return "unknown"
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
