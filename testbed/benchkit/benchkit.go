// Package benchkit is what the agent-fleet benchmarks (bench-ingest, bench-failover) share: the
// fleet's flags and their checks, the run-and-report frame (exit 2 listing every bad flag, exit 1
// on a failed run, the result as one JSON object on the last line), the gRPC connections the
// simulated agents share, and a process's resident memory.
package benchkit

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Fleet is the simulated agents' flags.
type Fleet struct {
	// Agents is how many agents are simulated, one stream each.
	Agents int
	// PerConn is how many agent streams share one gRPC connection.
	PerConn int
	// Bin is the directory holding the binaries the benchmark starts.
	Bin string
}

// RegisterFleet adds --agents, --streams-per-conn and --bin (binaries: what --bin must hold) to fs.
func RegisterFleet(fs *flag.FlagSet, binaries string) *Fleet {
	f := &Fleet{}
	exe, _ := os.Executable()
	fs.IntVar(&f.Agents, "agents", 10000, "simulated agents (one stream each)")
	fs.IntVar(&f.PerConn, "streams-per-conn", 100, "agent streams per gRPC connection")
	fs.StringVar(&f.Bin, "bin", filepath.Dir(exe), "directory holding the "+binaries)
	return f
}

// Problems lists what is wrong with the flags; --agents may be at most maxAgents.
func (f *Fleet) Problems(maxAgents int) []string {
	var p []string
	if f.Agents < 1 || f.Agents > maxAgents {
		p = append(p, fmt.Sprintf("--agents: must be 1..%d", maxAgents))
	}
	if f.PerConn < 1 {
		p = append(p, "--streams-per-conn: must be positive")
	}
	return p
}

// Conns dials the streams' shared connections to addr: one per PerConn agents. On error the ones
// dialed are closed.
func (f *Fleet) Conns(addr string) ([]*grpc.ClientConn, error) {
	var conns []*grpc.ClientConn
	for range (f.Agents + f.PerConn - 1) / f.PerConn {
		c, err := dial.New(addr, tlsfiles.Files{Insecure: true})
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// Main runs a benchmark named name and exits: with status 2 after listing problems (when there are
// any), 1 when run fails, else 0 after printing run's result as one JSON line. run's context ends on
// SIGINT or SIGTERM.
func Main[R any](name string, problems []string, run func(context.Context) (R, error)) {
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "%s: %s\n", name, p)
		}
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	res, err := run(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	b, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	fmt.Println(string(b))
}

// RSSMB is the resident memory of process pid in MiB (VmRSS).
func RSSMB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
