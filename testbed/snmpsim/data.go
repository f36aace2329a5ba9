package snmpsim

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// record is one line of a .snmprec file: OID|tag|value.
type record struct {
	oid, tag, value string
}

// pduTag marks a record served by the pdu variation module (tag 2 = INTEGER).
const pduTag = "2:pdu"

func outletRec(oid string, dev Profile, outlet int, settings string) record {
	return record{oid, pduTag, fmt.Sprintf("dev=%s,outlet=%d,%s", dev, outlet, settings)}
}

func systemGroup(descr, objectID string, dev Profile) []record {
	const sys = "1.3.6.1.2.1.1"
	return []record{
		{sys + ".1.0", "4", descr},
		{sys + ".2.0", "6", objectID},
		{sys + ".3.0", "67", "123456"},
		{sys + ".4.0", "4", "fencing lab"},
		{sys + ".5.0", "4", string(dev)},
		{sys + ".6.0", "4", "rack 1"},
		{sys + ".7.0", "2", "72"},
		// snmpEngineMaxMessageSize: a record after every vendor table, so that a walk of the
		// last table ends by leaving its subtree rather than with endOfMibView.
		{"1.3.6.1.6.3.10.2.1.4.0", "2", "65507"},
	}
}

// OutletName is the name every simulated outlet n has.
func OutletName(n int) string { return "Outlet " + strconv.Itoa(n) }

// apcMasterSwitchTable is PowerNet-MIB sPDUOutletControlTable (.318.1.1.4.4.2.1).
func apcMasterSwitchTable(dev Profile, n int) []record {
	const b = "1.3.6.1.4.1.318.1.1.4.4.2.1"
	var r []record
	for i := 1; i <= n; i++ {
		r = append(r,
			record{fmt.Sprintf("%s.1.%d", b, i), "2", strconv.Itoa(i)},
			outletRec(fmt.Sprintf("%s.2.%d", b, i), dev, i, "pend=1:2"),
			outletRec(fmt.Sprintf("%s.3.%d", b, i), dev, i, "read=on:1|off:2,write=1:on|2:off|3:reboot|5:on@5|6:off@5|7:reboot@5"),
			record{fmt.Sprintf("%s.4.%d", b, i), "4", OutletName(i)})
	}
	return r
}

// apcRPDUTables are the rPDU tables of PowerNet-MIB (.318.1.1.12).
func apcRPDUTables(dev Profile, n int) []record {
	const b = "1.3.6.1.4.1.318.1.1.12"
	r := []record{
		{b + ".1.1.0", "4", "apc-pdu"},
		{b + ".1.3.0", "4", "v3.9.2"},
		{b + ".1.5.0", "4", "AP7921"},
		{b + ".1.8.0", "2", strconv.Itoa(n)},
		{b + ".3.1.4.0", "2", strconv.Itoa(n)},
	}
	for i := 1; i <= n; i++ {
		r = append(r,
			record{fmt.Sprintf("%s.3.3.1.1.1.%d", b, i), "2", strconv.Itoa(i)},
			record{fmt.Sprintf("%s.3.3.1.1.2.%d", b, i), "4", OutletName(i)},
			outletRec(fmt.Sprintf("%s.3.3.1.1.4.%d", b, i), dev, i, "read=on:1|off:2,write=1:on|2:off|3:reboot|4:on@5|5:off@5|6:reboot@5|7:cancel"),
			record{fmt.Sprintf("%s.3.5.1.1.1.%d", b, i), "2", strconv.Itoa(i)},
			record{fmt.Sprintf("%s.3.5.1.1.2.%d", b, i), "4", OutletName(i)},
			outletRec(fmt.Sprintf("%s.3.5.1.1.4.%d", b, i), dev, i, "read=on:1|off:2"),
			outletRec(fmt.Sprintf("%s.3.5.1.1.5.%d", b, i), dev, i, "pend=1:2"))
	}
	return r
}

// apcRPDU2Tables are the rPDU2 switched-outlet tables (.318.1.1.26.9.2), whose status values
// are the reverse of rPDU's: off(1), on(2).
func apcRPDU2Tables(dev Profile, n int) []record {
	const b = "1.3.6.1.4.1.318.1.1.26"
	r := []record{{b + ".2.1.3.1", "4", string(dev)}, {b + ".2.1.8.1", "4", "AP8941"}}
	for i := 1; i <= n; i++ {
		r = append(r,
			record{fmt.Sprintf("%s.9.2.3.1.1.%d", b, i), "2", strconv.Itoa(i)},
			record{fmt.Sprintf("%s.9.2.3.1.3.%d", b, i), "4", OutletName(i)},
			outletRec(fmt.Sprintf("%s.9.2.3.1.5.%d", b, i), dev, i, "read=on:2|off:1"),
			outletRec(fmt.Sprintf("%s.9.2.3.1.6.%d", b, i), dev, i, "pend=1:2"),
			record{fmt.Sprintf("%s.9.2.4.1.1.%d", b, i), "2", strconv.Itoa(i)},
			record{fmt.Sprintf("%s.9.2.4.1.3.%d", b, i), "4", OutletName(i)},
			outletRec(fmt.Sprintf("%s.9.2.4.1.5.%d", b, i), dev, i, "read=on:1|off:2,write=1:on|2:off|3:reboot|5:on@5|6:off@5|7:reboot@5|8:cancel"))
	}
	return r
}

