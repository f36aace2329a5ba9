package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// fence powers the node off and follows the record; a node that stands confirmed off is not
// switched again (unless again): fencectl says which record confirmed it.
func (c *ctl) fence(ctx context.Context, node, reason, method string, noWatch, again bool) error {
	var standing *coordv1.NodeFence
	_, err := c.follow(ctx, noWatch, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*coordv1.NodeFence, error) {
		r, err := fenceClient(conn).Fence(ctx, &coordv1.FenceRequest{Node: node, Reason: reason, Again: again, Method: method}, opts...)
		if r.GetAlreadyOff() {
			standing = r.GetFence()
			return nil, errStanding
		}
		return r.GetFence(), err
	})
	if err != errStanding {
		return err
	}
	how := "by read-back"
	if standing.AcknowledgedBy != "" {
		how = "by " + standing.AcknowledgedBy + "'s acknowledgement"
	}
	text := fmt.Sprintf("node %s is already off: fence %s confirmed it off %s at %s, and neither its agent nor its kubelet has reported since.\n"+
		"Not fenced again. To power-cycle it: fencectl reboot %s; to power it off anyway: fencectl fence %s --again\n",
		node, standing.Id, how, when(standing.ConfirmedOffAt), node, node)
	return c.show(view{data: object{{"alreadyOff", true}, {"fence", standing}}, text: func(w io.Writer) error {
		_, err := io.WriteString(w, text)
		return err
	}})
}

// errStanding stops follow when the node stands confirmed off: there is nothing to follow.
var errStanding = errors.New("the node stands confirmed off")

func (c *ctl) unfence(ctx context.Context, node, reason string, noWatch bool) error {
	_, err := c.follow(ctx, noWatch, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*coordv1.NodeFence, error) {
		r, err := fenceClient(conn).Unfence(ctx, &coordv1.UnfenceRequest{Node: node, Reason: reason}, opts...)
		return r.GetFence(), err
	})
	return err
}

// reboot power-cycles the node in one record (off, confirmed; then on, confirmed) and follows it.
func (c *ctl) reboot(ctx context.Context, node, reason string, noWatch bool) error {
	_, err := c.follow(ctx, noWatch, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*coordv1.NodeFence, error) {
		r, err := fenceClient(conn).Reboot(ctx, &coordv1.RebootRequest{Node: node, Reason: reason}, opts...)
		return r.GetFence(), err
	})
	return err
}

func (c *ctl) ack(ctx context.Context, node, operator, reason string, force bool) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := fenceClient(conn).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: node, Operator: operator, Reason: reason, Force: force}, opts...)
		if err != nil {
			return err
		}
		return c.showRecord(r.Fence)
	})
}

func (c *ctl) get(ctx context.Context, id string) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := fenceClient(conn).GetFence(ctx, &coordv1.GetFenceRequest{Id: id}, opts...)
		if err != nil {
			return err
		}
		return c.showRecord(r.Fence)
	})
}

// showRecord prints one fence record: its fields, then its operations.
func (c *ctl) showRecord(f *coordv1.NodeFence) error {
	return c.show(view{data: f, tables: recordTables(f)})
}

func recordTables(f *coordv1.NodeFence) []table {
	fields := table{rows: [][]string{
		{"id:", f.Id}, {"node:", f.Node}, {"action:", word(f.Action)}, {"step:", word(f.Step)}, {"status:", word(f.Status)},
		{"retries:", strconv.Itoa(int(f.Retries))}, {"epoch:", strconv.FormatInt(f.Epoch, 10)},
		{"requested by:", f.RequestedBy}, {"reason:", f.Reason}, {"created:", when(f.CreatedAt)}, {"updated:", when(f.UpdatedAt)},
	}}
	add := func(k, v string) {
		if v != "" && v != "-" {
			fields.rows = append(fields.rows, []string{k, v})
		}
	}
	add("finished:", when(f.FinishedAt))
	add("confirmed off:", when(f.ConfirmedOffAt))
	add("acknowledged by:", f.AcknowledgedBy)
	add("proof:", proofWord(f.Proof))
	if f.WrongMachineAt != nil {
		add("WRONG MACHINE:", when(f.WrongMachineAt)+": the node kept reporting after this power-off; its pods are never released")
	}
	add("error:", f.Error)
	for _, e := range f.Evidence {
		add("evidence:", e)
	}
	ops := table{header: []string{"STEP", "METHOD", "DRIVER", "ACTION", "EPOCH", "RESULT", "READ BACK", "ELAPSED", "ERROR"}}
	for _, op := range f.Operations {
		ops.rows = append(ops.rows, []string{word(op.Step), op.Method, op.Driver, op.Action, strconv.FormatInt(op.Epoch, 10),
			word(op.Result), word(op.State), op.Elapsed.AsDuration().Round(time.Millisecond).String(), op.Error})
	}
	if len(ops.rows) == 0 {
		return []table{fields}
	}
	return []table{fields, ops}
}

