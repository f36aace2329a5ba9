// Command kubectl is the upstream Kubernetes command-line client, built from the k8s.io/kubernetes
// Go module at the cluster's version, so the install test (testbed/install) applies deploy/'s
// overlay with `kubectl apply -k` as an operator would, with a client the server supports.
package main

import (
	"os"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
