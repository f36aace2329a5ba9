package brocade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nodefence/nodefence/services/fault"
)

// Login conversation patterns, matched at the end of what the switch sent (it is waiting).
var (
	loginRE    = regexp.MustCompile(`(?i)(login|user ?name)\s*:\s*$`)
	passwordRE = regexp.MustCompile(`(?i)(password|pass phrase)\s*:\s*$`)
)

// maxOutput bounds what one command may print before the prompt.
const maxOutput = 1 << 20

// session is one logged-in shell on a switch, used by one operation at a time.
type session struct {
	raw    net.Conn    // the TCP connection; deadlines are set on it for both transports
	ssh    *ssh.Client // nil for telnet
	in     io.Reader   // what the switch sends, telnet commands stripped
	out    io.Writer   // what we type
	eol    string
	prompt *regexp.Regexp
	buf    []byte
	tn     *telnetFilter // nil for SSH
}

// errLoginRefused marks a refused login conversation.
var errLoginRefused = errors.New("the switch refused the user name or password")

// dial opens a session: TCP, then the SSH handshake and shell or the telnet login, then the
// first prompt. Errors wrap fault.ErrUnreachable, fault.ErrUnauthenticated or the context's error.
func dial(ctx context.Context, c *config) (*session, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", c.addr())
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connecting to switch %s: %w", c.addr(), ctx.Err())
		}
		return nil, fmt.Errorf("%w: connecting to switch %s: %v", fault.ErrUnreachable, c.addr(), err)
	}
	s := &session{raw: raw, prompt: regexp.MustCompile(regexp.QuoteMeta(c.prompt) + `\s*$`)}
	stop := s.bind(ctx)
	defer stop()
	if c.ssh {
		err = s.startSSH(ctx, c)
	} else {
		err = s.startTelnet(ctx, c)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// bind applies ctx's deadline to the connection and cuts it short when ctx ends. The returned
// function undoes the binding (the session may be reused by another operation).
func (s *session) bind(ctx context.Context) func() {
	dl, _ := ctx.Deadline()
	_ = s.raw.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = s.raw.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		_ = s.raw.SetDeadline(time.Time{})
	}
}

func (s *session) startTelnet(ctx context.Context, c *config) error {
	s.tn = &telnetFilter{r: s.raw, w: s.raw}
	s.in, s.out, s.eol = s.tn, s.raw, "\r\n"
	if _, _, err := s.expect(ctx, loginRE); err != nil {
		return fmt.Errorf("waiting for the login prompt: %w", err)
	}
	if err := s.send(c.username); err != nil {
		return s.ioError(ctx, "sending the user name", err)
	}
	if _, _, err := s.expect(ctx, passwordRE); err != nil {
		return fmt.Errorf("waiting for the password prompt: %w", err)
	}
	if err := s.send(c.password); err != nil {
		return s.ioError(ctx, "sending the password", err)
	}
	i, _, err := s.expect(ctx, s.prompt, loginRE, passwordRE)
	switch {
	case err != nil:
		return fmt.Errorf("waiting for the prompt after login: %w", err)
	case i != 0:
		return fmt.Errorf("%w: telnet login as %q on switch %s: %w", fault.ErrUnauthenticated, c.username, c.addr(), errLoginRefused)
	}
	return nil
}

func (s *session) startSSH(ctx context.Context, c *config) error {
	var auth []ssh.AuthMethod
	if c.signer != nil {
		auth = append(auth, ssh.PublicKeys(c.signer))
	}
	if c.password != "" {
		pw := c.password
		auth = append(auth, ssh.Password(pw), ssh.KeyboardInteractive(
			func(_, _ string, questions []string, _ []bool) ([]string, error) {
				answers := make([]string, len(questions))
				for i := range answers {
					answers[i] = pw
				}
				return answers, nil
			}))
	}
	conf := &ssh.ClientConfig{User: c.username, Auth: auth, HostKeyCallback: c.hostKeys}
	sc, chans, reqs, err := ssh.NewClientConn(s.raw, c.addr(), conf)
	if err != nil {
		var hk *hostKeyError
		switch {
		case errors.As(err, &hk):
			return fmt.Errorf("%w: SSH to switch %s: %w", fault.ErrUnauthenticated, c.addr(), hk)
		case strings.Contains(err.Error(), "unable to authenticate"):
			return fmt.Errorf("%w: SSH login as %q on switch %s: %w", fault.ErrUnauthenticated, c.username, c.addr(), errLoginRefused)
		}
		return s.ioError(ctx, "SSH handshake", err)
	}
	s.ssh = ssh.NewClient(sc, chans, reqs)
	sess, err := s.ssh.NewSession()
	if err != nil {
		return s.ioError(ctx, "opening an SSH session", err)
	}
	// A wide terminal keeps switchshow rows on one line; the switch may still echo.
	if err := sess.RequestPty("vt100", 500, 512, ssh.TerminalModes{ssh.ECHO: 0}); err != nil {
		return s.ioError(ctx, "requesting a pty", err)
	}
	in, err := sess.StdoutPipe()
	if err != nil {
		return s.ioError(ctx, "reading the shell", err)
	}
	out, err := sess.StdinPipe()
	if err != nil {
		return s.ioError(ctx, "writing to the shell", err)
	}
	if err := sess.Shell(); err != nil {
		return s.ioError(ctx, "starting the shell", err)
	}
	s.in, s.out, s.eol = in, out, "\n"
	if _, _, err := s.expect(ctx, s.prompt); err != nil {
		return fmt.Errorf("waiting for the first prompt: %w", err)
	}
	return nil
}

