package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/nodefence/nodefence/testbed/ipmisim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// Report is what the invariant checkers found.
type Report struct {
	// PowerOffs counts, per node, the BMC's on -> off transitions (from its call log).
	PowerOffs map[string]int
	// DoubleFences counts nodes powered off more than once.
	DoubleFences int
	// LiveNodesFenced counts nodes whose agent was never killed but that were powered off or got a
	// fence record.
	LiveNodesFenced int
	// StaleEpochCalls counts driver operations that ran with an epoch lower than one the driver had
	// already run for the same device.
	StaleEpochCalls int
	// Looks counts the whole observations the invariants were checked on while the run went.
	Looks int
	// LostRecords are fence records seen during the run and missing at the end.
	LostRecords []string
	// Problems describes every violation.
	Problems []string
}

// OK reports whether no invariant was violated.
func (r Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// ListFences asks each coordinator in turn (any replica answers from etcd).
func (c *Cluster) ListFences(ctx context.Context) ([]*coordv1.NodeFence, error) {
	var last error
	for _, addr := range c.CoordAddr {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := coordv1.NewFenceServiceClient(c.Conn(addr)).ListFences(cctx, &coordv1.ListFencesRequest{Limit: 1000})
		cancel()
		if err == nil {
			return resp.Fences, nil
		}
		last = err
	}
	return nil, last
}

// Verify checks the invariants over the BMC logs, the driver log and the records; dead names the
// nodes whose agents were killed (the only ones that may be fenced).
func (c *Cluster) Verify(ctx context.Context, dead map[string]bool, seen *Records) Report {
	r := Report{PowerOffs: map[string]int{}}
	// At most one power-off per node (nothing here ever powers a node back on), none of a live node.
	for _, n := range c.Nodes {
		calls, err := c.BMCs[n].Calls()
		if err != nil {
			r.problem("BMC of %s: %v", n, err)
			continue
		}
		r.PowerOffs[n] = ipmisim.PowerOffs(calls)
		if r.PowerOffs[n] > 1 {
			r.DoubleFences++
			r.problem("node %s was powered off %d times", n, r.PowerOffs[n])
		}
		if !dead[n] && r.PowerOffs[n] > 0 {
			r.LiveNodesFenced++
			r.problem("node %s, whose agent was alive, was powered off", n)
		}
	}
	// Records: none lost, none of a live node.
	final, err := c.ListFences(ctx)
	if err != nil {
		r.problem("listing the records at the end: %v", err)
	} else {
		have := map[string]bool{}
		for _, f := range final {
			have[f.Id] = true
			if !dead[f.Node] && r.PowerOffs[f.Node] == 0 {
				r.LiveNodesFenced++
				r.problem("node %s, whose agent was alive, got fence record %s (%s)", f.Node, f.Id, f.Status)
			}
		}
		seen.mu.Lock()
		for id := range seen.seen {
			if !have[id] {
				r.LostRecords = append(r.LostRecords, id)
			}
		}
		seen.mu.Unlock()
		sort.Strings(r.LostRecords)
		for _, id := range r.LostRecords {
			r.problem("record %s was seen during the run and is gone", id)
		}
	}
	// The driver never ran an operation with an epoch below one it already ran for the device.
	ops, err := driverOps(c.Driver.Log)
	if err != nil {
		r.problem("driver log: %v", err)
	}
	r.StaleEpochCalls = staleEpochs(ops, r.problem)
	return r
}

// staleEpochs counts operations the driver ran (not rejected) with an epoch below one it had already
// run for the same device, reporting each.
func staleEpochs(ops []driverOp, problem func(string, ...any)) int {
	highest, n := map[string]int64{}, 0
	for _, op := range ops {
		if op.Result == "rejected" {
			continue
		}
		if op.Epoch < highest[op.Device] {
			n++
			problem("driver ran %s %s on %s with epoch %d after epoch %d", op.Action, op.OperationID, op.Device, op.Epoch, highest[op.Device])
		}
		highest[op.Device] = max(highest[op.Device], op.Epoch)
	}
	return n
}

// driverOp is one "fence operation" line of the driver's log.
type driverOp struct {
	Time        time.Time     `json:"time"`
	Msg         string        `json:"msg"`
	Action      string        `json:"action"`
	OperationID string        `json:"operation_id"`
	Epoch       int64         `json:"epoch"`
	Device      string        `json:"device"`
	Result      string        `json:"result"`
	Elapsed     time.Duration `json:"elapsed"`
}

// driverOps reads the driver's operations in the order they started.
func driverOps(path string) ([]driverOp, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []driverOp
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"msg":"fence operation"`) {
			continue
		}
		var op driverOp
		if err := json.Unmarshal([]byte(line), &op); err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		op.Time = op.Time.Add(-op.Elapsed)
		ops = append(ops, op)
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Time.Before(ops[j].Time) })
	return ops, sc.Err()
}