// when formats a timestamp in local time, "-" when unset.
func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Local().Format("2006-01-02 15:04:05.000")
}

// ago says how long ago t was, "never" when unset.
func ago(t *timestamppb.Timestamp) string {
	if t == nil {
		return "never"
	}
	return time.Since(t.AsTime()).Round(100*time.Millisecond).String() + " ago"
}

func (c *ctl) list(ctx context.Context, node, statusWord string, limit int, page string) error {
	st := coordv1.FenceStatus_FENCE_STATUS_UNSPECIFIED
	if statusWord != "" {
		v, ok := coordv1.FenceStatus_value["FENCE_STATUS_"+strings.ToUpper(statusWord)]
		if !ok || v == 0 {
			return usagef("--status: %q is not one of new, running, done, error, observed", statusWord)
		}
		st = coordv1.FenceStatus(v)
	}
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := fenceClient(conn).ListFences(ctx, &coordv1.ListFencesRequest{Node: node, Status: st, Limit: int32(limit), PageToken: page}, opts...)
		if err != nil {
			return err
		}
		t := table{header: []string{"ID", "NODE", "ACTION", "STATUS", "CREATED", "REQUESTED BY", "REASON", "ERROR"}}
		for _, f := range r.Fences {
			by := f.RequestedBy
			if f.Automatic && by == "" {
				by = "coordinator"
			}
			if f.AcknowledgedBy != "" {
				by += ", acknowledged by " + f.AcknowledgedBy
			}
			t.rows = append(t.rows, []string{f.Id, f.Node, word(f.Action), word(f.Status), when(f.CreatedAt), orDash(by), orDash(clip(f.Reason, 60)), f.Error})
		}
		for _, id := range r.CorruptIds {
			t.notes = append(t.notes, fmt.Sprintf("skipped corrupt record %s (see the coordinator log)", id))
		}
		if r.NextPageToken != "" {
			t.notes = append(t.notes, "more: fencectl list --page-token "+r.NextPageToken)
		}
		return c.show(view{data: r, tables: []table{t}})
	})
}

func (c *ctl) watchCommand(ctx context.Context, args []string, node string) error {
	switch {
	case len(args) == 1 && node != "":
		return usagef("want ID or --node NODE, not both")
	case len(args) == 0 && node == "":
		return usagef("want ID or --node NODE")
	}
	req := &coordv1.WatchFenceRequest{Node: node}
	if len(args) == 1 {
		req.Id = args[0]
	}
	_, err := c.watch(ctx, req, nil)
	return err
}

func (c *ctl) nodes(ctx context.Context) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).ListNodes(ctx, &coordv1.ListNodesRequest{}, opts...)
		if err != nil {
			return err
		}
		t := table{header: []string{"NODE", "READINESS", "ZONE", "CONNECTED", "LAST SEEN", "MEMORY AVAILABLE", "REASON"}}
		for _, n := range r.Nodes {
			mem := "-"
			if v, ok := n.Signals["memory.available"]; ok {
				mem = fmt.Sprintf("%dMi", v>>20)
			}
			t.rows = append(t.rows, []string{n.Name, word(n.Readiness), n.Region + "/" + n.Zone, strconv.FormatBool(n.Connected), ago(n.LastSeen), mem, n.Reason})
		}
		return c.show(view{data: r, tables: []table{t}})
	})
}

