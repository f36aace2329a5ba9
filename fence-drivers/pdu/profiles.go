package pdu

import (
	"fmt"
	"slices"
	"strings"

	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// profile describes how one PDU model exposes its outlets. Outlet indexes in OIDs are computed
// from the plug number (1-based, as printed on the PDU) by index.
type profile struct {
	// name is the value of the device_type parameter that forces this profile.
	name string
	// what is the model, for messages and Describe.
	what string
	// objectIDs are the sysObjectID values (without the leading dot) that select the profile.
	objectIDs []string
	// names is the outlet-name column; a row's OID suffix is the outlet index.
	names string
	// status and control return the OIDs of an outlet index.
	status, control func(index int) string
	// onRead and offRead are the status values meaning on and off; anything else is unknown.
	onRead, offRead int
	// onWrite and offWrite are the control values that switch an outlet on and off.
	onWrite, offWrite int
	// offControl, when set, is a separate control OID for off (Eaton G3 has one per command).
	offControl func(index int) string
	// zeroBased says the OID index is the plug number minus one (Eaton Managed ePDU).
	zeroBased bool
}

// index is the OID index of plug number n.
func (p *profile) index(n int) int {
	if p.zeroBased {
		return n - 1
	}
	return n
}

// plug is the plug number of OID index i.
func (p *profile) plug(i int) int {
	if p.zeroBased {
		return i + 1
	}
	return i
}

// nameOID is the OID of outlet index i's name.
func (p *profile) nameOID(i int) string {
	if p.name == "eaton-pulizzi" {
		return fmt.Sprintf("%s.%d.1.0", p.names, i)
	}
	return fmt.Sprintf("%s.%d", p.names, i)
}

// controlFor returns the OID and value that switch outlet index i to want.
func (p *profile) controlFor(i int, want driverv1.PowerState) (string, int) {
	if want == driverv1.PowerState_POWER_STATE_OFF {
		if p.offControl != nil {
			return p.offControl(i), p.offWrite
		}
		return p.control(i), p.offWrite
	}
	return p.control(i), p.onWrite
}

// state maps a status value.
func (p *profile) state(v int) driverv1.PowerState {
	switch v {
	case p.onRead:
		return driverv1.PowerState_POWER_STATE_ON
	case p.offRead:
		return driverv1.PowerState_POWER_STATE_OFF
	}
	return driverv1.PowerState_POWER_STATE_UNKNOWN
}

func column(prefix string) func(int) string {
	return func(i int) string { return fmt.Sprintf("%s.%d", prefix, i) }
}

const (
	apc   = "1.3.6.1.4.1.318.1.1"
	eaton = "1.3.6.1.4.1.534.6.6"
	puliz = "1.3.6.1.4.1.20677.2.6"
)

// profiles are the supported PDU models.
var profiles = []*profile{
	{
		name: "apc-rpdu", what: "APC rack PDU AP79xx (PowerNet-MIB rPDU)",
		objectIDs: []string{"1.3.6.1.4.1.318.1.3.4.5"},
		names:     apc + ".12.3.5.1.1.2",
		status:    column(apc + ".12.3.5.1.1.4"), control: column(apc + ".12.3.3.1.1.4"),
		onRead: 1, offRead: 2, onWrite: 1, offWrite: 2,
	},
	{
		// rPDU2 status values are the reverse of rPDU's: off(1), on(2).
		name: "apc-rpdu2", what: "APC rack PDU AP8xxx (PowerNet-MIB rPDU2)",
		objectIDs: []string{"1.3.6.1.4.1.318.1.3.4.6"},
		names:     apc + ".26.9.2.3.1.3",
		status:    column(apc + ".26.9.2.3.1.5"), control: column(apc + ".26.9.2.4.1.5"),
		onRead: 2, offRead: 1, onWrite: 1, offWrite: 2,
	},
	{
		name: "apc-masterswitch", what: "APC MasterSwitch (PowerNet-MIB sPDUOutletControl)",
		objectIDs: []string{"1.3.6.1.4.1.318.1.3.4.1", "1.3.6.1.4.1.318.1.3.4.2"},
		names:     apc + ".4.4.2.1.4",
		status:    column(apc + ".4.4.2.1.3"), control: column(apc + ".4.4.2.1.3"),
		onRead: 1, offRead: 2, onWrite: 1, offWrite: 2,
	},
	{
		// EATON-EPDU-MIB: index strappingIndex(0).outletIndex; one write-only command OID per
		// action, written with 0 (act now).
		name: "eaton-epdu", what: "Eaton ePDU G2/G3 (EATON-EPDU-MIB)",
		objectIDs: []string{"1.3.6.1.4.1.534.6.6.7"},
		names:     eaton + ".7.6.1.1.3.0",
		status:    column(eaton + ".7.6.6.1.2.0"), control: column(eaton + ".7.6.6.1.4.0"),
		offControl: column(eaton + ".7.6.6.1.3.0"),
		onRead:     1, offRead: 0, onWrite: 0, offWrite: 0,
	},
	{
		name: "eaton-managed", what: "Eaton Managed ePDU (EATON-EPDU-MA-MIB)",
		objectIDs: []string{"1.3.6.1.4.1.534.6.6.6"},
		names:     eaton + ".6.1.2.2.1.2",
		status:    column(eaton + ".6.1.2.2.1.3"), control: column(eaton + ".6.1.2.2.1.3"),
		onRead: 1, offRead: 0, onWrite: 1, offWrite: 0, zeroBased: true,
	},
	{
		// EATON-EPDU-PU-SW-MIB: scalars per outlet; outletNCommand is .2.(N+1).0 (.2.1.0 is
		// the global command).
		name: "eaton-pulizzi", what: "Eaton Switched ePDU, formerly Pulizzi (EATON-EPDU-PU-SW-MIB)",
		objectIDs: []string{"1.3.6.1.4.1.20677.1", "1.3.6.1.4.1.20677.2"},
		names:     puliz + ".1",
		status:    func(i int) string { return fmt.Sprintf("%s.3.%d.0", puliz, i) },
		control:   func(i int) string { return fmt.Sprintf("%s.2.%d.0", puliz, i+1) },
		onRead:    1, offRead: 2, onWrite: 1, offWrite: 2,
	},
}

// profileNames lists the device_type values, "auto" first.
func profileNames() []string {
	names := []string{"auto"}
	for _, p := range profiles {
		names = append(names, p.name)
	}
	return names
}

func profileByName(name string) *profile {
	for _, p := range profiles {
		if p.name == name {
			return p
		}
	}
	return nil
}

func profileByObjectID(oid string) *profile {
	oid = strings.TrimPrefix(oid, ".")
	for _, p := range profiles {
		if slices.Contains(p.objectIDs, oid) {
			return p
		}
	}
	return nil
}

// plugFromNameRow returns the plug number of a row of the names column: the OID suffix after
// the column prefix. Pulizzi's name OIDs are .1.N.1.0, whose first component is the plug.
func (p *profile) plugFromNameRow(oid string) (int, bool) {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(oid, "."), p.names+".")
	if !ok {
		return 0, false
	}
	first, _, _ := strings.Cut(rest, ".")
	var i int
	if _, err := fmt.Sscanf(first, "%d", &i); err != nil || i < 0 {
		return 0, false
	}
	return p.plug(i), true
}
