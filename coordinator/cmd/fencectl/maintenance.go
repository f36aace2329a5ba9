package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

const maintenanceHelp = `Kubernetes mode. start cordons NODE, drains it through the Eviction API (PodDisruptionBudgets
respected, DaemonSet and mirror pods left in place, refused evictions retried every 5 s) and holds its
automatic fence back until stop (an operator may still fence it); both are audited. start follows the
drain and prints its progress until nothing is left to move; Ctrl-C stops following only: the drain
continues on the coordinator (fencectl maintenance status NODE). stop uncordons the node if start
cordoned it. The maintenance is the node's nodefence.io/maintenance annotation (its value is the
reason), so kubectl shows it too.`

// maintenanceCommands are the rows of the maintenance group.
var maintenanceCommands = []*command{
	{name: "maintenance start", args: "NODE", minArgs: 1, maxArgs: 1, summary: "cordon and drain a node, and hold its automatic fence back until stop",
		help: maintenanceHelp,
		setup: func(fs *flag.FlagSet) runFunc {
			reason := fs.String("reason", "", "why (required): the value of the node's nodefence.io/maintenance annotation, in the audit trail")
			noDrain := fs.Bool("no-drain", false, "cordon and hold the automatic fence back, but evict nothing")
			noWatch := fs.Bool("no-watch", false, "return once the maintenance is set, without following the drain")
			return func(ctx context.Context, c *ctl, a []string) error {
				return c.maintenanceStart(ctx, a[0], *reason, *noDrain, *noWatch)
			}
		}},
	{name: "maintenance stop", args: "NODE", minArgs: 1, maxArgs: 1, summary: "end a node's maintenance: uncordon it, fence it automatically again",
		help: maintenanceHelp,
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, a []string) error { return c.maintenanceStop(ctx, a[0]) }
		}},
	{name: "maintenance status", args: "NODE", minArgs: 1, maxArgs: 1, summary: "a node's maintenance and the pods its drain still has to move",
		help: maintenanceHelp,
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, a []string) error { return c.maintenanceStatus(ctx, a[0]) }
		}},
}

// maintenancePoll is how often start asks for the drain's progress.
const maintenancePoll = time.Second

func (c *ctl) maintenanceStart(ctx context.Context, node, reason string, noDrain, noWatch bool) error {
	if strings.TrimSpace(reason) == "" {
		return usagef("maintenance start: --reason is required (it is the value of the node's nodefence.io/maintenance annotation)")
	}
	var m *coordv1.Maintenance
	err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).StartMaintenance(ctx, &coordv1.StartMaintenanceRequest{Node: node, Reason: reason, NoDrain: noDrain}, opts...)
		m = r.GetMaintenance()
		return err
	})
	if err != nil {
		return err
	}
	if noWatch || noDrain || c.output != "table" {
		return c.showMaintenance(m)
	}
	fmt.Fprintln(c.out, progressLine(m))
	for last := progressLine(m); !m.Drained; {
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("stopped following: the drain of %s continues on the coordinator; see it with: fencectl maintenance status %s", node, node)
			if c.interrupted() {
				return interruptedError{msg}
			}
			return errors.New(msg)
		case <-time.After(maintenancePoll):
		}
		err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := clusterClient(conn).GetMaintenance(ctx, &coordv1.GetMaintenanceRequest{Node: node}, opts...)
			if err == nil {
				m = r.GetMaintenance()
			}
			return err
		})
		if err != nil && ctx.Err() == nil {
			return err
		}
		if !m.GetActive() {
			return fmt.Errorf("the maintenance of %s ended while it drained (fencectl maintenance stop, or the annotation removed)", node)
		}
		if line := progressLine(m); line != last {
			fmt.Fprintln(c.out, line)
			last = line
		}
	}
	fmt.Fprintf(c.out, "%s drained: no automatic fence until fencectl maintenance stop %s\n", node, node)
	return nil
}

func (c *ctl) maintenanceStop(ctx context.Context, node string) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).StopMaintenance(ctx, &coordv1.StopMaintenanceRequest{Node: node}, opts...)
		if err != nil {
			return err
		}
		return c.showMaintenance(r.GetMaintenance())
	})
}

func (c *ctl) maintenanceStatus(ctx context.Context, node string) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).GetMaintenance(ctx, &coordv1.GetMaintenanceRequest{Node: node}, opts...)
		if err != nil {
			return err
		}
		return c.showMaintenance(r.GetMaintenance())
	})
}

// showMaintenance prints a node's maintenance: a summary line, and a table of the pods left to move.
func (c *ctl) showMaintenance(m *coordv1.Maintenance) error {
	if m == nil {
		m = &coordv1.Maintenance{}
	}
	v := view{data: proto.Message(m), text: func(w io.Writer) error {
		_, err := fmt.Fprintln(w, progressLine(m))
		return err
	}}
	if len(m.Pods) > 0 {
		t := table{header: []string{"NAMESPACE", "POD", "STATE", "DETAIL"}}
		for _, p := range m.Pods {
			t.rows = append(t.rows, []string{p.Namespace, p.Name, word(p.State), p.Detail})
		}
		v.tables = []table{t}
	}
	return c.show(v)
}

// progressLine says where a node's maintenance stands in one line.
func progressLine(m *coordv1.Maintenance) string {
	if !m.GetActive() {
		s := m.GetNode() + ": not in maintenance"
		if m.GetCordoned() {
			s += " (cordoned by someone else: kubectl uncordon)"
		}
		return s
	}
	var parts []string
	if m.GetCordoned() {
		parts = append(parts, "cordoned")
	} else {
		parts = append(parts, "NOT cordoned (kubectl cordon)")
	}
	if by := m.GetRequester(); by != "" {
		parts = append(parts, "by "+by)
	}
	switch {
	case !m.GetDrain():
		parts = append(parts, "not drained by nodefence")
	case m.GetDrained():
		parts = append(parts, fmt.Sprintf("drained (%d pods kept: DaemonSet, mirror or ended)", m.GetKept()))
	default:
		counts := map[coordv1.MaintenancePodState]int{}
		for _, p := range m.GetPods() {
			counts[p.State]++
		}
		s := fmt.Sprintf("%d pods to move:", len(m.GetPods()))
		for _, st := range []coordv1.MaintenancePodState{coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_PENDING,
			coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_TERMINATING, coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_BLOCKED,
			coordv1.MaintenancePodState_MAINTENANCE_POD_STATE_FAILED} {
			if counts[st] > 0 {
				s += fmt.Sprintf(" %d %s", counts[st], word(st))
			}
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("%s in maintenance (%s): %s", m.GetNode(), m.GetReason(), strings.Join(parts, "; "))
}
