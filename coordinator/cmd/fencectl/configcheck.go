package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/fault"
)

// configCheck validates a fence configuration and prints the resolved plan, secrets masked. Secret
// files are read only with checkSecrets.
func configCheck(path string, checkSecrets bool, stdout, stderr io.Writer) int {
	checks := fenceconfig.Checks{SecretFiles: fenceconfig.SecretFilesSkip}
	if checkSecrets {
		checks.SecretFiles = fenceconfig.SecretFilesRead
	}
	c, err := fenceconfig.LoadAnyWith(path, nil, checks)
	if err != nil {
		var inv fault.Invalid
		if errors.As(err, &inv) {
			fmt.Fprintf(stderr, "%s: %d problem(s):\n", path, len(inv))
			for _, fe := range inv {
				fmt.Fprintln(stderr, "  -", fe.Error())
			}
		} else {
			fmt.Fprintln(stderr, "fencectl:", err)
		}
		return 1
	}
	var bad, notes []string
	for _, node := range c.NodeNames() {
		for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
			ms, _ := c.Plan(node, step)
			for _, m := range ms {
				for _, p := range checkMethod(m) {
					bad = append(bad, fmt.Sprintf("nodes.%s.methods.%s (driver %s): %s", node, m.Name, m.Driver, p))
				}
				p, n := unknownParameters(c, node, m)
				bad, notes = append(bad, p...), append(notes, n...)
			}
		}
	}
	bad = append(bad, sharedDevices(c)...)
	sort.Strings(notes)
	for _, n := range slices.Compact(notes) {
		fmt.Fprintln(stderr, "note:", n)
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		bad = slices.Compact(bad)
		fmt.Fprintf(stderr, "%s: %d problem(s):\n", path, len(bad))
		for _, p := range bad {
			fmt.Fprintln(stderr, "  -", p)
		}
		return 1
	}
	for _, node := range c.NodeNames() {
		fmt.Fprintf(stdout, "node %s\n", node)
		for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
			ms, _ := c.Plan(node, step)
			if len(ms) == 0 {
				fmt.Fprintf(stdout, "  %s: (none)\n", step)
				continue
			}
			fmt.Fprintf(stdout, "  %s:\n", step)
			for i, m := range ms {
				req := ""
				if m.Required {
					req = ", must succeed"
				}
				fmt.Fprintf(stdout, "    %d. %s: %s via %s%s\n", i+1, m.Name, m.Action, m.Driver, req)
				keys := make([]string, 0, len(m.Parameters))
				for k := range m.Parameters {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					v := m.Parameters[k]
					if secretFor(m.Driver, k) {
						v = "***"
					}
					fmt.Fprintf(stdout, "       %s=%s\n", k, v)
				}
			}
		}
	}
	fmt.Fprintf(stdout, "%d node(s), configuration valid\n", len(c.NodeNames()))
	return 0
}
