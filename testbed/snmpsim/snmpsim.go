// Package snmpsim runs a real snmpsim (Debian package snmpsim) serving simulated switched PDUs on
// 127.0.0.1, for tests and benchmarks of SNMP fence drivers.
//
// One snmpsimd process hosts one SNMP engine per device profile, each on its own UDP port. The
// outlets are served by an embedded variation module (variation/pdu.py) that links the control
// and status OIDs of an outlet: a SET on the control OID changes what the status OIDs return.
// Each outlet's state lives in its own JSON file, which a test can read (the true state,
// independently of SNMP) and write (presets and fault hooks: stuck, error, drop, flap).
//
// Credentials: community "private" is read-write and "public" read-only (SETs get noAccess); any
// other community gets no answer. SNMPv3 users (empty context): see the User constants.
package snmpsim

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/procs"

	"github.com/gosnmp/gosnmp"
)

// Profile names a simulated PDU model.
type Profile string

// The simulated PDU models.
const (
	// APCMasterSwitch is an APC MasterSwitch (PowerNet-MIB sPDUOutletControlTable only).
	APCMasterSwitch Profile = "apc-ms"
	// APCRPDU is an APC AP79xx rack PDU (rPDU tables).
	APCRPDU Profile = "apc-rpdu"
	// APCRPDU2 is an APC AP8xxx rack PDU (rPDU2 tables, status values reversed).
	APCRPDU2 Profile = "apc-rpdu2"
	// EatonG3 is an Eaton ePDU G2/G3 (EATON-EPDU-MIB).
	EatonG3 Profile = "eaton-g3"
	// EatonManaged is an old Eaton (Powerware) Managed ePDU (EATON-EPDU-MA-MIB).
	EatonManaged Profile = "eaton-ma"
	// Pulizzi is an Eaton Switched ePDU, formerly Pulizzi (EATON-EPDU-PU-SW-MIB).
	Pulizzi Profile = "eaton-pulizzi"
)

// Profiles lists every profile, in port order.
var Profiles = []Profile{APCMasterSwitch, APCRPDU, APCRPDU2, EatonG3, EatonManaged, Pulizzi}

// ObjectIDs are the sysObjectID values the profiles report.
var ObjectIDs = map[Profile]string{
	APCMasterSwitch: "1.3.6.1.4.1.318.1.3.4.2",
	APCRPDU:         "1.3.6.1.4.1.318.1.3.4.5",
	APCRPDU2:        "1.3.6.1.4.1.318.1.3.4.6",
	EatonG3:         "1.3.6.1.4.1.534.6.6.7",
	EatonManaged:    "1.3.6.1.4.1.534.6.6.6",
	Pulizzi:         "1.3.6.1.4.1.20677.1",
}

// Credentials of the simulated agents.
const (
	// CommunityRW is the read-write community of SNMP v1 and v2c.
	CommunityRW = "private"
	// CommunityRO is the read-only community: SETs are refused with noAccess.
	CommunityRO = "public"
	// UserAuthPriv is an authPriv user: SHA with AuthPass, AES-128 with PrivPass.
	UserAuthPriv = "fence"
	// UserAuthPriv256 is an authPriv user: SHA-256 with AuthPass, AES-256 (Blumenthal key
	// extension, as net-snmp and gosnmp's AES256) with PrivPass.
	UserAuthPriv256 = "fence256"
	// UserAuthNoPriv is an authNoPriv user: SHA with AuthPass.
	UserAuthNoPriv = "fenceauth"
	// UserNoAuth is a noAuthNoPriv user.
	UserNoAuth = "fencenone"
	// AuthPass is the authentication passphrase of the v3 users.
	AuthPass = "authpass123"
	// PrivPass is the privacy passphrase of the v3 users.
	PrivPass = "privpass123"
)

//go:embed variation/pdu.py
var variationModule []byte

// startTimeout bounds how long Start waits for snmpsimd to answer.
const startTimeout = 30 * time.Second

// Config says what to simulate.
type Config struct {
	// Outlets is the number of outlets of every PDU. Default 8.
	Outlets int
	// RebootSeconds is how long an outlet stays off during a device-side reboot. Default 5.
	RebootSeconds int
	// Log keeps snmpsimd's log in Dir/snmpsimd.log; by default logging is off (it is slow).
	Log bool
}

