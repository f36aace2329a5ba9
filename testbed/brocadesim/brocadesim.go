// Package brocadesim is a Brocade Fibre Channel switch simulator for tests and demos: a Fabric OS
// command shell over telnet and SSH on 127.0.0.1, with N ports whose enabled or disabled state is
// kept, and failure hooks.
//
// It speaks what ClusterLabs fence_brocade and nodefence's brocade driver use: the login
// conversation (`<switch> login: `, `Password: `, a banner, then the `<switch>:<user>> ` prompt),
// `switchshow`, `portCfgPersistentDisable N`, `portCfgPersistentEnable N` and `exit` (commands are
// case-insensitive, as on Fabric OS). Telnet option negotiation is answered (refused) and stripped;
// SSH takes password authentication and accepts pty-req, env, shell and exec requests.
//
// The simulator fails by default: it refuses every login unless configured with a user and
// password, answers unknown commands with an error, and has no port it was not told about.
package brocadesim

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
)

// Fault is a failure mode of one switch port.
type Fault int

const (
	// FaultNone is a healthy port.
	FaultNone Fault = iota
	// FaultStuck accepts portCfgPersistentDisable/Enable silently but never changes state: the
	// port that won't disable.
	FaultStuck
	// FaultCommandError answers portCfgPersistentDisable/Enable with an error and changes nothing.
	FaultCommandError
	// FaultFlapping shows the port alternately enabled and disabled in successive switchshows.
	FaultFlapping
)

// String names the fault.
func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultStuck:
		return "stuck"
	case FaultCommandError:
		return "command error"
	case FaultFlapping:
		return "flapping"
	}
	return "Fault(" + strconv.Itoa(int(f)) + ")"
}

// Config configures a switch. User and Password are required: a switch without them refuses
// every login.
type Config struct {
	// Name is the switch name shown in prompts and switchshow. Default "sw0".
	Name string
	// Ports is the number of ports, indexed 0..Ports-1. Default 16.
	Ports int
	// User and Password are the only credentials accepted (telnet and SSH).
	User, Password string
	// HostKey is the SSH host key. Default: a fresh ed25519 key.
	HostKey ssh.Signer
	// Log receives connection and command lines. Default: discarded.
	Log *slog.Logger
}

// port is one switch port's state.
type port struct {
	disabled bool
	fault    Fault
	shown    int // switchshows so far, for FaultFlapping
}

// Switch is one running simulated switch.
type Switch struct {
	cfg     Config
	telnet  net.Listener
	sshLn   net.Listener
	sshConf *ssh.ServerConfig

	mu       sync.Mutex
	ports    []port
	hang     bool
	commands []string
	logins   int
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// Start starts a switch listening for telnet and SSH on two free ports of 127.0.0.1.
func Start(cfg Config) (*Switch, error) {
	if cfg.Name == "" {
		cfg.Name = "sw0"
	}
	if cfg.Ports == 0 {
		cfg.Ports = 16
	}
	if cfg.Ports < 1 || cfg.Ports > 512 {
		return nil, fmt.Errorf("brocadesim: Ports must be 1-512, got %d", cfg.Ports)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.HostKey == nil {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		if cfg.HostKey, err = ssh.NewSignerFromKey(priv); err != nil {
			return nil, err
		}
	}
	s := &Switch{cfg: cfg, ports: make([]port, cfg.Ports), conns: map[net.Conn]struct{}{}}
	s.sshConf = &ssh.ServerConfig{
		PasswordCallback: func(c ssh.ConnMetadata, pw []byte) (*ssh.Permissions, error) {
			if !s.credentialsOK(c.User(), string(pw)) {
				return nil, errors.New("permission denied")
			}
			return nil, nil
		},
		ServerVersion: "SSH-2.0-OpenSSH_7.4",
	}
	s.sshConf.AddHostKey(cfg.HostKey)
	var err error
	if s.telnet, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	if s.sshLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		s.telnet.Close()
		return nil, err
	}
	s.wg.Add(2)
	go s.accept(s.telnet, s.serveTelnet)
	go s.accept(s.sshLn, s.serveSSH)
	return s, nil
}

// TelnetPort is the telnet port on 127.0.0.1.
func (s *Switch) TelnetPort() int { return s.telnet.Addr().(*net.TCPAddr).Port }

// SSHPort is the SSH port on 127.0.0.1.
func (s *Switch) SSHPort() int { return s.sshLn.Addr().(*net.TCPAddr).Port }

// HostKey is the switch's SSH public host key.
func (s *Switch) HostKey() ssh.PublicKey { return s.cfg.HostKey.PublicKey() }

// Close stops listening and drops every connection.
func (s *Switch) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := errors.Join(s.telnet.Close(), s.sshLn.Close())
	s.wg.Wait()
	return err
}