// status shows one node: the coordinator's view of it, its witnesses, its last fence record and,
// with check, a check of its fence devices.
func (c *ctl) status(ctx context.Context, node string, check bool) error {
	var n *coordv1.Node
	var last *coordv1.NodeFence
	var checks *coordv1.CheckNodeResponse
	var checkNote string
	err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).GetNode(ctx, &coordv1.GetNodeRequest{Node: node}, opts...)
		if err != nil {
			return err
		}
		n = r.Node
		fr, err := fenceClient(conn).ListFences(ctx, &coordv1.ListFencesRequest{Node: node, Limit: 1}, opts...)
		if err != nil {
			return err
		}
		if len(fr.Fences) > 0 {
			last = fr.Fences[0]
		}
		return nil
	})
	if err != nil {
		return err
	}
	if check {
		err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			var err error
			checks, err = clusterClient(conn).CheckNode(ctx, &coordv1.CheckNodeRequest{Node: node}, opts...)
			return err
		})
		switch status.Code(err) {
		case codes.OK:
		case codes.PermissionDenied, codes.NotFound:
			checkNote = "device check: " + status.Convert(err).Message()
		default:
			return err
		}
	}
	v := view{data: object{{"node", n}, {"lastFence", last}, {"deviceCheck", checks}}, tables: []table{nodeTable(n, last)}}
	if checks != nil {
		v.tables = append(v.tables, checkTable(checks))
	} else if checkNote != "" {
		v.tables = append(v.tables, table{notes: []string{checkNote}})
	}
	return c.show(v)
}

// nodeTable is one node's state and witnesses, and its last fence.
func nodeTable(n *coordv1.Node, last *coordv1.NodeFence) table {
	t := table{rows: [][]string{
		{"node:", n.Name},
		{"readiness:", fmt.Sprintf("%s since %s (%s)", word(n.Readiness), when(n.ReadinessChangedAt), n.Reason)},
		{"zone:", n.Region + "/" + n.Zone},
		{"agent:", fmt.Sprintf("connected %v, last seen %s, boot id %s", n.Connected, ago(n.LastSeen), orDash(n.BootId))},
	}}
	if n.KubeletLastSeen != nil || n.KubeletDown {
		t.rows = append(t.rows, []string{"kubelet:", fmt.Sprintf("last seen %s, down %v", ago(n.KubeletLastSeen), n.KubeletDown)})
	}
	if n.AgentDown {
		t.rows = append(t.rows, []string{"agent down:", "its kubelet reports: never tainted or fenced for it"})
	}
	if n.SilentSince != nil {
		t.rows = append(t.rows, []string{"silent:", fmt.Sprintf("agent and kubelet silent past their own windows since %s: a fence candidate (--fence-detect witnesses)", when(n.SilentSince))})
	}
	if n.WatchdogArmed {
		t.rows = append(t.rows, []string{"watchdog:", fmt.Sprintf("armed, timeout %s (reported by its agent)", n.WatchdogTimeout.AsDuration())})
	}
	if s := stallLine(n.StalledPercent); s != "" {
		t.rows = append(t.rows, []string{"pressure stall:", s})
	}
	if n.ShuttingDown {
		t.rows = append(t.rows, []string{"shutting down:", "announced a graceful shutdown"})
	}
	fencing := "not configured"
	if n.Fenceable {
		fencing = "configured"
	}
	if n.Observed {
		fencing += "; observe mode (automatic fences are recorded as would fence, nothing is switched)"
	}
	if n.ExcludedFromFencing {
		fencing += "; excluded from automatic fencing"
	}
	switch {
	case n.FenceBlocked != "":
		fencing += "; automatic fence held back: " + n.FenceBlocked
	case n.FenceRequested:
		fencing += "; automatic fence requested"
	case n.WouldFence:
		fencing += "; would fence (observe mode; see fencectl list --would)"
	}
	t.rows = append(t.rows, []string{"fencing:", fencing})
	lastFence := "none"
	if last != nil {
		lastFence = fmt.Sprintf("%s %s %s, %s (updated %s)", word(last.Action), last.Id, word(last.Status), word(last.Step), when(last.UpdatedAt))
		if last.Error != "" {
			lastFence += ": " + last.Error
		}
	}
	t.rows = append(t.rows, []string{"last fence:", lastFence})
	return t
}

