package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodefence/nodefence/services/identity"
	"github.com/nodefence/nodefence/testbed/pki"
	"github.com/nodefence/nodefence/testbed/syncbuf"
)

// fencectl pointed at a server of the nodefence CA whose certificate is not a coordinator's (a
// driver's here: a wrong address, or an impostor) refuses it in the handshake and says why: the
// address, the identity it expected and the one the server presented.
func TestWrongPeerNamesBothIdentities(t *testing.T) {
	ca, err := pki.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	driver, err := ca.Files(identity.Driver, "ipmi")
	if err != nil {
		t.Fatal(err)
	}
	operator, err := ca.Files(identity.Operator, "alice")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := driver.Server()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errb bytes.Buffer
	args := append([]string{"nodes"}, append(pki.Args("", operator), "--coordinator", lis.Addr().String(), "--timeout", "10s")...)
	code := run(ctx, args, &syncbuf.Buffer{}, &errb)
	msg := errb.String()
	t.Logf("fencectl: exit %d: %s", code, msg)
	if code == 0 {
		t.Fatal("fencectl accepted a driver's certificate as a coordinator's")
	}
	for _, want := range []string{lis.Addr().String(), "presented spiffe://nodefence/driver/ipmi", "expected spiffe://nodefence/coordinator/*"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q", want)
		}
	}
}