// Sim is a running snmpsimd.
type Sim struct {
	// Dir is the simulator's directory (data, state, logs); Stop removes it.
	Dir string
	// Outlets is the number of outlets of every PDU.
	Outlets int

	ports  map[Profile]int
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start writes the data files into a new directory and starts snmpsimd on 127.0.0.1, one free UDP
// port per profile. It returns once every engine answers. Every outlet starts on.
func Start(cfg Config) (*Sim, error) {
	if _, err := exec.LookPath("snmpsimd"); err != nil {
		return nil, fmt.Errorf("snmpsimd not installed (Debian package snmpsim): %w", err)
	}
	if cfg.Outlets == 0 {
		cfg.Outlets = 8
	}
	if cfg.RebootSeconds == 0 {
		cfg.RebootSeconds = 5
	}
	if cfg.Outlets < 1 || cfg.Outlets > 256 {
		return nil, fmt.Errorf("snmpsim: Outlets must be 1-256, got %d", cfg.Outlets)
	}
	// Its own directory under the system temp dir: snmpsimd runs as nobody, which must be able
	// to traverse every parent (a test's TempDir is private to root).
	dir, err := os.MkdirTemp("", "snmpsim-")
	if err != nil {
		return nil, err
	}
	s := &Sim{Dir: dir, Outlets: cfg.Outlets}
	var lastErr error
	for range 3 { // a picked port can be taken by someone else before snmpsimd binds it
		if lastErr = s.start(cfg); lastErr == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// Port is the UDP port on 127.0.0.1 of profile p's engine.
func (s *Sim) Port(p Profile) int { return s.ports[p] }

// Addr is "127.0.0.1:port" of profile p's engine.
func (s *Sim) Addr(p Profile) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.ports[p])) }

// PID is the process id of snmpsimd.
func (s *Sim) PID() int { return s.cmd.Process.Pid }

func (s *Sim) stateDir() string { return filepath.Join(s.Dir, "state") }

func (s *Sim) writeFiles(cfg Config) error {
	for _, d := range []string{s.Dir, s.stateDir(), filepath.Join(s.Dir, "cache"), filepath.Join(s.Dir, "variation")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "variation", "pdu.py"), variationModule, 0o644); err != nil {
		return err
	}
	for _, p := range Profiles {
		d := filepath.Join(s.Dir, "data", string(p))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		recs := records(p, cfg.Outlets)
		if err := os.WriteFile(filepath.Join(d, CommunityRW+".snmprec"), []byte(snmprec(recs, false)), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, CommunityRO+".snmprec"), []byte(snmprec(recs, true)), 0o644); err != nil {
			return err
		}
		// snmpsim serves an SNMPv3 request with the empty context arriving on the engine's K-th
		// endpoint from 1.3.6.1.6.1.1.K.snmprec.
		for k := range 10 {
			link := filepath.Join(d, fmt.Sprintf("1.3.6.1.6.1.1.%d.snmprec", k))
			_ = os.Remove(link)
			if err := os.Symlink(CommunityRW+".snmprec", link); err != nil {
				return err
			}
		}
	}
	return nil
}

// nobody returns the credential snmpsimd runs with when we are root (it refuses to run as root).
func nobody() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, err
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(g.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(root string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	})
}

