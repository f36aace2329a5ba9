package pdu

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gosnmp/gosnmp"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/fault"
)

// model returns the forced or detected PDU model; detections are cached per device address.
func (s *session) model() (*profile, error) {
	if s.c.model != nil {
		return s.c.model, nil
	}
	s.d.mu.Lock()
	p := s.d.detected[s.c.addr()]
	s.d.mu.Unlock()
	if p != nil {
		return p, nil
	}
	v, err := s.get("sysObjectID", ".1.3.6.1.2.1.1.2.0")
	if err != nil {
		return nil, err
	}
	oid, ok := v[0].Value.(string)
	if v[0].Type != gosnmp.ObjectIdentifier || !ok {
		return nil, fmt.Errorf("%w: PDU %s has no sysObjectID to detect its model; set %s", fault.ErrFailedPrecondition, s.c.addr(), ParamDeviceType)
	}
	if p = profileByObjectID(oid); p == nil {
		return nil, fmt.Errorf("%w: PDU %s reports sysObjectID %s, which is not a supported model; set %s to one of %s if it is compatible",
			fault.ErrFailedPrecondition, s.c.addr(), oid, ParamDeviceType, strings.Join(profileNames()[1:], ", "))
	}
	s.d.mu.Lock()
	s.d.detected[s.c.addr()] = p
	s.d.mu.Unlock()
	return p, nil
}

// outlet is a resolved plug.
type outlet struct {
	model *profile
	plug  int // plug number
	index int // OID index
}

// resolve finds the target's outlet: a number is used as is (its existence is checked by the
// status read), a name is looked up in the outlet-name column.
func (s *session) resolve() (outlet, error) {
	m, err := s.model()
	if err != nil {
		return outlet{}, err
	}
	if s.c.plugNum > 0 {
		return outlet{m, s.c.plugNum, m.index(s.c.plugNum)}, nil
	}
	// A name found before is re-checked with one GET of that outlet's name, so a renamed
	// outlet is never switched under its old name and a walk is needed only once.
	cacheKey := s.c.addr() + "\x00" + m.name + "\x00" + s.c.plug
	s.d.mu.Lock()
	n, cached := s.d.named[cacheKey]
	s.d.mu.Unlock()
	if cached {
		v, err := s.get("outlet name", m.nameOID(m.index(n)))
		if err != nil {
			return outlet{}, err
		}
		if b, ok := v[0].Value.([]byte); ok && v[0].Type == gosnmp.OctetString && string(b) == s.c.plug {
			return outlet{m, n, m.index(n)}, nil
		}
	}
	plugs, err := s.walkNames(m)
	if err != nil {
		return outlet{}, err
	}
	var found []int
	for _, p := range plugs {
		if p.GetName() == s.c.plug {
			n, _ := strconv.Atoi(p.GetId())
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		var inv fault.Invalid
		inv.Add(kit.ParamPlug, "PDU %s (%s) has no outlet named %q", s.c.addr(), m.name, s.c.plug)
		return outlet{}, inv.Err()
	case 1:
		s.d.mu.Lock()
		s.d.named[cacheKey] = found[0]
		s.d.mu.Unlock()
		return outlet{m, found[0], m.index(found[0])}, nil
	}
	var inv fault.Invalid
	inv.Add(kit.ParamPlug, "PDU %s has %d outlets named %q (%v): give the outlet number", s.c.addr(), len(found), s.c.plug, found)
	return outlet{}, inv.Err()
}

// walkNames lists the outlets from the model's name column.
func (s *session) walkNames(m *profile) ([]*driverv1.Plug, error) {
	// GETNEXT, not GETBULK: a bulk answer runs on past the name column into the state
	// columns, so one outlet that does not answer would sink the whole list.
	pdus, err := s.g.WalkAll(m.names)
	if err != nil {
		s.bad = true
		return nil, s.classify("walk of the outlet names", err)
	}
	var plugs []*driverv1.Plug
	for _, p := range pdus {
		n, ok := m.plugFromNameRow(p.Name)
		if !ok || n < 1 {
			continue
		}
		name := ""
		if b, ok := p.Value.([]byte); ok {
			name = string(b)
		}
		plugs = append(plugs, &driverv1.Plug{Id: strconv.Itoa(n), Name: name})
	}
	return plugs, nil
}

// readState reads the outlet's status. A missing status OID means the PDU has no such outlet.
func (s *session) readState(o outlet) (driverv1.PowerState, error) {
	v, err := s.get("outlet status", o.model.status(o.index))
	if err != nil {
		return driverv1.PowerState_POWER_STATE_UNKNOWN, err
	}
	switch v[0].Type {
	case gosnmp.NoSuchInstance, gosnmp.NoSuchObject, gosnmp.EndOfMibView, gosnmp.Null:
		var inv fault.Invalid
		inv.Add(kit.ParamPlug, "PDU %s (%s) has no outlet %s", s.c.addr(), o.model.name, s.c.plug)
		return driverv1.PowerState_POWER_STATE_UNKNOWN, inv.Err()
	case gosnmp.Integer:
		// Pending, cycling or error values map to UNKNOWN: in doubt, never off.
		return o.model.state(int(gosnmp.ToBigInt(v[0].Value).Int64())), nil
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN, fmt.Errorf("%w: PDU %s answered the outlet status with a %s", fault.ErrDevice, s.c.addr(), v[0].Type)
}
