package redfish

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/fault"
)

// client is a connected gofish client and the systems it resolved; one operation uses it at a time.
type client struct {
	api     *gofish.APIClient
	session bool              // logged in with a Redfish session, to be deleted on close
	systems map[string]string // systems_uri or plug -> system URI
}

// close deletes the Redfish session, if any, and closes the idle connections.
func (cl *client) close() {
	if cl.session {
		cl.api.Logout()
		return
	}
	cl.api.HTTPClient.CloseIdleConnections()
}

// key identifies a client's connection parameters, secrets included (hashed, in memory only).
func (c *config) key() string {
	return kit.SessionKey(c.endpoint, c.username, c.password, c.insecure, c.caFile, c.session)
}

// withClient parses t once and runs fn with an idle client for it or a newly connected one. The
// client is kept for reuse unless fn failed for another reason than a bad target (its session may
// have expired, its address changed).
func (d *Driver) withClient(ctx context.Context, t kit.Target, fn func(*config, *client) error) error {
	c, err := kit.ParsedAs(t, parse)
	if err != nil {
		return err
	}
	dial := func() (*client, error) { return connect(ctx, c) }
	return d.pool.Use(c.key(), dial, func(cl *client) error { return fn(c, cl) })
}

// connect connects a client (reading the service root).
func connect(ctx context.Context, c *config) (*client, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.insecure} //nolint:gosec // only with the explicit ssl_insecure=1
	if c.caFile != "" && !c.insecure {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fault.FieldError{Field: ParamSSLCAFile, Problem: fmt.Sprintf("cannot read: %v", err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fault.FieldError{Field: ParamSSLCAFile, Problem: "no PEM certificate in " + c.caFile}
		}
		tlsConf.RootCAs = pool
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConf,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}
	api, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint: c.endpoint, Username: c.username, Password: c.password, BasicAuth: !c.session,
		HTTPClient: hc, NoModifyTransport: true, ReuseConnections: true, MaxConcurrentRequests: 4,
	})
	if err != nil {
		return nil, classify(ctx, c, "connecting to the Redfish service", err)
	}
	return &client{api: api, session: c.session, systems: map[string]string{}}, nil
}

// withSystem resolves and reads the target's ComputerSystem and runs fn on it.
func (d *Driver) withSystem(ctx context.Context, t kit.Target, fn func(*config, *schemas.ComputerSystem) error) error {
	return d.withClient(ctx, t, func(c *config, cl *client) error {
		sys, err := read(ctx, c, cl)
		if err != nil {
			return err
		}
		return fn(c, sys)
	})
}

// read reads the target's ComputerSystem, discovering its URI on first use.
func read(ctx context.Context, c *config, cl *client) (*schemas.ComputerSystem, error) {
	api := cl.api.WithContext(ctx)
	which := c.systemsURI
	if which == "" {
		which = "plug=" + c.plug
	}
	uri := cl.systems[which]
	if uri == "" {
		if c.systemsURI != "" {
			uri = c.systemsURI
		} else {
			var err error
			if uri, err = discover(ctx, c, api); err != nil {
				return nil, err
			}
		}
	}
	sys, err := schemas.GetComputerSystem(api, uri)
	if err != nil {
		return nil, classify(ctx, c, "reading "+uri, err)
	}
	cl.systems[which] = uri
	return sys, nil
}

// discover finds the system from the Systems collection: the member whose Id is the plug, or
// the only member.
func discover(ctx context.Context, c *config, api *gofish.APIClient) (string, error) {
	systems, err := api.Service.Systems()
	if err != nil {
		return "", classify(ctx, c, "reading the Systems collection", err)
	}
	var ids []string
	for _, s := range systems {
		ids = append(ids, s.ID)
		if c.plug != "" && (s.ID == c.plug || s.ODataID == c.plug) {
			return s.ODataID, nil
		}
	}
	switch {
	case c.plug != "":
		return "", fault.FieldError{Field: kit.ParamPlug, Problem: fmt.Sprintf("the Redfish service at %s has no system %q (systems: %s)", c.hostport, c.plug, strings.Join(ids, ", "))}
	case len(systems) == 1:
		return systems[0].ODataID, nil
	case len(systems) == 0:
		return "", fmt.Errorf("%w: the Redfish service at %s lists no systems", fault.ErrDevice, c.hostport)
	}
	return "", fault.FieldError{Field: ParamSystemsURI, Problem: fmt.Sprintf("the Redfish service at %s has %d systems (%s): name one with systems_uri or plug", c.hostport, len(systems), strings.Join(ids, ", "))}
}

// classify maps a gofish or HTTP error to the fault sentinels. Error texts from the service are
// quoted, never the credentials.
func classify(ctx context.Context, c *config, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s at %s: the BMC did not answer in time: %w", what, c.hostport, ctx.Err())
	}
	var re *schemas.Error
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var certErr *tls.CertificateVerificationError
	var ne net.Error
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &re):
		msg := re.Message
		if len(msg) > 200 {
			msg = msg[:200]
		}
		switch re.HTTPReturnedStatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %s at %s: HTTP %d for user %q", fault.ErrUnauthenticated, what, c.hostport, re.HTTPReturnedStatusCode, c.username)
		case http.StatusNotFound:
			field := ParamSystemsURI
			if c.systemsURI == "" && c.plug != "" {
				field = kit.ParamPlug
			}
			return fault.FieldError{Field: field, Problem: fmt.Sprintf("%s at %s: not found (HTTP 404)", what, c.hostport)}
		}
		return fmt.Errorf("%w: %s at %s: HTTP %d: %s", fault.ErrDevice, what, c.hostport, re.HTTPReturnedStatusCode, msg)
	case errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &certErr):
		return fmt.Errorf("%w: %s at %s: the BMC's certificate is not trusted (set ssl_ca_file to its CA; ssl_insecure=1 only for tests): %v",
			fault.ErrUnauthenticated, what, c.hostport, err)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%s at %s: the BMC did not answer in time: %w", what, c.hostport, context.DeadlineExceeded)
	case errors.As(err, &syntax):
		return fmt.Errorf("%w: %s at %s: not a Redfish answer: %v", fault.ErrDevice, what, c.hostport, err)
	}
	return fmt.Errorf("%w: %s at %s: %v", fault.ErrUnreachable, what, c.hostport, err)
}
