package signals

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// PSI is one line of a /proc/pressure file: the share of wall time some (or all, "full") runnable
// tasks were stalled on the resource, averaged over 10, 60 and 300 seconds, in percent, and the total
// stall time in microseconds.
type PSI struct {
	Avg10, Avg60, Avg300 float64
	Total                uint64
}

// ParsePSI parses a /proc/pressure/{cpu,io,memory} file into its "some" and "full" lines.
func ParsePSI(r io.Reader) (map[string]PSI, error) {
	out := map[string]PSI{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] != "some" && f[0] != "full" {
			return nil, fmt.Errorf("line %d: unknown kind %q", n, f[0])
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("line %d: %s given twice", n, f[0])
		}
		var p PSI
		seen := 0
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("line %d: %q is not key=value", n, kv)
			}
			var err error
			switch k {
			case "avg10":
				p.Avg10, err = parsePercent(v)
			case "avg60":
				p.Avg60, err = parsePercent(v)
			case "avg300":
				p.Avg300, err = parsePercent(v)
			case "total":
				p.Total, err = strconv.ParseUint(v, 10, 64)
			default:
				continue // newer kernels may add fields
			}
			if err != nil {
				return nil, fmt.Errorf("line %d: %s: %w", n, k, err)
			}
			seen++
		}
		if seen != 4 {
			return nil, fmt.Errorf("line %d: want avg10, avg60, avg300 and total", n)
		}
		out[f[0]] = p
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := out["some"]; !ok {
		return nil, errors.New(`no "some" line`)
	}
	return out, nil
}

func parsePercent(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 100 {
		return 0, fmt.Errorf("%q is not a percentage", v)
	}
	return f, nil
}

// psiScale is the capacity of a PSI signal: basis points of wall time.
const psiScale = 10000

// PSISignals reads /proc/pressure where the kernel has it (CONFIG_PSI) and returns, per resource,
// "psi.<resource>.some" (and ".full" where present) with Available = the share of the last 10 s in
// which tasks were NOT stalled, in basis points of Capacity 10000 — so, like every eviction signal,
// lower means more pressure. Missing files give no signals and no error.
func (r Reader) PSISignals() ([]*agentv1.Signal, error) {
	var out []*agentv1.Signal
	for _, res := range []string{"cpu", "io", "memory"} {
		f, err := os.Open(filepath.Join(r.procRoot(), "pressure", res))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		m, err := ParsePSI(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("/proc/pressure/%s: %w", res, err)
		}
		for _, kind := range []string{"some", "full"} {
			if p, ok := m[kind]; ok {
				out = append(out, &agentv1.Signal{Name: "psi." + res + "." + kind, Available: int64((100 - p.Avg10) * psiScale / 100), Capacity: psiScale})
			}
		}
	}
	return out, nil
}