func (s *Sim) start(cfg Config) error {
	if err := s.writeFiles(cfg); err != nil {
		return err
	}
	cred, err := nobody()
	if err != nil {
		return fmt.Errorf("snmpsim: user to run snmpsimd as: %w", err)
	}
	if err := chownTree(s.Dir, cred); err != nil {
		return err
	}
	logging := "null"
	if cfg.Log {
		logging = "file:" + filepath.Join(s.Dir, "snmpsimd.log")
	}
	args := []string{
		"--cache-dir=" + filepath.Join(s.Dir, "cache"),
		"--variation-modules-dir=" + filepath.Join(s.Dir, "variation"),
		fmt.Sprintf("--variation-module-options=pdu:statedir=%s,reboot=%d", s.stateDir(), cfg.RebootSeconds),
		"--logging-method=" + logging,
	}
	s.ports = map[Profile]int{}
	for i, p := range Profiles {
		port, err := freeUDPPort()
		if err != nil {
			return err
		}
		s.ports[p] = port
		// Option order matters: the data dir, users and endpoint apply to the engine before them.
		args = append(args,
			fmt.Sprintf("--v3-engine-id=80000000010203040506%02x", i),
			"--data-dir="+filepath.Join(s.Dir, "data", string(p)),
			"--v3-user="+UserAuthPriv, "--v3-auth-proto=SHA", "--v3-auth-key="+AuthPass,
			"--v3-priv-proto=AES", "--v3-priv-key="+PrivPass,
			"--v3-user="+UserAuthPriv256, "--v3-auth-proto=SHA256", "--v3-auth-key="+AuthPass,
			"--v3-priv-proto=AES256BLMT", "--v3-priv-key="+PrivPass,
			"--v3-user="+UserAuthNoPriv, "--v3-auth-proto=SHA", "--v3-auth-key="+AuthPass,
			"--v3-user="+UserNoAuth,
			"--agent-udpv4-endpoint="+net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	out, err := os.OpenFile(filepath.Join(s.Dir, "snmpsimd.out"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command("snmpsimd", args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = out, out
	// Run as nobody from the start (not with --process-user, whose setuid would clear the
	// parent-death signal): the simulator must not outlive a test binary that dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start snmpsimd: %w", err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()

	deadline := time.Now().Add(startTimeout)
	for _, p := range Profiles {
		for {
			select {
			case <-s.exited:
				msg, _ := os.ReadFile(filepath.Join(s.Dir, "snmpsimd.out"))
				return fmt.Errorf("snmpsimd exited at start: %s", lastLines(string(msg), 5))
			default:
			}
			if s.answers(p) {
				break
			}
			if time.Now().After(deadline) {
				_ = s.kill()
				return fmt.Errorf("snmpsimd did not answer on %s within %s", s.Addr(p), startTimeout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// answers reports whether profile p's engine answers a v2c GET of sysObjectID.
func (s *Sim) answers(p Profile) bool {
	g := &gosnmp.GoSNMP{Target: "127.0.0.1", Port: uint16(s.ports[p]), Community: CommunityRO,
		Version: gosnmp.Version2c, Timeout: 200 * time.Millisecond, Retries: 0, Context: context.Background()}
	if err := g.Connect(); err != nil {
		return false
	}
	defer g.Conn.Close()
	r, err := g.Get([]string{".1.3.6.1.2.1.1.2.0"})
	return err == nil && len(r.Variables) == 1 && r.Variables[0].Type == gosnmp.ObjectIdentifier
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Stop kills snmpsimd by its PID (SIGTERM, then SIGKILL after 3 s), reaps it and removes Dir.
func (s *Sim) Stop() error {
	err := s.kill()
	if rerr := os.RemoveAll(s.Dir); err == nil {
		err = rerr
	}
	return err
}

func (s *Sim) kill() error {
	return procs.Terminate(s.cmd, s.exited, 3*time.Second, "snmpsimd")
}

// Outlet is the simulator's record of one outlet: its state and fault hooks.
type Outlet struct {
	// State is "on" or "off"; empty means the default, on.
	State string `json:"state,omitempty"`
	// Stuck makes SETs succeed without changing anything.
	Stuck bool `json:"stuck,omitempty"`
	// Error makes SETs fail with this SNMP error (commitFailed, noAccess, wrongValue, ...).
	Error string `json:"error,omitempty"`
	// Drop makes the simulator ignore every request touching the outlet.
	Drop bool `json:"drop,omitempty"`
	// Flap makes status reads alternate on, off, on, ... and SETs change nothing.
	Flap bool `json:"flap,omitempty"`
	// Pending is a scheduled change (a delayed command or the second half of a reboot),
	// kept as the simulator wrote it.
	Pending *Pending `json:"pending,omitempty"`
	// Flaps counts the status reads answered while flapping.
	Flaps int `json:"flaps,omitempty"`
}

// Pending is a change the simulator will apply at a Unix time.
type Pending struct {
	Kind string   `json:"kind"`
	To   string   `json:"to"`
	At   float64  `json:"at"`
	Then *Pending `json:"then,omitempty"`
}

func (s *Sim) outletPath(p Profile, n int) string {
	return filepath.Join(s.stateDir(), fmt.Sprintf("%s_%d.json", p, n))
}

// Outlet reads outlet n of profile p from the state file, independently of SNMP. Scheduled
// changes that are due are applied, as the simulator would on its next request.
func (s *Sim) Outlet(p Profile, n int) (Outlet, error) {
	var o Outlet
	data, err := os.ReadFile(s.outletPath(p, n))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return o, err
	}
	if err == nil {
		if err := json.Unmarshal(data, &o); err != nil {
			return o, fmt.Errorf("outlet %s/%d: %w", p, n, err)
		}
	}
	if o.State == "" {
		o.State = "on"
	}
	now := float64(time.Now().UnixNano()) / 1e9
	for o.Pending != nil && now >= o.Pending.At {
		o.State, o.Pending = o.Pending.To, o.Pending.Then
	}
	return o, nil
}

// On reads whether outlet n of profile p is on, independently of SNMP.
func (s *Sim) On(p Profile, n int) (bool, error) {
	o, err := s.Outlet(p, n)
	if err != nil {
		return false, err
	}
	switch o.State {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("outlet %s/%d has state %q", p, n, o.State)
}

// SetOutlet replaces outlet n's record (state and fault hooks) atomically. Write it only while no
// request to that outlet is in flight: the simulator rewrites the file on every SET.
func (s *Sim) SetOutlet(p Profile, n int, o Outlet) error {
	if n < 1 || n > s.Outlets {
		return fmt.Errorf("outlet %d: the PDUs have outlets 1-%d", n, s.Outlets)
	}
	data, err := json.Marshal(o)
	if err != nil {
		return err
	}
	path := s.outletPath(p, n)
	tmp := path + ".test.tmp"
	if err := os.WriteFile(tmp, data, 0o666); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o666); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func freeUDPPort() (int, error) {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).Port, nil
}
