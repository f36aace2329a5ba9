// Package ipmisim runs real OpenIPMI ipmi_sim BMCs on 127.0.0.1 for tests and demos.
//
// Each BMC is one ipmi_sim process with its own directory holding a generated lan.conf, an emulator
// command file and a chassis_control shell script. The script keeps the power state in a state file
// (default: on) and logs every call, so a test can check what the device was asked to do, inject
// faults (fail, stuck, delay) and read the power state independently of the code under test. The
// BMC speaks IPMI v2.0 (lanplus); clients must use cipher suite 3 — this ipmi_sim build does not
// answer cipher-suite discovery, so auto-negotiating clients stall.
package ipmisim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodefence/nodefence/testbed/procs"
)

// Fault is a failure mode of the simulated chassis control.
type Fault int

const (
	// FaultNone makes the chassis behave normally.
	FaultNone Fault = iota
	// FaultFail makes every chassis call fail: the BMC answers completion code 0xff.
	FaultFail
	// FaultStuck makes power changes accepted but never applied: the state stays as it is.
	FaultStuck
	// FaultFlap makes the power state read alternately on and off, whatever the state file
	// says; power changes are accepted and not applied.
	FaultFlap
)

// String names the fault.
func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultFail:
		return "fail"
	case FaultStuck:
		return "stuck"
	case FaultFlap:
		return "flap"
	}
	return "Fault(" + strconv.Itoa(int(f)) + ")"
}

// startTimeout bounds how long Start waits for ipmi_sim to bind its port.
const startTimeout = 10 * time.Second

// BMC is one running ipmi_sim process.
type BMC struct {
	// Port is the UDP port on 127.0.0.1 the BMC listens on.
	Port int
	// User and Password are the credentials of the BMC's administrator user.
	User, Password string
	// Dir is the BMC's directory (configuration, state and logs).
	Dir string

	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
	netns  string        // the network namespace it runs in ("": the caller's)
}

// Start writes the BMC's files into dir and starts ipmi_sim on 127.0.0.1:port (port 0 picks a free
// port). It returns once the process has bound the port. The power state starts on.
func Start(dir string, port int, user, password string) (*BMC, error) {
	return StartIn("", dir, port, user, password)
}