// records returns the data of one profile with n outlets.
func records(p Profile, n int) []record {
	switch p {
	case APCMasterSwitch:
		return slices.Concat(systemGroup("APC MasterSwitch AP9211", ObjectIDs[p], p), apcMasterSwitchTable(p, n))
	case APCRPDU:
		return slices.Concat(systemGroup("APC Web/SNMP Management Card (MN:AP7921)", ObjectIDs[p], p),
			apcMasterSwitchTable(p, n), apcRPDUTables(p, n))
	case APCRPDU2:
		return slices.Concat(systemGroup("APC Web/SNMP Management Card (MN:AP8941)", ObjectIDs[p], p),
			apcMasterSwitchTable(p, n), apcRPDUTables(p, n), apcRPDU2Tables(p, n))
	case EatonG3:
		const b = "1.3.6.1.4.1.534.6.6.7"
		r := slices.Concat(systemGroup("Eaton ePDU Switched", ObjectIDs[p], p), []record{
			{b + ".1.2.1.2.0", "4", "ePDU SWITCHED"},
			{b + ".1.2.1.5.0", "4", "04.00.0005"},
			{b + ".1.2.1.22.0", "2", strconv.Itoa(n)},
		})
		for i := 1; i <= n; i++ {
			r = append(r,
				record{fmt.Sprintf("%s.6.1.1.2.0.%d", b, i), "4", strconv.Itoa(i)},
				record{fmt.Sprintf("%s.6.1.1.3.0.%d", b, i), "4", OutletName(i)},
				outletRec(fmt.Sprintf("%s.6.6.1.2.0.%d", b, i), p, i, "read=on:1|off:0|pendingoff:2|pendingon:3"),
				outletRec(fmt.Sprintf("%s.6.6.1.3.0.%d", b, i), p, i, "cmd=off"),
				outletRec(fmt.Sprintf("%s.6.6.1.4.0.%d", b, i), p, i, "cmd=on"),
				outletRec(fmt.Sprintf("%s.6.6.1.5.0.%d", b, i), p, i, "cmd=reboot"),
				record{fmt.Sprintf("%s.6.6.1.9.0.%d", b, i), "2", "1"})
		}
		return r
	case EatonManaged:
		// EATON-EPDU-MA-MIB as fence_eaton_snmp expects it: rows indexed from 0.
		const b = "1.3.6.1.4.1.534.6.6.6"
		r := slices.Concat(systemGroup("Eaton Managed ePDU", ObjectIDs[p], p), []record{
			{b + ".1.1.1.0", "4", "01.01.01"},
			{b + ".1.2.1.0", "2", strconv.Itoa(n)},
		})
		for i := 0; i < n; i++ {
			r = append(r,
				record{fmt.Sprintf("%s.1.2.2.1.1.%d", b, i), "2", strconv.Itoa(i)},
				record{fmt.Sprintf("%s.1.2.2.1.2.%d", b, i), "4", OutletName(i + 1)},
				outletRec(fmt.Sprintf("%s.1.2.2.1.3.%d", b, i), p, i+1, "read=on:1|off:0|pendingon:2,write=0:off|1:on|2:reboot"))
		}
		return r
	case Pulizzi:
		// EATON-EPDU-PU-SW-MIB: data under 20677.2 while sysObjectID says 20677.1;
		// outletNCommand is 20677.2.6.2.(N+1).0 (2.6.2.1.0 is globalCommand).
		const b = "1.3.6.1.4.1.20677.2.6"
		r := slices.Concat(systemGroup("Eaton Switched ePDU (Pulizzi) 2.0.K", ObjectIDs[p], p),
			[]record{{b + ".2.1.0", "2", "0"}})
		for i := 1; i <= n; i++ {
			r = append(r,
				record{fmt.Sprintf("%s.1.%d.1.0", b, i), "4", OutletName(i)},
				outletRec(fmt.Sprintf("%s.2.%d.0", b, i+1), p, i, "idle=4,write=1:on|2:off|3:reboot|4:noop"),
				outletRec(fmt.Sprintf("%s.3.%d.0", b, i), p, i, "read=on:1|off:2"))
		}
		return r
	}
	return nil
}

// snmprec renders records sorted by OID; readOnly marks every outlet record ro=1.
func snmprec(recs []record, readOnly bool) string {
	sorted := slices.Clone(recs)
	slices.SortFunc(sorted, func(a, b record) int { return compareOIDs(a.oid, b.oid) })
	var sb strings.Builder
	for _, r := range sorted {
		v := r.value
		if readOnly && r.tag == pduTag {
			v += ",ro=1"
		}
		fmt.Fprintf(&sb, "%s|%s|%s\n", r.oid, r.tag, v)
	}
	return sb.String()
}

func compareOIDs(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(as), len(bs))
}