// Disabled reports whether port n is disabled (its true state, whatever the faults).
func (s *Switch) Disabled(n int) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 || n >= len(s.ports) {
		return false, fmt.Errorf("brocadesim: no port %d", n)
	}
	return s.ports[n].disabled, nil
}

// SetDisabled sets port n's state directly.
func (s *Switch) SetDisabled(n int, disabled bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 || n >= len(s.ports) {
		return fmt.Errorf("brocadesim: no port %d", n)
	}
	s.ports[n].disabled = disabled
	return nil
}

// SetFault sets port n's failure mode; FaultNone clears it.
func (s *Switch) SetFault(n int, f Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 || n >= len(s.ports) {
		return fmt.Errorf("brocadesim: no port %d", n)
	}
	s.ports[n].fault = f
	return nil
}

// SetHang makes the switch accept connections and never answer (hang true), or answer again.
// Connections already logged in are not affected.
func (s *Switch) SetHang(hang bool) {
	s.mu.Lock()
	s.hang = hang
	s.mu.Unlock()
}

// Commands returns the commands received so far, oldest first, as typed.
func (s *Switch) Commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.commands...)
}

// Logins returns the number of successful logins so far.
func (s *Switch) Logins() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logins
}

func (s *Switch) credentialsOK(user, password string) bool {
	ok := s.cfg.User != "" && s.cfg.Password != "" && user == s.cfg.User && password == s.cfg.Password
	if ok {
		s.mu.Lock()
		s.logins++
		s.mu.Unlock()
	}
	return ok
}

func (s *Switch) accept(ln net.Listener, serve func(net.Conn)) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		hang := s.hang
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			if hang {
				_, _ = io.Copy(io.Discard, c) // read forever, answer nothing
				return
			}
			serve(c)
		}()
	}
}

// serveSSH runs one SSH connection: password auth, then sessions with a shell or an exec.
func (s *Switch) serveSSH(c net.Conn) {
	sc, chans, reqs, err := ssh.NewServerConn(c, s.sshConf)
	if err != nil {
		s.cfg.Log.Debug("ssh handshake failed", "err", err)
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		go s.serveSession(sc.User(), ch, creqs)
	}
}

func (s *Switch) serveSession(user string, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	pty := false
	for req := range reqs {
		switch req.Type {
		case "pty-req":
			pty = true
			_ = req.Reply(true, nil)
		case "env", "window-change":
			_ = req.Reply(true, nil)
		case "shell":
			_ = req.Reply(true, nil)
			go func() {
				for r := range reqs {
					_ = r.Reply(r.Type == "window-change", nil)
				}
			}()
			s.shell(user, ch, &liner{r: bufio.NewReader(ch), w: ch, echo: pty})
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
			return
		case "exec":
			var cmd struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &cmd); err != nil {
				_ = req.Reply(false, nil)
				return
			}
			_ = req.Reply(true, nil)
			out, _ := s.run(cmd.Command)
			_, _ = io.WriteString(ch, out)
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
			return
		default:
			_ = req.Reply(false, nil)
		}
	}
}

// lineReader is where the shell reads typed bytes from.
type lineReader interface {
	ReadByte() (byte, error)
}

