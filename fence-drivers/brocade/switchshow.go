package brocade

import (
	"errors"
	"strconv"
	"strings"
)

// PortRow is one port row of `switchshow`.
type PortRow struct {
	// Index is the port index (the plug).
	Index int
	// State is the State column (Online, No_Light, ...).
	State string
	// Disabled is whether the column after Proto says "Disabled": the port is isolated.
	Disabled bool
}

// errNoTable is returned for output that has no port table.
var errNoTable = errors.New("no port table (no ===== line) in switchshow output")

// ParseSwitchshow reads the port table of `switchshow` output: the rows after the line of '='
// whose first field is a number. The header line above the '=' line names the columns: the flag
// column is the one after Proto, which works for both the fixed-port layout (Index Port Address
// Media Speed State Proto) and the director layout with a Slot column. Without a header it
// assumes the fixed-port layout, as fence_brocade does (flag at the 8th field).
func ParseSwitchshow(out string) ([]PortRow, error) {
	lines := strings.Split(strings.ReplaceAll(out, "\r", ""), "\n")
	table := -1
	for i, l := range lines {
		if strings.Contains(l, "=========") {
			table = i
			break
		}
	}
	if table < 0 {
		return nil, errNoTable
	}
	stateCol, flagCol := 5, 7
	if table > 0 {
		header := strings.Fields(lines[table-1])
		for i, h := range header {
			switch strings.ToLower(h) {
			case "state":
				stateCol = i
			case "proto":
				flagCol = i + 1
			}
		}
	}
	var rows []PortRow
	for _, l := range lines[table+1:] {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.Atoi(f[0])
		if err != nil || n < 0 {
			continue
		}
		r := PortRow{Index: n}
		if len(f) > stateCol {
			r.State = f[stateCol]
		}
		r.Disabled = len(f) > flagCol && f[flagCol] == "Disabled"
		rows = append(rows, r)
	}
	return rows, nil
}

// commandFailed reports whether a configuration command's output says it failed. Fabric OS
// prints nothing on success; words like these mean the command was not applied.
func commandFailed(out string) bool {
	l := strings.ToLower(out)
	for _, w := range []string{"error", "invalid", "not found", "denied", "usage", "failed", "not supported", "not permitted", "not allowed"} {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}
