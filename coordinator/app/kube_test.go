package app

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/testbed/kube/kubetest"
	"github.com/nodefence/nodefence/testbed/tcpproxy"
)

// A fence method's Secret credentials stay usable while the apiserver is away (the last value read
// is kept), and a Secret that is deleted is forgotten once the apiserver says so.
func TestSecretSurvivesAPIServerOutage(t *testing.T) {
	c := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := c.Clientset()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fencing"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets("fencing").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bmc"},
		Data: map[string][]byte{"password": []byte("s3cret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proxy, err := tcpproxy.Start(strings.TrimPrefix(c.Host, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	rc := c.Config()
	rc.Host = "https://" + proxy.Addr()
	rc.TLSClientConfig.ServerName = "127.0.0.1"
	rc.Timeout = 2 * time.Second
	k := &kubeMode{a: &App{cfg: Config{FenceNamespace: "fencing"}}, core: kubernetes.NewForConfigOrDie(rc)}

	if _, err := k.secret("", "bmc", "nokey"); err == nil {
		t.Fatal("a missing key was read")
	}
	if v, err := k.secret("", "bmc", "password"); err != nil || v != "s3cret" {
		t.Fatalf("before the outage: %q, %v", v, err)
	}
	proxy.Cut()
	if v, err := k.secret("", "bmc", "password"); err != nil || v != "s3cret" {
		t.Fatalf("during the outage: %q, %v; want the last value read", v, err)
	}
	if _, err := k.secret("", "other", "password"); err == nil {
		t.Fatal("a Secret never read was read during the outage")
	}
	proxy.Restore()
	if err := admin.CoreV1().Secrets("fencing").Delete(ctx, "bmc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.secret("", "bmc", "password"); err == nil {
		t.Fatal("a deleted Secret was read")
	}
	proxy.Cut()
	if _, err := k.secret("", "bmc", "password"); err == nil {
		t.Fatal("a deleted Secret was read from memory during an outage")
	}
}
