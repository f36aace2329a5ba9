// Command bench-drivers measures nodefence's driver services against the ClusterLabs reference
// agents, side by side on the same simulators in one run:
//
//   - IPMI: our ipmi driver over gRPC vs `fence_ipmilan --lanplus --cipher=3`, on one ipmi_sim BMC;
//   - PDU: our pdu driver over gRPC vs `fence_apc_snmp`, SNMP v2c and v3 (authPriv SHA/AES), on
//     the snmpsim APC rPDU profile;
//   - Brocade: our brocade driver vs `fence_brocade`, over telnet and SSH, on one brocadesim switch
//     (off is a port disable, on an enable);
//   - Redfish: our redfish driver vs `fence_redfish`, over HTTPS, on one redfishsim BMC.
//
// Each round does a verified off, a verified on and a status with each side. It prints a table
// and, as its last line, one JSON object with the medians in milliseconds and the ratios
// reference median / ours:
//
//	go run ./testbed/cmd/bench-drivers -rounds 20
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nodefence/nodefence/fence-drivers/brocade"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/pdu"
	"github.com/nodefence/nodefence/fence-drivers/redfish"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/server"
	"github.com/nodefence/nodefence/services/tlsfiles"
	"github.com/nodefence/nodefence/testbed/brocadesim"
	"github.com/nodefence/nodefence/testbed/ipmisim"
	"github.com/nodefence/nodefence/testbed/redfishsim"
	"github.com/nodefence/nodefence/testbed/snmpsim"
)

func main() {
	rounds := flag.Int("rounds", 20, "rounds per case")
	flag.Parse()
	if err := run(*rounds, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "bench-drivers: %v\n", err)
		os.Exit(1)
	}
}

// series collects the durations of one case.
type series map[string][]time.Duration

func (s series) median(name string) float64 {
	d := slices.Clone(s[name])
	if len(d) == 0 {
		return math.NaN()
	}
	slices.Sort(d)
	m := d[len(d)/2]
	if len(d)%2 == 0 {
		m = (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	return float64(m.Microseconds()) / 1000
}

func timed(s series, name string, fn func() error) error {
	start := time.Now()
	if err := fn(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	s[name] = append(s[name], time.Since(start))
	return nil
}

// serve starts a driver service on 127.0.0.1 and returns a client.
func serve(d kit.Driver, dir string) (driverv1.FenceDriverServiceClient, func(), error) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := kit.NewService(d, kit.Options{StateDir: dir, PollInterval: 20 * time.Millisecond, Log: log})
	if err != nil {
		return nil, nil, err
	}
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", TLS: tlsfiles.Files{Insecure: true}, UnauthenticatedCaller: "spiffe://nodefence/coordinator/bench", DrainTimeout: time.Second}, log)
	if err != nil {
		return nil, nil, err
	}
	driverv1.RegisterFenceDriverServiceServer(srv.GRPC, svc)
	go func() { _ = srv.Serve() }()
	conn, err := dial.New(srv.Addr(), tlsfiles.Files{Insecure: true})
	if err != nil {
		srv.Stop()
		return nil, nil, err
	}
	return driverv1.NewFenceDriverServiceClient(conn), func() { conn.Close(); srv.Stop() }, nil
}

// reference runs a fence agent with command-line options; wantCode is its expected exit code.
func reference(ctx context.Context, wantCode int, agent string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, args...)
	cmd.Env = []string{"LANG=C", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + os.TempDir()}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		return err
	}
	if code != wantCode {
		return fmt.Errorf("%s %v exited %d, want %d: %s", agent, args, code, wantCode, out)
	}
	return nil
}

var opSeq int

func ours(ctx context.Context, c driverv1.FenceDriverServiceClient, tg *driverv1.Target, s series, prefix string) error {
	opSeq++
	if err := timed(s, prefix+"_off", func() error {
		_, err := c.PowerOff(ctx, &driverv1.PowerOffRequest{OperationId: "bench-off-" + strconv.Itoa(opSeq), Epoch: 1, Target: tg})
		return err
	}); err != nil {
		return err
	}
	if err := timed(s, prefix+"_on", func() error {
		_, err := c.PowerOn(ctx, &driverv1.PowerOnRequest{OperationId: "bench-on-" + strconv.Itoa(opSeq), Epoch: 1, Target: tg})
		return err
	}); err != nil {
		return err
	}
	return timed(s, prefix+"_status", func() error {
		r, err := c.Status(ctx, &driverv1.StatusRequest{Target: tg})
		if err == nil && r.GetState() != driverv1.PowerState_POWER_STATE_ON {
			err = fmt.Errorf("status %v, want on", r.GetState())
		}
		return err
	})
}

