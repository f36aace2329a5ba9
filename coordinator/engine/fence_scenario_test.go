package engine

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/coordinator/fencing"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/identity"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
)

// The fence flow in the scenario scripts: the engine decides to fence (its Ready's Fences); the
// production code builds the record (FenceRequest.Record), runs it (fencing.Decide), writes each
// version (fencing.Stamp) and each driver answer (fencing.Answer), hands it to the engine
// (RecordWritten), accepts or refuses an acknowledgement, judges the proof, writes the
// wrong-machine alarm (fencing.WrongMachine) and gates the release (coordinator/release; the
// release command, release_scenario_test.go). The harness plays the store (one record per node,
// the latest; "active" while unfinished, as store.CreateFence sees it), the drivers (the driver
// command) and the random part of a node's delay. What stays outside: etcd, the Kubernetes checks
// of coordinator/app (needsFencing) and the reconciler's own I/O (taint, pod deletion, Events).

// fenceFlow is the harness's fence state, created by the first fence-plan.
type fenceFlow struct {
	cfg     fenceconfig.Config
	policy  fencing.Policy
	epoch   int64
	records map[string]*coordv1.NodeFence // by node: its latest record
}

func (h *harness) flow() *fenceFlow {
	if h.fence == nil {
		h.fence = &fenceFlow{
			cfg:     fenceconfig.Config{Drivers: map[string]fenceconfig.Driver{"d": {Endpoint: "127.0.0.1:1"}}, Nodes: map[string]fenceconfig.Node{}},
			policy:  fencing.DefaultPolicy(),
			epoch:   1,
			records: map[string]*coordv1.NodeFence{},
		}
	}
	return h.fence
}

func (h *harness) plan(node string) func(string) ([]fenceconfig.Resolved, error) {
	return func(step string) ([]fenceconfig.Resolved, error) { return h.flow().cfg.Plan(node, step) }
}

// handleFencePlan gives nodes a fence configuration: the methods of each step, in order, each
// "name" or "name:action" (default: off, on in recovery), all on one driver.
//
//	fence-plan a1..a3 power=bmc,pdu [isolation=fc] [recovery=fc-on] [required=pdu] [delay=7s] [random-delay=2s]
func (h *harness) handleFencePlan(pos []string, args map[string]string) []string {
	f := h.flow()
	for _, node := range h.expand(pos) {
		n := fenceconfig.Node{Methods: map[string]fenceconfig.Method{}, Steps: map[string][]string{}}
		for key, step := range map[string]string{"isolation": fenceconfig.StepIsolation, "power": fenceconfig.StepPowerManagement, "recovery": fenceconfig.StepRecovery} {
			if args[key] == "" {
				continue
			}
			for _, m := range strings.Split(args[key], ",") {
				name, action, _ := strings.Cut(m, ":")
				method := fenceconfig.Method{Driver: "d", Action: action}
				if strings.Contains(","+args["required"]+",", ","+name+",") {
					must := true
					method.MustSuccess = &must
				}
				n.Methods[name] = method
				n.Steps[step] = append(n.Steps[step], name)
			}
		}
		n.Delay.Duration, n.RandomDelay.Duration = h.optDur(args["delay"]), h.optDur(args["random-delay"])
		f.cfg.Nodes[node] = n
	}
	if err := f.cfg.Validate(); err != nil {
		h.t.Fatalf("fence-plan: %v", err)
	}
	return nil
}

// handleFencePolicy sets the fence flow's retry, wait and polling policy (fencing.Policy).
//
//	fence-policy retries=2 backoff=10s isolation-wait=1m polls=3 poll-interval=10s
func (h *harness) handleFencePolicy(args map[string]string) []string {
	p := &h.flow().policy
	for k, v := range args {
		switch k {
		case "retries":
			p.Retries = int(h.float(v))
		case "backoff":
			p.Backoff = h.dur(v)
		case "isolation-wait":
			p.IsolationWait = h.dur(v)
		case "polls":
			p.Polls = int(h.float(v))
		case "poll-interval":
			p.PollInterval = h.dur(v)
		default:
			h.t.Fatalf("fence-policy: unknown key %s", k)
		}
	}
	return nil
}

