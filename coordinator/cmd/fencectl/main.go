// Command fencectl is the operator's CLI for the nodefence coordinator: start and watch fences,
// confirm a node off by hand, and look at nodes, zones and the leader.
//
//	fencectl [--coordinator ADDR[,ADDR...]] [--insecure | --tls-*] COMMAND [flags] [ARGS]
//
// Commands: fence NODE, unfence NODE, ack NODE, get ID, list, watch ID|--node NODE, nodes, zones, leader.
// fence and unfence follow the record live until it is done (exit 0) or in error (exit 1).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/services/cli"
	"github.com/nodefence/nodefence/services/dial"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/tlsfiles"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

func main() {
	ctx, cancel := cli.SignalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

const usage = `usage: fencectl [global flags] COMMAND [flags] [ARGS]

commands:
  fence NODE [--reason R] [--no-watch]   power a node off, confirmed by read-back; follows progress
  unfence NODE [--reason R] [--no-watch] power a node back on, confirmed by read-back
  ack NODE [--reason R] [--force]         confirm by hand that a node is off (like stonith_admin --confirm);
                                          you are the operator your certificate names
  get ID                                  show one fence record
  list [--node N] [--status S] [--limit N] list fence records, newest first
  watch ID | --node NODE                  follow a fence record until it is done or in error
  nodes                                   list nodes with readiness and last contact
  zones                                   list zones: disruption state, and the pod-eviction budget
                                          (rate, grants in flight/cap, candidates held, granted, local)
  leader                                  show the leader replica and its epoch
  audit [--node N] [--limit N]            the coordinator's audit trail: every decision, oldest first
  certs --dir DIR ROLE/NAME...            issue a CA and certificates with nodefence identities (offline)
  config check PATH                       validate a fence configuration offline (standalone YAML, or the
                                          seed's ConfigMaps: a file or a directory) and print each node's plan

global flags:
`

type ctl struct {
	addrs   []string
	tls     tlsfiles.Files
	timeout time.Duration
	perAddr time.Duration
	json    bool
	out     io.Writer
	conn    *grpc.ClientConn
	addr    string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fencectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	c := &ctl{out: stdout}
	addrs := fs.String("coordinator", "127.0.0.1:7001", "coordinator address(es), comma-separated; the leader is found by itself")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "overall deadline")
	fs.DurationVar(&c.perAddr, "per-address-timeout", 10*time.Second, "deadline of each coordinator address (a call, or reaching it for a watch)")
	fs.BoolVar(&c.json, "json", false, "print protobuf JSON instead of text")
	c.tls.RegisterFlags(fs, "", "the coordinator connection")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for _, a := range strings.Split(*addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.addrs = append(c.addrs, a)
		}
	}
	var problems []string
	if len(c.addrs) == 0 {
		problems = append(problems, "--coordinator: at least one address is required")
	}
	if c.perAddr <= 0 {
		problems = append(problems, "--per-address-timeout: must be positive")
	}
	for _, e := range c.tls.Validate("", false) {
		problems = append(problems, e.Error())
	}
	if fs.NArg() == 0 {
		problems = append(problems, "COMMAND: missing (fence, unfence, ack, get, list, watch, nodes, zones, leader, config)")
	}
	if fs.NArg() > 0 && fs.Arg(0) == "config" {
		// Offline: no coordinator, no TLS.
		return configCheck(fs.Args()[1:], stdout, stderr)
	}
	if fs.NArg() > 0 && fs.Arg(0) == "certs" {
		return certsCommand(fs.Args()[1:], stdout, stderr)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "fencectl:", p)
		}
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	defer func() {
		if c.conn != nil {
			c.conn.Close()
		}
	}()
	err := c.dispatch(ctx, fs.Arg(0), fs.Args()[1:], stderr)
	var usageErr usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usageErr):
		fmt.Fprintln(stderr, "fencectl:", err)
		return 2
	default:
		if s, ok := status.FromError(err); ok {
			fmt.Fprintf(stderr, "fencectl: %s: %s\n", s.Code(), s.Message())
		} else {
			fmt.Fprintln(stderr, "fencectl:", err)
		}
		return 1
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func (c *ctl) dispatch(ctx context.Context, cmd string, args []string, stderr io.Writer) error {
	sub := flag.NewFlagSet("fencectl "+cmd, flag.ContinueOnError)
	sub.SetOutput(stderr)
	reason := sub.String("reason", "", "reason recorded with the record")
	noWatch := sub.Bool("no-watch", false, "return once the record is written")
	operator := sub.String("operator", "", "ack: must equal your certificate's operator name if given (who you are comes from the certificate)")
	force := sub.Bool("force", false, "ack: acknowledge although the node's agent or kubelet still reports (needs --reason)")
	node := sub.String("node", "", "node filter (list, watch)")
	statusF := sub.String("status", "", "status filter: new, running, done, error (list)")
	limit := sub.Int("limit", 0, "most records per page (list)")
	pageToken := sub.String("page-token", "", "continue a listing where the previous page ended (list)")
	// Accept flags before or after positional arguments.
	var pos []string
	for len(args) > 0 {
		if err := sub.Parse(args); err != nil {
			return usageError{err.Error()}
		}
		if sub.NArg() == 0 {
			break
		}
		pos = append(pos, sub.Arg(0))
		args = sub.Args()[1:]
	}
	need := func(n int, what string) error {
		if len(pos) != n {
			return usageError{fmt.Sprintf("%s: want %s", cmd, what)}
		}
		return nil
	}
	fc := func(conn *grpc.ClientConn) coordv1.FenceServiceClient { return coordv1.NewFenceServiceClient(conn) }
	cc := func(conn *grpc.ClientConn) coordv1.ClusterServiceClient { return coordv1.NewClusterServiceClient(conn) }
	switch cmd {
	case "fence", "unfence":
		if err := need(1, "NODE"); err != nil {
			return err
		}
		var rec *coordv1.NodeFence
		err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			if cmd == "fence" {
				r, err := fc(conn).Fence(ctx, &coordv1.FenceRequest{Node: pos[0], Reason: *reason}, opts...)
				rec = r.GetFence()
				return err
			}
			r, err := fc(conn).Unfence(ctx, &coordv1.UnfenceRequest{Node: pos[0], Reason: *reason}, opts...)
			rec = r.GetFence()
			return err
		})
		if err != nil {
			return err
		}
		if *noWatch {
			return c.print(rec)
		}
		return c.watch(ctx, &coordv1.WatchFenceRequest{Id: rec.Id})
	case "ack":
		if err := need(1, "NODE"); err != nil {
			return err
		}
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := fc(conn).Acknowledge(ctx, &coordv1.AcknowledgeRequest{Node: pos[0], Operator: *operator, Reason: *reason, Force: *force}, opts...)
			if err != nil {
				return err
			}
			return c.print(r.Fence)
		})
	case "get":
		if err := need(1, "ID"); err != nil {
			return err
		}
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := fc(conn).GetFence(ctx, &coordv1.GetFenceRequest{Id: pos[0]}, opts...)
			if err != nil {
				return err
			}
			return c.print(r.Fence)
		})
	case "list":
		if err := need(0, "no arguments"); err != nil {
			return err
		}
		st := coordv1.FenceStatus_FENCE_STATUS_UNSPECIFIED
		if *statusF != "" {
			v, ok := coordv1.FenceStatus_value["FENCE_STATUS_"+strings.ToUpper(*statusF)]
			if !ok {
				return usageError{fmt.Sprintf("--status: %q is not one of new, running, done, error", *statusF)}
			}
			st = coordv1.FenceStatus(v)
		}
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := fc(conn).ListFences(ctx, &coordv1.ListFencesRequest{Node: *node, Status: st, Limit: int32(*limit), PageToken: *pageToken}, opts...)
			if err != nil {
				return err
			}
			if c.json {
				return c.print(r)
			}
			tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNODE\tACTION\tSTATUS\tCREATED\tERROR")
			for _, f := range r.Fences {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Id, f.Node, short(f.Action.String()), short(f.Status.String()),
					f.CreatedAt.AsTime().Local().Format(time.DateTime), f.Error)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, id := range r.CorruptIds {
				fmt.Fprintf(c.out, "skipped corrupt record %s (see the coordinator log)\n", id)
			}
			if r.NextPageToken != "" {
				fmt.Fprintf(c.out, "more: fencectl list --page-token %s\n", r.NextPageToken)
			}
			return nil
		})
	case "watch":
		if len(pos) > 1 || (len(pos) == 0 && *node == "") {
			return usageError{"watch: want ID or --node NODE"}
		}
		req := &coordv1.WatchFenceRequest{Node: *node}
		if len(pos) == 1 {
			req.Id = pos[0]
		}
		return c.watch(ctx, req)
	case "nodes":
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := cc(conn).ListNodes(ctx, &coordv1.ListNodesRequest{}, opts...)
			if err != nil {
				return err
			}
			if c.json {
				return c.print(r)
			}
			tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tREADINESS\tZONE\tCONNECTED\tLAST SEEN\tMEMORY AVAILABLE\tREASON")
			for _, n := range r.Nodes {
				seen := "never"
				if n.LastSeen != nil {
					seen = time.Since(n.LastSeen.AsTime()).Round(100*time.Millisecond).String() + " ago"
				}
				mem := "-"
				if v, ok := n.Signals["memory.available"]; ok {
					mem = fmt.Sprintf("%dMi", v>>20)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%s\n", n.Name, short(n.Readiness.String()), n.Region+"/"+n.Zone, n.Connected, seen, mem, n.Reason)
			}
			return tw.Flush()
		})
	case "zones":
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := cc(conn).ListZones(ctx, &coordv1.ListZonesRequest{}, opts...)
			if err != nil {
				return err
			}
			if c.json {
				return c.print(r)
			}
			tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "ZONE\tSTATE\tSIZE\tREADY\tNOT READY\tPOD RATE\tIN FLIGHT\tHELD\tGRANTED\tLOCAL\tFALLBACKS\t(evictions paused: %v)\n", r.EvictionsPaused)
			for _, z := range r.Zones {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%g/s\t%d/%d\t%d\t%d\t%d\t%d\n", z.Key, short(z.State.String()), z.Size, z.Ready, z.NotReady,
					z.PodEvictionRate, z.PodEvictionsInFlight, z.PodEvictionsMaxInFlight, z.PodCandidatesHeld, z.PodEvictionsGranted, z.PodEvictionsLocal, z.PodEvictionFallbacks)
			}
			return tw.Flush()
		})
	case "audit":
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := cc(conn).ListAudit(ctx, &coordv1.ListAuditRequest{Node: *node, Limit: int32(*limit)}, opts...)
			if err != nil {
				return err
			}
			if c.json {
				return c.print(r)
			}
			for _, e := range r.Entries {
				fmt.Fprintf(c.out, "%s  epoch %d  %-16s %s\n", e.At.AsTime().Local().Format("2006-01-02 15:04:05.000"), e.Epoch, e.Kind, e.Text)
			}
			return nil
		})
	case "leader":
		return c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			r, err := cc(conn).GetLeader(ctx, &coordv1.GetLeaderRequest{}, opts...)
			if err != nil {
				return err
			}
			if c.json {
				return c.print(r)
			}
			fmt.Fprintf(c.out, "leader %s at %s, epoch %d\n", r.Id, r.Address, r.Epoch)
			return nil
		})
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// call runs fn against the coordinators in turn, following a follower's pointer to the leader.
func (c *ctl) call(ctx context.Context, fn func(context.Context, *grpc.ClientConn, ...grpc.CallOption) error) error {
	return c.try(ctx, true, fn)
}