// liner reads typed lines ended by "\r\n", "\r\0", "\r" or "\n" without reading ahead (a
// client that ends lines with a bare CR must not block the shell).
type liner struct {
	r       lineReader
	w       io.Writer
	echo    bool // write typed characters back, as a pty in cooked mode does
	afterCR bool
}

func (l *liner) readLine() (string, error) {
	var b strings.Builder
	for {
		c, err := l.r.ReadByte()
		if err != nil {
			return b.String(), err
		}
		wasCR := l.afterCR
		l.afterCR = false
		switch c {
		case '\n', 0:
			if wasCR {
				continue
			}
			if c == 0 {
				continue
			}
			fallthrough
		case '\r':
			l.afterCR = c == '\r'
			if l.echo {
				_, _ = io.WriteString(l.w, "\r\n")
			}
			return b.String(), nil
		default:
			if l.echo {
				_, _ = l.w.Write([]byte{c})
			}
			b.WriteByte(c)
		}
	}
}

// shell runs the command loop of a logged-in user until exit or EOF.
func (s *Switch) shell(user string, w io.Writer, l *liner) {
	prompt := s.cfg.Name + ":" + user + "> "
	banner := "\r\n" + strings.Repeat("-", 64) + "\r\n" +
		"WARNING: The default password of 'admin' and 'user' accounts have not been changed.\r\n" +
		strings.Repeat("-", 64) + "\r\n"
	if _, err := io.WriteString(l.w, banner+prompt); err != nil {
		return
	}
	for {
		line, err := l.readLine()
		if err != nil {
			return
		}
		out, exit := s.run(line)
		if exit {
			return
		}
		if _, err := io.WriteString(l.w, out+prompt); err != nil {
			return
		}
	}
}

// run executes one command line and returns its output ("\r\n" line ends) and whether the
// session ends.
func (s *Switch) run(line string) (out string, exit bool) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commands = append(s.commands, strings.TrimSpace(line))
	s.cfg.Log.Debug("command", "line", line)
	switch cmd := strings.ToLower(fields[0]); cmd {
	case "exit", "logout":
		return "", true
	case "switchshow":
		return s.switchshowLocked(), false
	case "portcfgpersistentdisable", "portcfgpersistentenable":
		if len(fields) != 2 {
			return "Usage: " + fields[0] + " [slot/]port\r\n", false
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil || n < 0 || n >= len(s.ports) {
			return "Invalid port number or port not supported\r\n", false
		}
		p := &s.ports[n]
		switch p.fault {
		case FaultStuck:
			return "", false
		case FaultCommandError:
			return "error: port " + fields[1] + " is locked by another configuration session\r\n", false
		}
		p.disabled = cmd == "portcfgpersistentdisable"
		return "", false
	default:
		return "rbash: " + fields[0] + ": command not found\r\n", false
	}
}

// switchshowLocked renders switchshow: the switch summary, then one row per port. A disabled
// port's row has "Disabled (Persistent)" after its Proto column.
func (s *Switch) switchshowLocked() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\r\n", args...) }
	w("switchName:\t%s", s.cfg.Name)
	w("switchType:\t71.2")
	w("switchState:\tOnline")
	w("switchMode:\tNative")
	w("switchRole:\tPrincipal")
	w("switchDomain:\t1")
	w("switchId:\tfffc01")
	w("switchWwn:\t10:00:00:05:1e:00:00:01")
	w("zoning:\t\tOFF")
	w("switchBeacon:\tOFF")
	w("")
	w("Index Port Address Media Speed State     Proto")
	w("==============================================")
	for i := range s.ports {
		p := &s.ports[i]
		disabled := p.disabled
		if p.fault == FaultFlapping {
			disabled = p.shown%2 == 1
			p.shown++
		}
		if disabled {
			w("%5d %4d   01%02x00   id    N8   No_Light    FC  Disabled (Persistent)", i, i, i)
		} else {
			w("%5d %4d   01%02x00   id    N8   Online      FC  F-Port  10:00:00:00:c9:00:%02x:%02x", i, i, i, i/256, i%256)
		}
	}
	return b.String()
}