// clip shortens s to n characters for a table cell, marking the cut; -o json and yaml show all.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// checkTable is a node's device check, one row per fence method.
func checkTable(r *coordv1.CheckNodeResponse) table {
	t := table{title: "fence devices:", header: []string{"METHOD", "DRIVER", "STEPS", "REACHABLE", "CREDENTIALS", "POWER", "LATENCY", "DETAIL"}}
	for _, d := range r.Checks {
		creds := "rejected"
		switch {
		case d.CredentialsOk:
			creds = "ok"
		case !d.Reachable:
			creds = "-"
		}
		t.rows = append(t.rows, []string{d.Method, d.Driver, strings.Join(d.Steps, ","), strconv.FormatBool(d.Reachable), creds,
			word(d.State), d.Latency.AsDuration().Round(time.Millisecond).String(), d.Detail})
	}
	if r.Ok {
		t.notes = append(t.notes, "every fence device of "+r.Node+" is reachable with its credentials accepted")
	} else {
		t.notes = append(t.notes, "FAILED: a fence device of "+r.Node+" is unreachable or refuses its credentials: fencing it would fail")
	}
	return t
}

// test checks a node's fence devices; it fails unless every one passed.
func (c *ctl) test(ctx context.Context, node string) error {
	var r *coordv1.CheckNodeResponse
	err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		var err error
		r, err = clusterClient(conn).CheckNode(ctx, &coordv1.CheckNodeRequest{Node: node}, opts...)
		return err
	})
	if err != nil {
		return err
	}
	if err := c.show(view{data: r, tables: []table{checkTable(r)}}); err != nil {
		return err
	}
	if !r.Ok {
		return fmt.Errorf("node %s: a fence device check failed", node)
	}
	return nil
}

func (c *ctl) zones(ctx context.Context) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).ListZones(ctx, &coordv1.ListZonesRequest{}, opts...)
		if err != nil {
			return err
		}
		t := table{header: []string{"ZONE", "STATE", "SIZE", "READY", "NOT READY", "POD RATE", "IN FLIGHT", "HELD", "GRANTED", "LOCAL", "FALLBACKS"}}
		for _, z := range r.Zones {
			t.rows = append(t.rows, []string{z.Key, word(z.State), itoa(z.Size), itoa(z.Ready), itoa(z.NotReady), fmt.Sprintf("%g/s", z.PodEvictionRate),
				fmt.Sprintf("%d/%d", z.PodEvictionsInFlight, z.PodEvictionsMaxInFlight), itoa(z.PodCandidatesHeld),
				strconv.FormatInt(z.PodEvictionsGranted, 10), strconv.FormatInt(z.PodEvictionsLocal, 10), strconv.FormatInt(z.PodEvictionFallbacks, 10)})
		}
		if r.EvictionsPaused {
			t.notes = append(t.notes, "evictions and automatic fencing are PAUSED (fencectl resume)")
		}
		return c.show(view{data: r, tables: []table{t}})
	})
}

func itoa(v int32) string { return strconv.Itoa(int(v)) }

// pause pauses (or resumes) pod evictions and automatic fencing; the state after is read back.
func (c *ctl) pause(ctx context.Context, pause bool, reason string) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		var err error
		if pause {
			_, err = clusterClient(conn).PauseEvictions(ctx, &coordv1.PauseEvictionsRequest{Reason: reason}, opts...)
		} else {
			_, err = clusterClient(conn).ResumeEvictions(ctx, &coordv1.ResumeEvictionsRequest{}, opts...)
		}
		if err != nil {
			return err
		}
		z, err := clusterClient(conn).ListZones(ctx, &coordv1.ListZonesRequest{}, opts...)
		if err != nil {
			return err
		}
		text := "resumed: pod evictions and automatic fencing run again"
		if z.EvictionsPaused {
			text = "paused: no pod evictions and no automatic fences until fencectl resume (manual fences still run)"
		}
		return c.show(view{data: object{{"evictionsPaused", z.EvictionsPaused}}, text: func(w io.Writer) error {
			_, err := fmt.Fprintln(w, text)
			return err
		}})
	})
}

func (c *ctl) leader(ctx context.Context) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).GetLeader(ctx, &coordv1.GetLeaderRequest{}, opts...)
		if err != nil {
			return err
		}
		t := table{header: []string{"LEADER", "ADDRESS", "EPOCH"}, rows: [][]string{{r.Id, r.Address, strconv.FormatInt(r.Epoch, 10)}}}
		return c.show(view{data: r, tables: []table{t}})
	})
}

