// Package gomod reads the requirements of the testbed's tool modules (testbed/kube/tools,
// testbed/tools), whose pinned versions name the binaries the tests cache.
package gomod

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Requires verifies that the go.mod at path requires module at exactly version; the error names
// both versions, so a bump of one without the other is caught.
func Requires(path, module, version string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && fields[0] == module {
			if fields[1] != version {
				return fmt.Errorf("%s requires %s %s, but the testbed expects %s: update both together", path, module, fields[1], version)
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%s does not require %s", path, module)
}
