// Command kube-apiserver is the upstream Kubernetes API server, built from the
// k8s.io/kubernetes Go module for nodefence's integration tests (testbed/kube).
// It lives in its own module so the project's go.mod never carries the
// Kubernetes dependency graph or its staging-module replace directives.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
