package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	victim := c.victim()
	if p, err := ipmisim.IpmitoolPower(ctx, victim.bmc.Port, "admin", "password"); err != nil || p != "on" {
		return fail("before the demo, ipmitool says %s's BMC is %q (%v), want on", victim.name, p, err)
	}

	silenced := time.Now()
	victim.silence()
	line(silenced, "%s: agent stopped (the node 'dies'); its BMC still says on", victim.name)
	detected, final, err := c.followFence(ctx, victim.name, silenced, c.opts.grace+80*time.Second, line)
	if err != nil {
		return fail("%v", err)
	}
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE || final.ConfirmedOffAt == nil {
		return fail("fence did not end DONE with a confirmed power-off: %v", final)
	}
	rec := final
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
