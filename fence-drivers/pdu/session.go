package pdu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gosnmp/gosnmp"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/fault"
)

// sessionKey identifies a session's connection parameters, secrets included (hashed, kept in
// memory only).
func sessionKey(c *config) string {
	g := &c.snmp
	parts := []any{c.addr(), g.Version, g.MsgFlags, g.Community, g.ContextName, c.timeout}
	if u := g.SecurityParameters; u != nil {
		parts = append(parts, u.UserName, u.AuthenticationProtocol, u.AuthenticationPassphrase, u.PrivacyProtocol, u.PrivacyPassphrase)
	}
	return kit.SessionKey(parts...)
}

// session is one SNMP client in use by one operation.
type session struct {
	d   *Driver
	c   *config
	g   *gosnmp.GoSNMP
	key string
	bad bool // a failed request: do not reuse
}

// open takes an idle session for c or connects a new one, bound to ctx.
func (d *Driver) open(ctx context.Context, c *config) (*session, error) {
	key := sessionKey(c)
	g, ok := d.pool.Get(key)
	if !ok {
		p := &c.snmp
		g = &gosnmp.GoSNMP{
			Target: c.host, Port: uint16(c.port), Transport: "udp", MaxOids: gosnmp.MaxOids,
			Version: p.Version, Community: p.Community, MsgFlags: p.MsgFlags, ContextName: p.ContextName,
		}
		if p.SecurityParameters != nil {
			g.SecurityModel = gosnmp.UserSecurityModel
			g.SecurityParameters = p.SecurityParameters.Copy()
		}
		g.Timeout = c.timeout
		g.Context = ctx
		if err := g.Connect(); err != nil {
			return nil, fmt.Errorf("%w: SNMP to PDU %s: %v", fault.ErrUnreachable, c.addr(), err)
		}
	}
	g.Context = ctx
	g.Timeout = c.timeout
	g.ExponentialTimeout = false
	// Retry until the operation's deadline rather than giving up early: a PDU that does not
	// answer in time is reported as a deadline, not guessed at.
	g.Retries = 2
	if dl, ok := ctx.Deadline(); ok {
		g.Retries = max(0, min(1000, int(time.Until(dl)/c.timeout)+1))
	}
	return &session{d: d, c: c, g: g, key: key}, nil
}

// close returns a healthy session to the pool and closes a failed one.
func (s *session) close() {
	s.g.Context = context.Background()
	s.d.pool.Put(s.key, s.g, !s.bad)
}

func closeSNMP(g *gosnmp.GoSNMP) { _ = g.Conn.Close() }

// Close closes every idle session.
func (d *Driver) Close() { d.pool.Close() }

// get reads oids; a transport or security failure marks the session bad.
func (s *session) get(what string, oids ...string) ([]gosnmp.SnmpPDU, error) {
	r, err := s.g.Get(oids)
	if err != nil {
		s.bad = true
		return nil, s.classify(what, err)
	}
	if r.Error != gosnmp.NoError {
		if r.Error == gosnmp.NoSuchName { // SNMPv1's "no such object"
			return noSuch(oids), nil
		}
		return nil, fmt.Errorf("%w: SNMP GET %s on PDU %s: %s", fault.ErrDevice, what, s.c.addr(), r.Error)
	}
	if len(r.Variables) != len(oids) {
		s.bad = true
		return nil, fmt.Errorf("%w: SNMP GET %s on PDU %s: %d values for %d OIDs", fault.ErrDevice, what, s.c.addr(), len(r.Variables), len(oids))
	}
	return r.Variables, nil
}

func noSuch(oids []string) []gosnmp.SnmpPDU {
	out := make([]gosnmp.SnmpPDU, len(oids))
	for i, o := range oids {
		out[i] = gosnmp.SnmpPDU{Name: o, Type: gosnmp.NoSuchInstance}
	}
	return out
}

// set writes one integer.
func (s *session) set(what, oid string, v int) error {
	r, err := s.g.Set([]gosnmp.SnmpPDU{{Name: oid, Type: gosnmp.Integer, Value: v}})
	if err != nil {
		s.bad = true
		return s.classify(what, err)
	}
	switch r.Error {
	case gosnmp.NoError:
		return nil
	case gosnmp.NoAccess, gosnmp.AuthorizationError, gosnmp.NotWritable, gosnmp.ReadOnly:
		return fmt.Errorf("%w: PDU %s refused SNMP SET %s with %s: the community or user has no write access", fault.ErrUnauthenticated, s.c.addr(), what, r.Error)
	case gosnmp.NoSuchName:
		// SNMPv1 answers a SET with a read-only community so; the outlet's existence was
		// checked by a GET just before.
		return fmt.Errorf("%w: PDU %s refused SNMP SET %s with noSuchName (SNMPv1's answer when the community has no write access)", fault.ErrUnauthenticated, s.c.addr(), what)
	}
	return fmt.Errorf("%w: PDU %s refused SNMP SET %s: %s", fault.ErrDevice, s.c.addr(), what, r.Error)
}

// classify wraps a gosnmp error in the fault sentinel it means, never quoting a secret.
func (s *session) classify(what string, err error) error {
	c, ctx := s.c, s.g.Context
	switch {
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
		hint := " (many agents do not answer a wrong community at all)"
		if c.snmp.Version == gosnmp.Version3 {
			hint = " (many agents do not answer an unknown SNMPv3 user or a wrong privacy passphrase at all)"
		}
		return fmt.Errorf("SNMP %s on PDU %s: no answer before the deadline%s: %w", what, c.addr(), hint, context.DeadlineExceeded)
	case errors.Is(err, gosnmp.ErrWrongDigest), strings.Contains(err.Error(), "not authentic"):
		// The agent's report of a wrong digest cannot be authenticated with our key either.
		return fmt.Errorf("%w: PDU %s rejected the authentication passphrase of SNMPv3 user %q (wrong digest)", fault.ErrUnauthenticated, c.addr(), s.user())
	case errors.Is(err, gosnmp.ErrUnknownUsername):
		return fmt.Errorf("%w: PDU %s does not know SNMPv3 user %q", fault.ErrUnauthenticated, c.addr(), s.user())
	case errors.Is(err, gosnmp.ErrDecryption):
		return fmt.Errorf("%w: PDU %s could not decrypt the request of SNMPv3 user %q (wrong privacy passphrase or protocol)", fault.ErrUnauthenticated, c.addr(), s.user())
	case errors.Is(err, gosnmp.ErrUnknownSecurityLevel):
		return fmt.Errorf("%w: PDU %s does not accept security level %s for SNMPv3 user %q", fault.ErrUnauthenticated, c.addr(), c.snmp.MsgFlags, s.user())
	}
	return fmt.Errorf("%w: SNMP %s on PDU %s: %v", fault.ErrUnreachable, what, c.addr(), err)
}

func (s *session) user() string {
	if u := s.c.snmp.SecurityParameters; u != nil {
		return u.UserName
	}
	return ""
}
