package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/testbed/ipmisim"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// runDemo silences one simulated node, waits for the coordinator to judge it Unknown and to fence
// it on its own after the fence timeout, follows the record until the driver confirmed power off, and
// checks the BMC independently with ipmitool.
func runDemo(ctx context.Context, c *cluster, stdout, stderr io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "demo FAILED: "+format+"\n", args...)
		return 1
	}
	line := func(at time.Time, format string, args ...any) {
		fmt.Fprintf(stdout, "%s  %s\n", at.Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	victim := c.sims[len(c.sims)-1] // in zone-a with others: the storm guard lets it be fenced
	if p, err := ipmisim.IpmitoolPower(ctx, victim.bmc.Port, "admin", "password"); err != nil || p != "on" {
		return fail("before the demo, ipmitool says %s's BMC is %q (%v), want on", victim.name, p, err)
	}

	silenced := time.Now()
	victim.silence()
	line(silenced, "%s: agent stopped (the node 'dies'); its BMC still says on", victim.name)

	if err := c.waitNodes(ctx, c.opts.grace+20*time.Second, func(n *coordv1.Node) bool {
		return n.Readiness == coordv1.Readiness_READINESS_UNKNOWN
	}, victim.name); err != nil {
		return fail("%v", err)
	}
	detected := time.Now()
	line(detected, "%s: coordinator judges it Unknown (no contact for longer than the %s grace period)", victim.name, c.opts.grace)

	fc := coordv1.NewFenceServiceClient(c.conn)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var rec *coordv1.NodeFence
	for rec == nil {
		r, err := fc.ListFences(wctx, &coordv1.ListFencesRequest{Node: victim.name})
		if err != nil {
			return fail("ListFences: %v", err)
		}
		if len(r.Fences) > 0 {
			rec = r.Fences[0]
			break
		}
		select {
		case <-wctx.Done():
			return fail("no automatic fence of %s within 60s", victim.name)
		case <-time.After(50 * time.Millisecond):
		}
	}
	line(rec.CreatedAt.AsTime(), "%s: coordinator fenced it automatically: record %s (epoch %d); evidence: %s",
		victim.name, rec.Id, rec.Epoch, strings.Join(rec.Evidence, "; "))
	stream, err := fc.WatchFence(wctx, &coordv1.WatchFenceRequest{Id: rec.Id})
	if err != nil {
		return fail("WatchFence: %v", err)
	}
	var final *coordv1.NodeFence
	last := ""
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail("WatchFence: %v", err)
		}
		final = r.Fence
		msg := fmt.Sprintf("%s: fence %s", victim.name, short(r.Fence.Status))
		if n := len(r.Fence.Operations); n > 0 {
			op := r.Fence.Operations[n-1]
			msg += fmt.Sprintf(" — %s %s via %s (epoch %d)", op.Method, op.Action, op.Driver, op.Epoch)
			if op.Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
				msg += ": sent, awaiting read-back"
			} else {
				msg += fmt.Sprintf(": %s, read back %s in %s", short(op.Result), short(op.State), op.Elapsed.AsDuration().Round(time.Millisecond))
			}
		}
		if r.Fence.FinishedAt != nil {
			msg += " (finished)"
		}
		if msg != last {
			line(r.Fence.UpdatedAt.AsTime(), "%s", msg)
			last = msg
		}
	}
	if final == nil || final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || final.ConfirmedOffAt == nil {
		return fail("fence did not end DONE with a confirmed power-off: %v", final)
	}
	confirmed := final.ConfirmedOffAt.AsTime()

	power, err := ipmisim.IpmitoolPower(ctx, victim.bmc.Port, "admin", "password")
	if err != nil {
		return fail("ipmitool: %v", err)
	}
	line(time.Now(), "%s: ipmitool (independent of nodefence) reads chassis power: %s", victim.name, power)
	if power != "off" {
		return fail("ipmitool says %s, want off", power)
	}
	fmt.Fprintf(stdout, "timeline: silent -> unknown %.2fs (grace %s), unknown -> fence started %.2fs (fence timeout %s), -> confirmed off %.2fs\n",
		detected.Sub(silenced).Seconds(), c.opts.grace, rec.CreatedAt.AsTime().Sub(detected).Seconds(), c.opts.fenceTimeout,
		confirmed.Sub(rec.CreatedAt.AsTime()).Seconds())
	b, _ := json.Marshal(result{Demo: "fence", Node: victim.name, Power: power, VerifiedBy: "ipmitool",
		Seconds: float64(confirmed.Sub(detected).Milliseconds()) / 1000})
	fmt.Fprintln(stdout, string(b))
	return 0
}

func short(v fmt.Stringer) string { return cli.EnumWord(v.String()) }
