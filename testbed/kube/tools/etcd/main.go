// Command etcd is the etcd server v3.6, built from its Go module for
// nodefence's Kubernetes integration tests (testbed/kube). Debian's etcd 3.4
// is too old for kube-apiserver 1.36 (no watch progress requests).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