func refRound(ctx context.Context, s series, prefix, agent string, args ...string) error {
	for _, a := range []struct {
		action string
		code   int
	}{{"off", 0}, {"on", 0}, {"status", 0}} {
		if err := timed(s, prefix+"_"+a.action, func() error {
			return reference(ctx, a.code, agent, append(slices.Clone(args), "--action="+a.action)...)
		}); err != nil {
			return err
		}
	}
	return nil
}

func run(rounds int, out io.Writer) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "bench-drivers-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	bmc, err := ipmisim.Start(tmp+"/bmc", 0, "admin", "password")
	if err != nil {
		return err
	}
	defer bmc.Stop()
	sim, err := snmpsim.Start(snmpsim.Config{Outlets: 8})
	if err != nil {
		return err
	}
	defer sim.Stop()

	ic, stopI, err := serve(ipmi.New(), tmp+"/ipmi-state")
	if err != nil {
		return err
	}
	defer stopI()
	pc, stopP, err := serve(pdu.New(), tmp+"/pdu-state")
	if err != nil {
		return err
	}
	defer stopP()

	sw, err := brocadesim.Start(brocadesim.Config{Ports: 8, User: "admin", Password: "fibranne"})
	if err != nil {
		return err
	}
	defer sw.Close()
	rf, err := redfishsim.Start(redfishsim.Config{Systems: 1, User: "root", Password: "calvin-redfish"})
	if err != nil {
		return err
	}
	defer rf.Close()
	caFile := tmp + "/redfish-ca.pem"
	if err := os.WriteFile(caFile, rf.CAPEM(), 0o600); err != nil {
		return err
	}
	bd := brocade.NewWith(brocade.Config{Log: slog.New(slog.DiscardHandler)})
	defer bd.Close()
	bc, stopB, err := serve(bd, tmp+"/brocade-state")
	if err != nil {
		return err
	}
	defer stopB()
	rc, stopR, err := serve(redfish.New(), tmp+"/redfish-state")
	if err != nil {
		return err
	}
	defer stopR()
	t := newTargets(bmc, sim, sw, rf, caFile)
	s, err := measure(ctx, rounds, t, ic, pc, bc, rc)
	if err != nil {
		return err
	}

	return report(out, s, rounds)
}

// report prints the table of medians and, last, the results as one JSON object.
func report(out io.Writer, s series, rounds int) error {
	result := map[string]any{"bench": "drivers", "rounds": rounds}
	fmt.Fprintf(out, "%-12s %-7s %12s %12s %8s\n", "case", "action", "ours ms", "ref ms", "ratio")
	for _, c := range []string{"ipmi", "pdu", "pdu_v3", "brocade", "brocade_ssh", "redfish"} {
		for _, a := range []string{"off", "on", "status"} {
			o, ref := s.median(c+"_ours_"+a), s.median(c+"_ref_"+a)
			ratio := math.Round(ref/o*10) / 10
			fmt.Fprintf(out, "%-12s %-7s %12.2f %12.2f %8.1f\n", c, a, o, ref, ratio)
			result[c+"_"+a+"_ratio"] = ratio
			result[c+"_"+a+"_ms_ours"] = math.Round(o*100) / 100
			result[c+"_"+a+"_ms_ref"] = math.Round(ref*100) / 100
		}
	}
	line, err := json.Marshal(result)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, string(line))
	return nil
}

// targets are the benchmark's fence targets, for our drivers and as the reference agents' arguments.
type targets struct {
	ipmiTarget, v2c, v3, brocadeTelnet, brocadeSSH, redfishTarget           *driverv1.Target
	ipmiArgs, apcV2c, apcV3, brocadeTelnetArgs, brocadeSSHArgs, redfishArgs []string
}