// stream is call for a server stream: the per-address deadline bounds only reaching the coordinator.
func (c *ctl) stream(ctx context.Context, fn func(context.Context, *grpc.ClientConn, ...grpc.CallOption) error) error {
	return c.try(ctx, false, fn)
}

// try runs fn against the last coordinator that answered, then every address, following leader
// redirects. Each address has its own deadline (--per-address-timeout), so a coordinator that is cut
// off cannot use up the whole --timeout before a healthy one is asked.
func (c *ctl) try(ctx context.Context, bounded bool, fn func(context.Context, *grpc.ClientConn, ...grpc.CallOption) error) error {
	queue := append([]string(nil), c.addrs...)
	if c.addr != "" {
		queue = append([]string{c.addr}, queue...)
	}
	tried := map[string]bool{}
	var last error
	for len(queue) > 0 {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		if c.conn == nil || c.addr != addr {
			if c.conn != nil {
				c.conn.Close()
			}
			conn, err := dial.New(addr, c.tls)
			if err != nil {
				return err
			}
			c.conn, c.addr = conn, addr
		}
		actx, cancel := context.WithTimeout(ctx, c.perAddr)
		var trailer metadata.MD
		err := ready(actx, c.conn)
		if err == nil {
			fctx := ctx
			if bounded {
				fctx = actx
			}
			err = fn(fctx, c.conn, grpc.Trailer(&trailer))
		}
		timedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if timedOut && (status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)) {
			err = status.Errorf(codes.Unavailable, "%s did not answer within %s", addr, c.perAddr)
		}
		if status.Code(err) != codes.Unavailable {
			return err
		}
		last = err
		if l := fault.LeaderFromTrailer(trailer); l != "" && !tried[l] {
			queue = append([]string{l}, queue...)
		}
	}
	return last
}