// autoFences creates the record of each automatic fence request of a Ready (FenceRequest.Record,
// as coordinator/app does), for the nodes with a fence-plan (others print nothing, so scripts
// without the fence flow are unchanged). The random part of a node's delay is drawn as the middle
// of its range.
func (h *harness) autoFences(reqs []FenceRequest) []string {
	var out []string
	for _, req := range reqs {
		if h.fence == nil {
			break
		}
		nc, ok := h.fence.cfg.Nodes[req.Node]
		if !ok {
			continue
		}
		delay := fencing.NodeDelay(nc.Delay.Duration, nc.RandomDelay.Duration, func(n int64) int64 { return n / 2 })
		out = append(out, h.create(req.Record(h.plan(req.Node), delay, h.fence.epoch, h.now))...)
	}
	return out
}

// create stores a new record unless the node has an active one (store.CreateFence's rule).
func (h *harness) create(rec *coordv1.NodeFence) []string {
	if cur := h.fence.records[rec.Node]; cur != nil && cur.FinishedAt == nil {
		return []string{fmt.Sprintf("%s: active record %s kept", rec.Node, cur.Id)}
	}
	h.keep(rec)
	return []string{h.summary(rec)}
}

// keep stores the node's newest record and hands it to the engine (RecordWritten), as every
// writer of coordinator/app and api does.
func (h *harness) keep(rec *coordv1.NodeFence) {
	h.fence.transition(h.fence.records[rec.Node], rec)
	h.fence.records[rec.Node] = rec
	for _, in := range RecordWritten(rec, h.now) {
		h.e.Step(in)
	}
}

// handleFence is an operator's fence or unfence through the API (as alice): refused when it would
// take the last ready control-plane member (power-off only); an active record of the node is
// returned as is, or refused when its action differs (fencing.Joined).
//
//	fence a1 | unfence a1
func (h *harness) handleFence(cmd string, pos []string) []string {
	action := coordv1.FenceAction_FENCE_ACTION_OFF
	if cmd == "unfence" {
		action = coordv1.FenceAction_FENCE_ACTION_ON
	}
	node := h.one(cmd, pos)
	if action == coordv1.FenceAction_FENCE_ACTION_OFF {
		if why := h.e.FenceRefusal(node); why != "" {
			return []string{"refused: " + why}
		}
	}
	if cur := h.flow().records[node]; cur != nil && cur.FinishedAt == nil {
		if err := fencing.Joined(cur, action); err != nil {
			return []string{"refused: " + err.Error()}
		}
	}
	alice := identity.Identity{Role: identity.Operator, Name: "alice"}
	return h.create(fencing.OperatorRecord(node, action, "operator", alice.String(), h.plan(node), h.fence.epoch, h.now))
}

// handleDecide runs fencing.Decide on the node's record, writing each next version (as the runner
// does, under the harness's epoch, which leader-change raises), until the record waits for a
// driver's answer or for time, or is finished. The facts are the engine's: the node's readiness,
// its kernel dump and its latest witness contact (the re-check before every call).
//
//	decide a1
func (h *harness) handleDecide(pos []string) []string {
	node := h.one("decide", pos)
	rec := h.record(node)
	var out []string
	for range 50 {
		n := h.e.Node(node)
		d := fencing.Decide(rec, fencing.Facts{Now: h.now, Plan: h.plan(node), Policy: h.fence.policy,
			NodeReady: fencing.Alive(n), KdumpUntil: h.e.KdumpUntil(node), Contact: h.e.Contact(node)})
		switch {
		case d.Resend != nil:
			// The runner sends this term's epoch, even for an operation a previous leader wrote.
			return append(out, fmt.Sprintf("%s: call %s %s (operation %s, epoch %d)", node, d.Resend.Method, d.Resend.Action, d.Resend.OperationId, h.fence.epoch))
		case d.Next != nil:
			written := len(rec.Operations)
			rec = h.write(d.Next)
			if len(rec.Operations) > written {
				op := rec.Operations[len(rec.Operations)-1]
				out = append(out, fmt.Sprintf("%s: write operation %s before the call", node, op.OperationId))
				continue
			}
			out = append(out, h.summary(rec))
		case d.Wait > 0:
			return append(out, fmt.Sprintf("%s: wait %s", node, d.Wait))
		default:
			return append(out, fmt.Sprintf("%s: nothing to do", node))
		}
	}
	h.t.Fatalf("decide %s: no end after 50 versions", node)
	return nil
}

// write is the runner's write of a record version (fencing.Stamp under the harness's epoch).
func (h *harness) write(next *coordv1.NodeFence) *coordv1.NodeFence {
	fencing.Stamp(next, h.fence.epoch, h.now)
	h.keep(next)
	return next
}

