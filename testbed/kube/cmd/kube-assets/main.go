// Command kube-assets builds the kube-apiserver and etcd binaries the Kubernetes integration tests
// run (package testbed/kube/kubetest), when they are missing from their cache directory, and
// prints that directory. It is idempotent: with the binaries present it returns at once.
//
//	go run ./testbed/kube/cmd/kube-assets          # build what is missing
//	go run ./testbed/kube/cmd/kube-assets -print   # only print the directory
//
// Run it from anywhere inside the nodefence module. NODEFENCE_KUBE_ASSETS overrides the directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
)

func main() {
	printOnly := flag.Bool("print", false, "print the cache directory and exit")
	flag.Parse()
	if err := run(*printOnly); err != nil {
		fmt.Fprintln(os.Stderr, "kube-assets:", err)
		os.Exit(1)
	}
}

func run(printOnly bool) error {
	if printOnly {
		dir, err := kubetest.AssetsDir()
		if err != nil {
			return err
		}
		fmt.Println(dir)
		return nil
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return fmt.Errorf("run me inside the nodefence module")
	}
	root := filepath.Join(filepath.Dir(gomod), "testbed", "kube", "tools")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	dir, err := kubetest.Build(ctx, root, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kube-assets: ready in %s\n", time.Since(start).Round(time.Second))
	fmt.Println(dir)
	return nil
}