// ready waits until conn is connected, or ctx ends.
func ready(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return status.Error(codes.Unavailable, "cannot connect")
		}
		if !conn.WaitForStateChange(ctx, s) {
			return status.Errorf(codes.Unavailable, "cannot connect: %v", ctx.Err())
		}
	}
}

// watch follows a record and prints each change; the error reports an ERROR outcome.
func (c *ctl) watch(ctx context.Context, req *coordv1.WatchFenceRequest) error {
	var final *coordv1.NodeFence
	err := c.stream(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		stream, err := coordv1.NewFenceServiceClient(conn).WatchFence(ctx, req, opts...)
		if err != nil {
			return err
		}
		seen := 0
		for {
			r, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			final = r.Fence
			if c.json {
				if err := c.print(r.Fence); err != nil {
					return err
				}
				continue
			}
			seen = c.progress(r.Fence, seen)
		}
	})
	if err != nil {
		return err
	}
	if final == nil {
		return errors.New("watch ended without a record")
	}
	if final.Status == coordv1.FenceStatus_FENCE_STATUS_ERROR {
		return fmt.Errorf("fence %s of %s ended in ERROR: %s", final.Id, final.Node, final.Error)
	}
	if final.Status != coordv1.FenceStatus_FENCE_STATUS_DONE {
		return fmt.Errorf("fence %s of %s not finished (%s)", final.Id, final.Node, short(final.Status.String()))
	}
	return nil
}