// handleDriver answers the node's pending driver call (fencing.Record): confirmed (the requested
// state read back), failed (an error), or the state the device read back.
//
//	driver a1 confirmed | driver a1 failed [error=timeout] | driver a1 state=unknown|on|off
func (h *harness) handleDriver(pos []string, args map[string]string) []string {
	if len(pos) < 1 {
		h.t.Fatal("driver: want a node")
	}
	node := pos[0]
	rec := h.record(node)
	var op *coordv1.Operation
	for _, o := range rec.Operations {
		if o.Result == coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			op = o
		}
	}
	if op == nil {
		h.t.Fatalf("driver %s: no call is pending", node)
	}
	state := driverv1.PowerState_POWER_STATE_OFF
	if op.Action == "on" {
		state = driverv1.PowerState_POWER_STATE_ON
	}
	var callErr error
	switch {
	case len(pos) > 1 && pos[1] == "confirmed":
	case len(pos) > 1 && pos[1] == "failed":
		state, callErr = driverv1.PowerState_POWER_STATE_UNKNOWN, errors.New(args["error"])
	case args["state"] != "":
		state = driverv1.PowerState(driverv1.PowerState_value["POWER_STATE_"+strings.ToUpper(args["state"])])
	default:
		h.t.Fatalf("driver %s: want confirmed, failed or state=", node)
	}
	next := proto.Clone(rec).(*coordv1.NodeFence)
	fencing.Answer(next, op.OperationId, state, callErr, args["error"], h.now, time.Second, h.fence.epoch)
	rec = h.write(next)
	for _, o := range rec.Operations {
		if o.OperationId == op.OperationId {
			line := fmt.Sprintf("%s: %s %s %s", node, o.Method, o.Action, cli.EnumWord(o.Result.String()))
			if o.Error != "" {
				line += ": " + o.Error
			}
			return []string{line, h.summary(rec)}
		}
	}
	return nil
}

// handleAck is an operator's acknowledgement through the API (the rules of fencing: AckCaller,
// Witness, AckNote, AckAudit, Acknowledged). The caller is role:name from the client certificate,
// or "any" on a server without client certificates; the node's witnesses are the engine's view of
// its agent and, with kube=true, its kubelet (alive unless kubelet-silence). Reasons are one word.
//
//	ack a1 [caller=operator:alice|any] [operator=bob] [force=true] [reason=pulled-the-plug]
func (h *harness) handleAck(pos []string, args map[string]string) []string {
	node := h.one("ack", pos)
	caller := identity.Identity{Role: identity.Operator, Name: "alice"}
	if c := args["caller"]; c == "any" {
		caller = identity.Identity{Role: identity.Any}
	} else if c != "" {
		role, name, _ := strings.Cut(c, ":")
		caller = identity.Identity{Role: identity.Role(role), Name: name}
	}
	who, err := fencing.AckCaller(caller, args["operator"])
	if err != nil {
		return []string{"refused: " + err.Error()}
	}
	live := fencing.Witness(h.e.Node(node), h.cfg.KubeletWitness && !h.kdead[node])
	note, err := fencing.AckNote(node, live, args["reason"], args["force"] == "true")
	if err != nil {
		return []string{"refused: " + err.Error()}
	}
	out := []string{"audit: " + fencing.AckAudit(who, node, note)}
	var cur *coordv1.NodeFence
	if r := h.flow().records[node]; r != nil && r.FinishedAt == nil {
		cur = r
	}
	next, err := fencing.Acknowledged(cur, fencing.Ack{Node: node, Operator: who, Note: note, RequestedBy: caller.String(), Epoch: h.fence.epoch}, h.now)
	if err != nil {
		return append(out, "refused: "+err.Error())
	}
	h.keep(next)
	return append(out, h.summary(next))
}

// handleProof prints the engine's verdict on the node's newest record (the proof rules of
// coordinator/fencing applied to every witness it heard; agents send a heartbeat every second in
// the scripts, kubelets renew every 10 s) and which witness spoke after the power-off.
//
//	proof a1
func (h *harness) handleProof(pos []string) []string {
	node := h.one("proof", pos)
	rec := h.record(node)
	if !fencing.NeedsProof(rec) {
		return []string{fmt.Sprintf("%s: no proof to check (not a driver-confirmed power-off)", node)}
	}
	id, v, spoke := h.e.Proof(node)
	if id != rec.Id {
		h.t.Fatalf("proof %s: the engine judges record %q, not the newest %s", node, id, rec.Id)
	}
	line := fmt.Sprintf("%s: proof %s (confirmed off t=%s)", node, v, rec.ConfirmedOffAt.AsTime().Sub(h.start))
	if spoke != "" {
		line += "; " + h.relative(spoke)
	}
	return []string{line}
}

