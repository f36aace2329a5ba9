package app

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/coordinator/etcdembed"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// EtcdAccess is what the coordinator presents to etcd: TLS files and an etcd user. For an
// external etcd (--etcd-endpoints) it comes from flags; the embedded etcd generates its own.
type EtcdAccess struct {
	// CAFile verifies etcd's server certificate (default: the system roots, for https endpoints).
	CAFile string
	// CertFile and KeyFile are the client certificate etcd's --client-cert-auth asks for.
	CertFile, KeyFile string
	// Username is the etcd user; its role needs read and write on --etcd-prefix/ only.
	Username string
	// PasswordFile holds the user's password (one line); never a flag value, so it stays out of
	// process listings.
	PasswordFile string
	// AllowOpen runs the coordinator on an etcd that admits clients other than the coordinators
	// (without a certificate, in plaintext, or with a nodefence CA certificate), logging each
	// problem instead of refusing to run. Tests and demos only.
	AllowOpen bool
}

// maxPasswordFile bounds the password file read at start.
const maxPasswordFile = 4096

// RegisterFlags binds the etcd access flags.
func (e *EtcdAccess) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&e.CAFile, "etcd-tls-ca", e.CAFile, "PEM CA bundle that verifies the external etcd's certificate")
	fs.StringVar(&e.CertFile, "etcd-tls-cert", e.CertFile, "PEM client certificate for the external etcd")
	fs.StringVar(&e.KeyFile, "etcd-tls-key", e.KeyFile, "PEM private key of --etcd-tls-cert")
	fs.StringVar(&e.Username, "etcd-username", e.Username, "etcd user (authentication on the external etcd)")
	fs.StringVar(&e.PasswordFile, "etcd-password-file", e.PasswordFile, "file holding the password of --etcd-username")
	fs.BoolVar(&e.AllowOpen, "etcd-allow-open", e.AllowOpen, "run even when the external etcd admits clients other than the coordinators (tests and demos only)")
}

func (e EtcdAccess) zero() bool { return e == EtcdAccess{} }

// Validate returns every problem with the access flags; external says --etcd-endpoints is set.
func (e EtcdAccess) Validate(external bool) []error {
	if !external {
		if !e.zero() {
			return []error{errors.New("--etcd-tls-*, --etcd-username, --etcd-password-file, --etcd-allow-open: only with --etcd-endpoints (the embedded etcd makes its own and is locked)")}
		}
		return nil
	}
	var errs []error
	if (e.CertFile == "") != (e.KeyFile == "") {
		errs = append(errs, errors.New("--etcd-tls-key: --etcd-tls-cert and --etcd-tls-key go together"))
	}
	if (e.Username == "") != (e.PasswordFile == "") {
		errs = append(errs, errors.New("--etcd-password-file: --etcd-username and --etcd-password-file go together"))
	}
	for _, f := range []struct{ flag, path string }{
		{"etcd-tls-ca", e.CAFile}, {"etcd-tls-cert", e.CertFile}, {"etcd-tls-key", e.KeyFile}, {"etcd-password-file", e.PasswordFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.flag, err))
		}
	}
	return errs
}

// clientConfig is the etcd client configuration for endpoints with this access. It warns when the
// connection is plaintext: anyone on the path can read and forge fence records. Whether etcd
// admits other clients is not a question of these flags (etcd ignores a user while its
// authentication is off): Run's checkEtcdLocked asks etcd.
func (e EtcdAccess) clientConfig(endpoints []string, log *slog.Logger) (clientv3.Config, *tlsfiles.Reloader, error) {
	cc := etcdClientConfig(endpoints)
	secure := e.CAFile != "" || e.CertFile != ""
	plain := false
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, "https://") || strings.HasPrefix(ep, "unixs://") {
			secure = true
		} else {
			plain = true
		}
	}
	var certs *tlsfiles.Reloader
	if secure {
		cc.TLS = &tls.Config{MinVersion: tls.VersionTLS12} // the system roots, with no CA file
		if e.CAFile != "" || e.CertFile != "" {
			var err error
			if certs, err = e.reloader(log); err != nil {
				return cc, nil, err
			}
			// The static configuration tells the client the endpoints are TLS; every connection
			// is made with the files as they are then.
			cc.TLS = certs.ClientConfig("", nil)
			cc.DialOptions = append(cc.DialOptions, grpc.WithTransportCredentials(certs.ClientCredentials("", nil)))
		}
	}
	if e.Username != "" {
		f, err := os.Open(e.PasswordFile)
		if err != nil {
			return cc, nil, fmt.Errorf("--etcd-password-file: %w", err)
		}
		buf, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
		f.Close()
		if err != nil {
			return cc, nil, fmt.Errorf("--etcd-password-file: %w", err)
		}
		if len(buf) > maxPasswordFile {
			return cc, nil, fmt.Errorf("--etcd-password-file: longer than %d bytes", maxPasswordFile)
		}
		pw := strings.TrimRight(string(buf), "\r\n")
		if pw == "" {
			return cc, nil, errors.New("--etcd-password-file: empty")
		}
		cc.Username, cc.Password = e.Username, pw
	}
	if plain || cc.TLS == nil {
		log.Warn("etcd connection is plaintext: anyone on the path can read and forge fence records; use https endpoints with --etcd-tls-ca")
	}
	return cc, certs, nil
}

// reloader loads the TLS files of the access, naming the flag of the file that does not load.
func (e EtcdAccess) reloader(log *slog.Logger) (*tlsfiles.Reloader, error) {
	if e.CAFile != "" {
		if _, err := (tlsfiles.Files{CAFile: e.CAFile}).Reloader(); err != nil {
			return nil, fmt.Errorf("--etcd-tls-ca: %w", err)
		}
	}
	r, err := tlsfiles.Files{CertFile: e.CertFile, KeyFile: e.KeyFile, CAFile: e.CAFile}.Watch(log, "the etcd client")
	if err != nil {
		return nil, fmt.Errorf("--etcd-tls-cert: %w", err)
	}
	return r, nil
}

// embeddedAccess is the access the embedded etcd generated.
func embeddedAccess(f etcdembed.Files) EtcdAccess {
	return EtcdAccess{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile, Username: f.Username, PasswordFile: f.PasswordFile}
}

// etcdDialTimeout bounds the etcd client's first connection: generous, since a coordinator that
// starts its embedded etcd on a loaded machine (or an etcd cluster electing a leader) may take
// several seconds to accept one, and a coordinator that gives up only restarts to try again.
const etcdDialTimeout = 15 * time.Second

// etcdClientConfig is the etcd client's configuration: keepalive pings find a connection that a
// partition left dead (etcd refuses pings more often than every 5 s), and every unary call without
// a deadline of its own gets one, so no etcd read or write can block a coordinator for ever.
func etcdClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints: endpoints, DialTimeout: etcdDialTimeout, Logger: zap.NewNop(),
		DialKeepAliveTime: 6 * time.Second, DialKeepAliveTimeout: 3 * time.Second, PermitWithoutStream: true,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if _, ok := ctx.Deadline(); !ok {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, etcdCallTimeout)
					defer cancel()
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	}
}

// etcdCallTimeout is the deadline of an etcd call made without one (listing many records is the
// slowest; the election's own calls have leader.CallTimeout).
const etcdCallTimeout = 10 * time.Second