// StartIn is Start inside the network namespace netns (by its ip-netns name; "" is the caller's), whose
// 127.0.0.1 it binds. port must be given when netns is set.
func StartIn(netns, dir string, port int, user, password string) (*BMC, error) {
	if netns != "" && port == 0 {
		return nil, errors.New("port: required inside a network namespace")
	}
	if _, err := exec.LookPath("ipmi_sim"); err != nil {
		return nil, fmt.Errorf("ipmi_sim not installed (Debian package openipmi): %w", err)
	}
	if user == "" || len(user) > 16 {
		return nil, fmt.Errorf("user %q: must be 1 to 16 characters", user)
	}
	if len(password) > 20 {
		return nil, errors.New("password: at most 20 characters")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	attempts := 1
	if port == 0 {
		attempts = 5 // a picked port can be taken by someone else before ipmi_sim binds it
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		p := port
		if p == 0 {
			if p, err = freeUDPPort(); err != nil {
				return nil, err
			}
		}
		b := &BMC{Port: p, User: user, Password: password, Dir: abs, netns: netns}
		if err := b.writeFiles(); err != nil {
			return nil, err
		}
		if lastErr = b.start(); lastErr == nil {
			return b, nil
		}
	}
	return nil, lastErr
}

// Addr is the BMC's address, 127.0.0.1:Port.
func (b *BMC) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

func (b *BMC) stateDir() string          { return filepath.Join(b.Dir, "state") }
func (b *BMC) statePath(n string) string { return filepath.Join(b.Dir, "state", n) }

func (b *BMC) writeFiles() error {
	for _, d := range []string{b.Dir, b.stateDir(), filepath.Join(b.Dir, "persist")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	script := filepath.Join(b.Dir, "chassis-control.sh")
	files := []struct {
		path string
		data string
		mode os.FileMode
	}{
		{script, chassisScript, 0o755},
		{filepath.Join(b.Dir, "sim.emu"), emuFile, 0o644},
		{filepath.Join(b.Dir, "lan.conf"), lanConf(b.Port, b.User, b.Password, script, b.stateDir()), 0o600},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, []byte(f.data), f.mode); err != nil {
			return err
		}
	}
	if _, err := os.Stat(b.statePath("power")); errors.Is(err, os.ErrNotExist) {
		return b.SetPower(true)
	}
	return nil
}

func (b *BMC) start() error {
	out, err := os.OpenFile(filepath.Join(b.Dir, "sim.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	args := []string{"ipmi_sim", "-n",
		"-c", filepath.Join(b.Dir, "lan.conf"),
		"-f", filepath.Join(b.Dir, "sim.emu"),
		"-s", filepath.Join(b.Dir, "persist")}
	if b.netns != "" {
		args = append([]string{"nsenter", "--net=/run/netns/" + b.netns, "--"}, args...) // nsenter execs ipmi_sim: same PID
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = out, out
	// The simulator must not outlive a test binary that dies without calling Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start ipmi_sim: %w", err)
	}
	b.cmd = cmd
	b.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(b.exited) }()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-b.exited:
			msg, _ := os.ReadFile(filepath.Join(b.Dir, "sim.out"))
			return fmt.Errorf("ipmi_sim for 127.0.0.1:%d exited at start: %s", b.Port, strings.TrimSpace(string(msg)))
		default:
		}
		bound, err := udpBound(fmt.Sprintf("/proc/%d/net/udp", cmd.Process.Pid), b.Port)
		if err != nil {
			_ = b.Stop()
			return err
		}
		if bound {
			return nil
		}
		if time.Now().After(deadline) {
			_ = b.Stop()
			return fmt.Errorf("ipmi_sim did not bind 127.0.0.1:%d within %s", b.Port, startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the simulator by its PID (SIGTERM, then SIGKILL after 3 s) and reaps it. Stopping a
// stopped BMC is a no-op.
func (b *BMC) Stop() error {
	return procs.Terminate(b.cmd, b.exited, 3*time.Second, "ipmi_sim")
}

// Power reads the power state from the state file, independently of IPMI.
func (b *BMC) Power() (on bool, err error) {
	data, err := os.ReadFile(b.statePath("power"))
	if err != nil {
		return false, err
	}
	switch v := strings.TrimSpace(string(data)); v {
	case "1":
		return true, nil
	case "0":
		return false, nil
	default:
		return false, fmt.Errorf("power state file holds %q", v)
	}
}

// SetPower sets the power state directly in the state file.
func (b *BMC) SetPower(on bool) error {
	v := "0\n"
	if on {
		v = "1\n"
	}
	return writeAtomic(b.statePath("power"), v)
}

// SetFault sets the chassis failure mode; FaultNone clears it.
func (b *BMC) SetFault(f Fault) error {
	want := map[Fault]string{FaultFail: "fail", FaultStuck: "stuck", FaultFlap: "flap"}
	if _, ok := want[f]; !ok && f != FaultNone {
		return fmt.Errorf("unknown fault %v", f)
	}
	for fault, name := range want {
		var err error
		if fault == f {
			err = writeAtomic(b.statePath(name), "1\n")
		} else if err = os.Remove(b.statePath(name)); errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// SetDelay makes every chassis call take d longer (a slow BMC; ipmi_sim is single-threaded, so the
// whole BMC stalls meanwhile). Zero removes the delay.
func (b *BMC) SetDelay(d time.Duration) error {
	if d <= 0 {
		if err := os.Remove(b.statePath("delay")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeAtomic(b.statePath("delay"), strconv.FormatFloat(d.Seconds(), 'f', 3, 64)+"\n")
}

// PowerRequest is a power change a BMC with an external supply was asked for.
type PowerRequest string

// Power requests; RequestNone means none is pending.
const (
	RequestNone  PowerRequest = ""
	RequestOff   PowerRequest = "0"
	RequestOn    PowerRequest = "1"
	RequestReset PowerRequest = "reset"
)

// SetExternalPower makes the BMC's power changes wait for an external supply, such as a testbed
// that really stops and starts a node: a chassis power command then files a request
// (PendingPower) and answers only once the supply called CompletePower, or fails (completion code
// 0xff) after 10 s without it. Status reads are unchanged. false restores the built-in supply.
func (b *BMC) SetExternalPower(external bool) error {
	if external {
		return writeAtomic(b.statePath("external"), "1\n")
	}
	if err := os.Remove(b.statePath("external")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// PendingPower returns the request waiting for the external supply, or RequestNone.
func (b *BMC) PendingPower() (PowerRequest, error) {
	data, err := os.ReadFile(b.statePath("power.request"))
	if errors.Is(err, os.ErrNotExist) {
		return RequestNone, nil
	}
	if err != nil {
		return RequestNone, err
	}
	switch r := PowerRequest(strings.TrimSpace(string(data))); r {
	case RequestOff, RequestOn, RequestReset:
		return r, nil
	default:
		return RequestNone, fmt.Errorf("power request file holds %q", r)
	}
}

// CompletePower records the state the external supply reached and answers the waiting request.
func (b *BMC) CompletePower(on bool) error {
	if err := b.SetPower(on); err != nil {
		return err
	}
	if err := os.Remove(b.statePath("power.request")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// PowerOffs counts the on -> off transitions in a call log as Calls returns it, from on: a
// power-off repeated while off (a retransmitted request) is no second power-off.
func PowerOffs(calls []string) int {
	on, n := true, 0
	for _, call := range calls {
		switch call {
		case "set power 0":
			if on {
				n++
			}
			on = false
		case "set power 1":
			on = true
		}
	}
	return n
}

// Calls returns the chassis-control call log, oldest first, one call a line without the timestamp,
// for example "get power" or "set power 0".
func (b *BMC) Calls() ([]string, error) {
	data, err := os.ReadFile(b.statePath("calls.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var calls []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if _, call, ok := strings.Cut(line, " "); ok {
			calls = append(calls, call)
		}
	}
	return calls, nil
}

// IpmitoolPower asks the BMC on 127.0.0.1:port for its power state with ipmitool (lanplus, cipher 3),
// independently of the code under test. It returns "on" or "off".
func IpmitoolPower(ctx context.Context, port int, user, password string) (string, error) {
	cmd := exec.CommandContext(ctx, "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(port),
		"-U", user, "-E", "-C", "3", "chassis", "power", "status")
	// -E reads the password from IPMI_PASSWORD, keeping it off the process list.
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+password)
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return "", fmt.Errorf("ipmitool chassis power status on port %d: %w: %s", port, err, text)
	}
	switch {
	case strings.HasSuffix(text, "Chassis Power is on"):
		return "on", nil
	case strings.HasSuffix(text, "Chassis Power is off"):
		return "off", nil
	}
	return "", fmt.Errorf("ipmitool chassis power status on port %d: unexpected output %q", port, text)
}

// IpmitoolChassisPower runs `ipmitool chassis power ACTION` (on, off, cycle, reset) against the
// BMC on 127.0.0.1:port (lanplus, cipher 3), independently of the code under test.
func IpmitoolChassisPower(ctx context.Context, port int, user, password, action string) error {
	switch action {
	case "on", "off", "cycle", "reset":
	default:
		return fmt.Errorf("action %q: want on, off, cycle or reset", action)
	}
	cmd := exec.CommandContext(ctx, "ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", strconv.Itoa(port),
		"-U", user, "-E", "-C", "3", "chassis", "power", action)
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+password)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ipmitool chassis power %s on port %d: %w: %s", action, port, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Blackhole opens a UDP socket on 127.0.0.1 that reads every datagram and never answers: a BMC that
// is powered but silent. closer closes the socket and waits for its reader.
func Blackhole() (port int, closer func(), err error) {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := conn.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	closer = func() { _ = conn.Close(); <-done }
	return conn.LocalAddr().(*net.UDPAddr).Port, closer, nil
}

func freeUDPPort() (int, error) {
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).Port, nil
}

// udpBound reports whether some socket is bound to 127.0.0.1:port in the network namespace whose
// UDP table is at path (/proc/PID/net/udp).
func udpBound(path string, port int) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	want := fmt.Sprintf("0100007F:%04X", port)
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 && f[1] == want {
			return true, nil
		}
	}
	return false, nil
}

func writeAtomic(path, data string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func lanConf(port int, user, password, script, stateDir string) string {
	return fmt.Sprintf(`# ipmi_sim LAN configuration generated by package ipmisim.
name "bmc%[1]d"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 %[1]d
    priv_limit admin
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid 0badc0de0badc0de0badc0de0bad%04[1]x
  endlan
  chassis_control "%[4]s %[5]s 0x20"
  #    num enabled name  password  max-priv max-sess auths
  user 2   true    %[2]q  %[3]q     admin    10       md5
`, port, user, password, script, stateDir)
}

// emuFile declares one BMC at IPMB address 0x20.
const emuFile = `# ipmi_sim emulator commands generated by package ipmisim: one BMC at 0x20.
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 0x09 0x08 0x9f 0x1291 0xf02
mc_enable 0x20
`

// chassisScript is ipmi_sim's chassis_control program. ipmi_sim runs it as
//
//	script STATEDIR MC get NAME...          (prints NAME:VALUE lines)
//	script STATEDIR MC set NAME VALUE...
//	script STATEDIR MC check NAME VALUE...
//
// and answers completion code 0xff when it exits non-zero.
const chassisScript = `#!/bin/sh
# chassis_control program generated by package ipmisim. Power state: STATEDIR/power (1 on, 0 off).
# Fault files in STATEDIR: fail (exit 1), stuck (set accepted, nothing changes), delay (seconds),
# flap (power reads alternate 1, 0, 1, ...; set accepted, nothing changes); external (a supply
# outside applies power changes: see power()).
st=$1; shift 2
op=$1; shift
echo "$(date +%s.%N) $op $*" >> "$st/calls.log"
if [ -f "$st/delay" ]; then sleep "$(cat "$st/delay")"; fi
if [ -f "$st/fail" ]; then exit 1; fi
power() {
    if [ -f "$st/external" ]; then
        # An external supply applies the change (package ipmisim, ExternalPower): ask it and wait
        # until it has removed the request (the state file then holds the new state), at most 10 s.
        echo "$1" > "$st/power.request.new" && mv "$st/power.request.new" "$st/power.request"
        i=0
        while [ -f "$st/power.request" ]; do
            i=$((i + 1))
            if [ $i -gt 200 ]; then rm -f "$st/power.request"; exit 1; fi
            sleep 0.05
        done
        return 0
    fi
    v=$1; if [ "$v" = reset ]; then v=1; fi
    echo "$v" > "$st/power.new" && mv "$st/power.new" "$st/power"
}
case "$op" in
get)
    for name in "$@"; do
        case "$name" in
        power)
            if [ -f "$st/flap" ]; then
                n=$(cat "$st/flaps" 2>/dev/null || echo 0)
                echo $((n + 1)) > "$st/flaps"
                echo "power:$(( (n + 1) % 2 ))"
            elif [ -s "$st/power" ]; then echo "power:$(cat "$st/power")"; else echo "power:1"; fi ;;
        boot) echo "boot:default" ;;
        *) exit 1 ;;
        esac
    done ;;
set)
    if [ -f "$st/stuck" ] || [ -f "$st/flap" ]; then exit 0; fi
    while [ $# -ge 2 ]; do
        case "$1" in
        power) if [ "$2" = 0 ]; then power 0; else power 1; fi ;;
        shutdown) power 0 ;;
        reset) power reset ;;
        boot|identify) ;;
        *) exit 1 ;;
        esac
        shift 2
    done ;;
check) ;;
*) exit 1 ;;
esac
exit 0
`