// relative rewrites the RFC 3339 times of the scripts' day in text as t=<elapsed>.
func (h *harness) relative(text string) string {
	var out []string
	for _, w := range strings.Fields(text) {
		if at, err := time.Parse(time.RFC3339Nano, strings.TrimRight(w, ",:;")); err == nil {
			w = "t=" + at.Sub(h.start).String() + w[len(strings.TrimRight(w, ",:;")):]
		}
		out = append(out, w)
	}
	return strings.Join(out, " ")
}

// alarms writes each wrong-machine verdict on its record (fencing.WrongMachine), as
// coordinator/app does.
func (h *harness) alarms(proofs []ProofResult) {
	for _, p := range proofs {
		if r := h.fence.records[p.Node]; p.Verdict == fencing.ProofWrongMachine && r != nil && r.Id == p.Fence {
			if next := fencing.WrongMachine(r, p.At, p.Why); next != nil {
				h.keep(next)
			}
		}
	}
}

// handleDisconnect closes the agents' streams (a silent agent's stream stays open until then).
//
//	disconnect a1..a3
func (h *harness) handleDisconnect(pos []string) []string {
	for _, n := range h.expand(pos) {
		h.e.Step(Disconnected{Node: n})
	}
	return h.drain()
}

// handleFenceRecord prints the node's latest record in full.
//
//	fence-record a1
func (h *harness) handleFenceRecord(pos []string) []string {
	rec := h.record(h.one("fence-record", pos))
	out := []string{h.summary(rec), fmt.Sprintf("  reason: %s; requested by %s; epoch %d", rec.Reason, rec.RequestedBy, rec.Epoch)}
	if rec.Error != "" {
		out = append(out, "  error: "+rec.Error)
	}
	for _, e := range rec.Evidence {
		out = append(out, "  evidence: "+e)
	}
	for _, op := range rec.Operations {
		line := fmt.Sprintf("  operation %s (epoch %d): %s", op.OperationId, op.Epoch, cli.EnumWord(op.Result.String()))
		if op.State != driverv1.PowerState_POWER_STATE_UNSPECIFIED {
			line += " read back " + cli.EnumWord(op.State.String())
		}
		if op.Error != "" {
			line += ": " + op.Error
		}
		out = append(out, line)
	}
	return out
}

// summary is one line about a record: id, action, step, status and what is set of the rest.
func (h *harness) summary(r *coordv1.NodeFence) string {
	s := fmt.Sprintf("record %s: %s %s %s", r.Id, cli.EnumWord(r.Action.String()), cli.EnumWord(r.Step.String()), cli.EnumWord(r.Status.String()))
	if r.Automatic {
		s += " automatic"
	}
	if r.Retries > 0 {
		s += fmt.Sprintf(" retries=%d", r.Retries)
	}
	if r.NextAttemptAt != nil && r.Status == coordv1.FenceStatus_FENCE_STATUS_NEW {
		s += fmt.Sprintf(" next-attempt=t=%s", r.NextAttemptAt.AsTime().Sub(h.start))
	}
	if r.ConfirmedOffAt != nil {
		s += fmt.Sprintf(" confirmed-off=t=%s", r.ConfirmedOffAt.AsTime().Sub(h.start))
	}
	if r.AcknowledgedBy != "" {
		s += " acknowledged-by=" + r.AcknowledgedBy
	}
	if r.FinishedAt != nil {
		s += fmt.Sprintf(" finished=t=%s", r.FinishedAt.AsTime().Sub(h.start))
	}
	return s
}

func (h *harness) record(node string) *coordv1.NodeFence {
	r := h.flow().records[node]
	if r == nil {
		h.t.Fatalf("node %s has no fence record", node)
	}
	return r
}

func (h *harness) one(cmd string, pos []string) string {
	if len(pos) != 1 {
		h.t.Fatalf("%s: want one node, got %q", cmd, pos)
	}
	return pos[0]
}

func (h *harness) optDur(s string) time.Duration {
	if s == "" {
		return 0
	}
	return h.dur(s)
}
