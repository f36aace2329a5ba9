package brocade

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// hostKeyError is a refused SSH host key.
type hostKeyError struct {
	host, reason string
}

func (e *hostKeyError) Error() string { return "host key of " + e.host + " refused: " + e.reason }

// pinnedHostKey returns a check that accepts only the pinned key, given as an authorized_keys
// line or a SHA256: fingerprint.
func pinnedHostKey(pinned string) (ssh.HostKeyCallback, error) {
	if strings.HasPrefix(pinned, "SHA256:") {
		return func(host string, _ net.Addr, key ssh.PublicKey) error {
			if got := ssh.FingerprintSHA256(key); got != pinned {
				return &hostKeyError{host, fmt.Sprintf("the switch offered %s, the pinned key is %s (possible man in the middle)", got, pinned)}
			}
			return nil
		}, nil
	}
	want, _, _, _, err := ssh.ParseAuthorizedKey([]byte(pinned))
	if err != nil {
		return nil, fmt.Errorf("must be an authorized_keys line (type and base64 key) or a SHA256: fingerprint: %v", err)
	}
	return func(host string, _ net.Addr, key ssh.PublicKey) error {
		if !bytes.Equal(key.Marshal(), want.Marshal()) {
			return &hostKeyError{host, fmt.Sprintf("the switch offered %s, the pinned key is %s (possible man in the middle)",
				ssh.FingerprintSHA256(key), ssh.FingerprintSHA256(want))}
		}
		return nil
	}, nil
}

// knownHostsMu serialises reading and appending known_hosts files within the process.
var knownHostsMu sync.Mutex

// acceptNew returns a check against the known_hosts file path: a known key is accepted, a host
// with no key is recorded on first use (the file and its directory are created), and a host
// whose key differs from the recorded one is refused.
func acceptNew(path string, log *slog.Logger) ssh.HostKeyCallback {
	return func(host string, remote net.Addr, key ssh.PublicKey) error {
		knownHostsMu.Lock()
		defer knownHostsMu.Unlock()
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return &hostKeyError{host, fmt.Sprintf("cannot create known_hosts directory: %v", err)}
			}
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				return &hostKeyError{host, fmt.Sprintf("cannot create known_hosts file: %v", err)}
			}
		}
		check, err := knownhosts.New(path)
		if err != nil {
			return &hostKeyError{host, fmt.Sprintf("cannot read known_hosts %s: %v", path, err)}
		}
		err = check(host, remote, key)
		var ke *knownhosts.KeyError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ke) && len(ke.Want) == 0:
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				return &hostKeyError{host, fmt.Sprintf("cannot record the new key in %s: %v", path, err)}
			}
			defer f.Close()
			if _, err := fmt.Fprintln(f, knownhosts.Line([]string{knownhosts.Normalize(host)}, key)); err != nil {
				return &hostKeyError{host, fmt.Sprintf("cannot record the new key in %s: %v", path, err)}
			}
			log.Info("brocade: recorded a new switch host key (accept-new)", "switch", host,
				"key", ssh.FingerprintSHA256(key), "known_hosts", path)
			return nil
		case errors.As(err, &ke):
			return &hostKeyError{host, fmt.Sprintf("the switch offered %s, which differs from the key recorded in %s line %d (possible man in the middle; remove the line if the switch was replaced)",
				ssh.FingerprintSHA256(key), path, ke.Want[0].Line)}
		}
		return &hostKeyError{host, err.Error()}
	}
}
