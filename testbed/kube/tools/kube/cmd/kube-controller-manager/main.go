// Command kube-controller-manager is the upstream Kubernetes controller manager (node lifecycle,
// StatefulSet, garbage collector, ...), built from the k8s.io/kubernetes Go module for nodefence's
// real multi-node test cluster (testbed/cluster).
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