// newTargets are the targets of the simulators: the BMC, the APC PDU (SNMP v2c and v3), the Brocade
// switch (telnet and ssh) and the Redfish service whose CA is in caFile.
func newTargets(bmc *ipmisim.BMC, sim *snmpsim.Sim, sw *brocadesim.Switch, rf *redfishsim.Service, caFile string) targets {
	telnetPort, sshPort := strconv.Itoa(sw.TelnetPort()), strconv.Itoa(sw.SSHPort())
	brocadeTelnet := &driverv1.Target{Name: "bench", Parameters: map[string]string{
		"ip": "127.0.0.1", "ipport": telnetPort, "username": "admin", "password": "fibranne", "plug": "3"}}
	brocadeSSH := &driverv1.Target{Name: "bench", Parameters: map[string]string{
		"ip": "127.0.0.1", "ipport": sshPort, "ssh": "1", "username": "admin", "password": "fibranne", "plug": "4",
		"ssh_host_key": ssh.FingerprintSHA256(sw.HostKey())}}
	redfishTarget := &driverv1.Target{Name: "bench", Parameters: map[string]string{
		"ip": "127.0.0.1", "ipport": strconv.Itoa(rf.Port()), "username": "root", "password": "calvin-redfish",
		"ssl_ca_file": caFile}}
	brocadeTelnetArgs := []string{"--ip=127.0.0.1", "--ipport=" + telnetPort, "--username=admin", "--password=fibranne", "--plug=3"}
	brocadeSSHArgs := []string{"--ip=127.0.0.1", "--ipport=" + sshPort, "--ssh", "--username=admin", "--password=fibranne", "--plug=4",
		"--ssh-options=-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR"}
	redfishArgs := []string{"--ip=127.0.0.1", "--ipport=" + strconv.Itoa(rf.Port()), "--username=root", "--password=calvin-redfish", "--ssl-insecure"}

	port := strconv.Itoa(bmc.Port)
	ipmiTarget := &driverv1.Target{Name: "bench", Parameters: map[string]string{
		"ip": "127.0.0.1", "ipport": port, "username": "admin", "password": "password", "lanplus": "1", "cipher": "3"}}
	apcPort := strconv.Itoa(sim.Port(snmpsim.APCRPDU))
	v2c := &driverv1.Target{Name: "bench", Parameters: map[string]string{
		"ip": "127.0.0.1", "ipport": apcPort, "plug": "3", "snmp_version": "2c", "community": snmpsim.CommunityRW}}
	v3 := &driverv1.Target{Name: "bench", Parameters: map[string]string{
		"ip": "127.0.0.1", "ipport": apcPort, "plug": "4", "snmp_version": "3", "username": snmpsim.UserAuthPriv,
		"password": snmpsim.AuthPass, "snmp_auth_prot": "SHA", "snmp_sec_level": "authPriv",
		"snmp_priv_prot": "AES", "snmp_priv_passwd": snmpsim.PrivPass}}
	ipmiArgs := []string{"--ip=127.0.0.1", "--ipport=" + port, "--username=admin", "--password=password", "--lanplus", "--cipher=3"}
	apcV2c := []string{"--ip=127.0.0.1", "--ipport=" + apcPort, "--plug=3", "--snmp-version=2c", "--community=" + snmpsim.CommunityRW}
	apcV3 := []string{"--ip=127.0.0.1", "--ipport=" + apcPort, "--plug=4", "--snmp-version=3", "--username=" + snmpsim.UserAuthPriv,
		"--password=" + snmpsim.AuthPass, "--snmp-auth-prot=SHA", "--snmp-sec-level=authPriv", "--snmp-priv-prot=AES",
		"--snmp-priv-passwd=" + snmpsim.PrivPass}
	return targets{ipmiTarget, v2c, v3, brocadeTelnet, brocadeSSH, redfishTarget,
		ipmiArgs, apcV2c, apcV3, brocadeTelnetArgs, brocadeSSHArgs, redfishArgs}
}

// measure runs one warm-up per target, then the rounds of ours and the reference side by side.
func measure(ctx context.Context, rounds int, t targets, ic, pc, bc, rc driverv1.FenceDriverServiceClient) (series, error) {
	s := series{}
	// One warm-up of ours per target (connections, v3 engine discovery), not counted.
	for _, w := range []struct {
		c  driverv1.FenceDriverServiceClient
		tg *driverv1.Target
	}{{ic, t.ipmiTarget}, {pc, t.v2c}, {pc, t.v3}, {bc, t.brocadeTelnet}, {bc, t.brocadeSSH}, {rc, t.redfishTarget}} {
		if err := ours(ctx, w.c, w.tg, series{}, "warmup"); err != nil {
			return nil, err
		}
	}
	for r := range rounds {
		steps := []func() error{
			func() error { return ours(ctx, ic, t.ipmiTarget, s, "ipmi_ours") },
			func() error { return refRound(ctx, s, "ipmi_ref", "fence_ipmilan", t.ipmiArgs...) },
			func() error { return ours(ctx, pc, t.v2c, s, "pdu_ours") },
			func() error { return refRound(ctx, s, "pdu_ref", "fence_apc_snmp", t.apcV2c...) },
			func() error { return ours(ctx, pc, t.v3, s, "pdu_v3_ours") },
			func() error { return refRound(ctx, s, "pdu_v3_ref", "fence_apc_snmp", t.apcV3...) },
			func() error { return ours(ctx, bc, t.brocadeTelnet, s, "brocade_ours") },
			func() error { return refRound(ctx, s, "brocade_ref", "fence_brocade", t.brocadeTelnetArgs...) },
			func() error { return ours(ctx, bc, t.brocadeSSH, s, "brocade_ssh_ours") },
			func() error { return refRound(ctx, s, "brocade_ssh_ref", "fence_brocade", t.brocadeSSHArgs...) },
			func() error { return ours(ctx, rc, t.redfishTarget, s, "redfish_ours") },
			func() error { return refRound(ctx, s, "redfish_ref", "fence_redfish", t.redfishArgs...) },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, fmt.Errorf("round %d: %w", r+1, err)
			}
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done\n", r+1, rounds)
	}
	return s, nil
}