// progress prints the record's new operations and status as timeline lines; it returns the number
// of operation states printed so far.
func (c *ctl) progress(f *coordv1.NodeFence, printed int) int {
	ts := f.GetUpdatedAt().AsTime().Local().Format("15:04:05.000")
	var lines []string
	for _, op := range f.Operations {
		lines = append(lines, fmt.Sprintf("%s  %s  %s %s via %s (epoch %d) sent", op.StartedAt.AsTime().Local().Format("15:04:05.000"), f.Node, op.Method, op.Action, op.Driver, op.Epoch))
		if op.Result != coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			line := fmt.Sprintf("%s  %s  %s %s -> %s, read back %s in %s", op.FinishedAt.AsTime().Local().Format("15:04:05.000"), f.Node, op.Method, op.Action,
				short(op.Result.String()), short(op.State.String()), op.Elapsed.AsDuration().Round(time.Millisecond))
			if op.Error != "" {
				line += ": " + op.Error
			}
			lines = append(lines, line)
		}
	}
	lines = append(lines, fmt.Sprintf("%s  %s  fence %s %s", ts, f.Node, f.Id, short(f.Status.String())))
	// Status lines repeat; operation lines are printed once each.
	for i, l := range lines {
		if i < printed && i < len(lines)-1 {
			continue
		}
		fmt.Fprintln(c.out, l)
	}
	return len(lines) - 1
}

func (c *ctl) print(m proto.Message) error {
	if c.json {
		b, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.out, string(b))
		return err
	}
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, string(b))
	return err
}

// configCheck validates a fence configuration and prints the resolved plan, secrets masked.
func configCheck(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprintln(stderr, "fencectl: usage: fencectl config check PATH")
		return 2
	}
	c, err := fenceconfig.LoadAny(args[1], nil)
	if err != nil {
		var inv fault.Invalid
		if errors.As(err, &inv) {
			fmt.Fprintf(stderr, "%s: %d problem(s):\n", args[1], len(inv))
			for _, fe := range inv {
				fmt.Fprintln(stderr, "  -", fe.Error())
			}
		} else {
			fmt.Fprintln(stderr, "fencectl:", err)
		}
		return 1
	}
	var bad []string
	for _, node := range c.NodeNames() {
		for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
			ms, _ := c.Plan(node, step)
			for _, m := range ms {
				for _, p := range checkMethod(m) {
					bad = append(bad, fmt.Sprintf("nodes.%s.methods.%s (driver %s): %s", node, m.Name, m.Driver, p))
				}
			}
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		bad = slices.Compact(bad)
		fmt.Fprintf(stderr, "%s: %d problem(s):\n", args[1], len(bad))
		for _, p := range bad {
			fmt.Fprintln(stderr, "  -", p)
		}
		return 1
	}
	for _, node := range c.NodeNames() {
		fmt.Fprintf(stdout, "node %s\n", node)
		for _, step := range []string{fenceconfig.StepIsolation, fenceconfig.StepPowerManagement, fenceconfig.StepRecovery} {
			ms, _ := c.Plan(node, step)
			if len(ms) == 0 {
				fmt.Fprintf(stdout, "  %s: (none)\n", step)
				continue
			}
			fmt.Fprintf(stdout, "  %s:\n", step)
			for i, m := range ms {
				req := ""
				if m.Required {
					req = ", must succeed"
				}
				fmt.Fprintf(stdout, "    %d. %s: %s via %s%s\n", i+1, m.Name, m.Action, m.Driver, req)
				keys := make([]string, 0, len(m.Parameters))
				for k := range m.Parameters {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					v := m.Parameters[k]
					if secretFor(m.Driver, k) {
						v = "***"
					}
					fmt.Fprintf(stdout, "       %s=%s\n", k, v)
				}
			}
		}
	}
	fmt.Fprintf(stdout, "%d node(s), configuration valid\n", len(c.NodeNames()))
	return 0
}

func short(enum string) string { return cli.EnumWord(enum) }