func (c *ctl) audit(ctx context.Context, node string, limit int) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).ListAudit(ctx, &coordv1.ListAuditRequest{Node: node, Limit: int32(limit)}, opts...)
		if err != nil {
			return err
		}
		t := table{header: []string{"AT", "EPOCH", "KIND", "TEXT"}}
		for _, e := range r.Entries {
			t.rows = append(t.rows, []string{when(e.At), strconv.FormatInt(e.Epoch, 10), e.Kind, e.Text})
		}
		return c.show(view{data: r, tables: []table{t}})
	})
}

// configShow prints the coordinator's live configuration: its settings, then each node's fence
// methods with the identity their driver service must present and their parameters, secrets
// redacted by the coordinator.
func (c *ctl) configShow(ctx context.Context) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := clusterClient(conn).GetConfig(ctx, &coordv1.GetConfigRequest{}, opts...)
		if err != nil {
			return err
		}
		settings := table{title: "settings of replica " + r.ReplicaId + ":", header: []string{"FLAG", "VALUE", "FIELD"}}
		for _, s := range r.Settings {
			flagName := "-"
			if s.Flag != "" {
				flagName = "--" + strings.TrimLeft(s.Flag, "-")
			}
			settings.rows = append(settings.rows, []string{flagName, s.Value, s.Name})
		}
		fences := table{title: "fence configuration:", header: []string{"NODE", "ZONE", "STEP", "METHOD", "DRIVER", "ENDPOINT", "IDENTITY", "ACTION", "REQUIRED", "PARAMETERS"}}
		for _, n := range r.Nodes {
			for _, m := range n.Methods {
				keys := make([]string, 0, len(m.Parameters))
				for k := range m.Parameters {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for i, k := range keys {
					keys[i] = k + "=" + m.Parameters[k]
				}
				endpoint := m.Endpoint
				if len(m.Endpoints) > 1 {
					endpoint = strings.Join(m.Endpoints, ",") // tried in this order
				}
				fences.rows = append(fences.rows, []string{n.Node, n.Region + "/" + n.Zone, m.Step, m.Name, m.Driver, endpoint, m.PeerIdentity, m.Action,
					strconv.FormatBool(m.Required), strings.Join(keys, " ")})
			}
		}
		return c.show(view{data: r, tables: []table{settings, fences}})
	})
}

// listWould lists what observe mode would have done, newest first: each would-fence record, when it
// would have fenced the node, and when it would have released the node's pods.
func (c *ctl) listWould(ctx context.Context, node string, limit int, page string) error {
	return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		r, err := fenceClient(conn).ListFences(ctx, &coordv1.ListFencesRequest{Node: node,
			Status: coordv1.FenceStatus_FENCE_STATUS_OBSERVED, Limit: int32(limit), PageToken: page}, opts...)
		if err != nil {
			return err
		}
		t := table{header: []string{"ID", "NODE", "WOULD FENCE", "WOULD RELEASE", "STEP", "EVIDENCE"}}
		for _, f := range r.Fences {
			release := "-"
			if f.WouldReleaseAt != nil {
				release = when(f.WouldReleaseAt)
			}
			evidence := "-"
			if len(f.Evidence) > 0 {
				evidence = clip(f.Evidence[0], 60)
			}
			t.rows = append(t.rows, []string{f.Id, f.Node, when(f.CreatedAt), release, word(f.Step), evidence})
		}
		t.notes = append(t.notes, "observe mode: nothing above was switched, tainted or deleted")
		for _, id := range r.CorruptIds {
			t.notes = append(t.notes, fmt.Sprintf("skipped corrupt record %s (see the coordinator log)", id))
		}
		if r.NextPageToken != "" {
			t.notes = append(t.notes, "more: fencectl list --would --page-token "+r.NextPageToken)
		}
		return c.show(view{data: r, tables: []table{t}})
	})
}

// stallLine renders a node's pressure stall information: the share of the last 10 s each resource
// stalled some (or all) tasks, "" when the node reports none.
func stallLine(stalled map[string]float64) string {
	var parts []string
	for _, res := range []string{"cpu", "memory", "io"} {
		for _, kind := range []string{"some", "full"} {
			if p, ok := stalled["psi."+res+"."+kind]; ok {
				parts = append(parts, fmt.Sprintf("%s %s %.1f%%", res, kind, p))
			}
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, ", ") + " of the last 10 s stalled"
}