// ioError classifies a failed read or write: the context's end, a timeout (the switch stopped
// answering), or an unreachable switch.
func (s *session) ioError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: the switch did not answer in time: %w", what, ctx.Err())
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: the switch did not answer in time: %w", what, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: %s: %v", fault.ErrUnreachable, what, err)
}

func (s *session) send(line string) error {
	_, err := io.WriteString(s.out, line+s.eol)
	return err
}

// expect reads until the end of what the switch sent matches one of res, and returns the index
// of the pattern and the text before the match. The buffer is consumed.
func (s *session) expect(ctx context.Context, res ...*regexp.Regexp) (int, string, error) {
	chunk := make([]byte, 4096)
	for {
		for i, re := range res {
			if loc := re.FindIndex(s.buf); loc != nil {
				before := string(s.buf[:loc[0]])
				s.buf = s.buf[:0]
				return i, before, nil
			}
		}
		if len(s.buf) > maxOutput {
			return -1, "", fmt.Errorf("%w: more than %d bytes without a prompt", fault.ErrDevice, maxOutput)
		}
		n, err := s.in.Read(chunk)
		s.buf = append(s.buf, chunk[:n]...)
		if err != nil && n == 0 {
			return -1, "", s.ioError(ctx, "reading from the switch", err)
		}
	}
}

// command runs one command and returns its output without the echoed command line, with "\n"
// line ends.
func (s *session) command(ctx context.Context, cmd string) (string, error) {
	stop := s.bind(ctx)
	defer stop()
	if err := s.send(cmd); err != nil {
		return "", s.ioError(ctx, "sending "+cmd, err)
	}
	_, out, err := s.expect(ctx, s.prompt)
	if err != nil {
		return "", fmt.Errorf("%s: %w", cmd, err)
	}
	out = strings.ReplaceAll(out, "\r", "")
	if first, rest, ok := strings.Cut(out, "\n"); ok && strings.TrimSpace(first) == cmd {
		out = rest
	} else if !ok && strings.TrimSpace(out) == cmd {
		out = ""
	}
	// The prompt line's own prefix (e.g. "sw0:admin") ends the output.
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[:i+1]
	} else {
		out = ""
	}
	return out, nil
}

// close logs out (best effort, without waiting) and closes the connection.
func (s *session) close() {
	if s.out != nil {
		_ = s.raw.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_ = s.send("exit")
	}
	if s.ssh != nil {
		_ = s.ssh.Close()
	}
	_ = s.raw.Close()
}

// Telnet protocol bytes (RFC 854).
const (
	tnIAC  = 255
	tnDONT = 254
	tnDO   = 253
	tnWONT = 252
	tnWILL = 251
	tnSB   = 250
	tnSE   = 240
)

// telnetFilter strips telnet commands from the switch's output and refuses every option the
// switch offers or asks for, so the connection stays a plain NVT (the switch does not echo).
type telnetFilter struct {
	r       io.Reader
	w       io.Writer
	state   int // 0 data, 1 after IAC, 2 after IAC verb, 3 in SB, 4 in SB after IAC
	verb    byte
	replies bytes.Buffer
}

func (t *telnetFilter) Read(p []byte) (int, error) {
	raw := make([]byte, len(p))
	for {
		n, err := t.r.Read(raw)
		out := 0
		for _, c := range raw[:n] {
			switch t.state {
			case 0:
				if c == tnIAC {
					t.state = 1
					continue
				}
				p[out] = c
				out++
			case 1:
				switch c {
				case tnIAC:
					p[out] = c
					out++
					t.state = 0
				case tnDO, tnDONT, tnWILL, tnWONT:
					t.verb, t.state = c, 2
				case tnSB:
					t.state = 3
				default:
					t.state = 0
				}
			case 2:
				switch t.verb {
				case tnDO:
					t.replies.Write([]byte{tnIAC, tnWONT, c})
				case tnWILL:
					t.replies.Write([]byte{tnIAC, tnDONT, c})
				}
				t.state = 0
			case 3:
				if c == tnIAC {
					t.state = 4
				}
			case 4:
				if c == tnSE {
					t.state = 0
				} else {
					t.state = 3
				}
			}
		}
		if t.replies.Len() > 0 {
			if _, werr := t.w.Write(t.replies.Bytes()); werr != nil && err == nil {
				err = werr
			}
			t.replies.Reset()
		}
		if out > 0 || err != nil {
			return out, err
		}
	}
}
