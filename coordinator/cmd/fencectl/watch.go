package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/nodefence/nodefence/services/cli"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// follow starts a record with start and follows it to its end, unless noWatch.
func (c *ctl) follow(ctx context.Context, noWatch bool, start func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) (*coordv1.NodeFence, error)) (*coordv1.NodeFence, error) {
	var rec *coordv1.NodeFence
	err := c.call(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		var err error
		rec, err = start(ctx, conn, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if noWatch {
		return rec, c.showRecord(rec)
	}
	return c.watch(ctx, &coordv1.WatchFenceRequest{Id: rec.Id}, rec)
}

// watch follows a record and prints each change once. Its error reports an outcome other than DONE;
// when the operator stops it (Ctrl-C) or the deadline passes, it says the fence goes on and how to
// follow it again. known, if set, is the record as it was started.
func (c *ctl) watch(ctx context.Context, req *coordv1.WatchFenceRequest, known *coordv1.NodeFence) (*coordv1.NodeFence, error) {
	final := known
	p := newProgress(c.out)
	err := c.stream(ctx, func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		stream, err := fenceClient(conn).WatchFence(ctx, req, opts...)
		if err != nil {
			return err
		}
		for {
			r, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			final = r.Fence
			if c.output != "table" {
				if err := c.showStreamed(r.Fence); err != nil {
					return err
				}
				continue
			}
			p.show(r.Fence)
		}
	})
	if err != nil {
		if final != nil && (c.interrupted() || ctx.Err() != nil) {
			how := "stopped following"
			if !c.interrupted() {
				how = "--timeout reached"
			}
			msg := fmt.Sprintf("%s: the %s of %s (%s, %s) continues on the coordinator; follow it with: fencectl watch %s",
				how, word(final.Action), final.Node, final.Id, word(final.Status), final.Id)
			if c.interrupted() {
				return final, interruptedError{msg}
			}
			return final, errors.New(msg)
		}
		return final, err
	}
	if final == nil {
		return nil, errors.New("watch ended without a record")
	}
	switch final.Status {
	case coordv1.FenceStatus_FENCE_STATUS_DONE:
		return final, nil
	case coordv1.FenceStatus_FENCE_STATUS_ERROR:
		return final, fmt.Errorf("%s %s of %s ended in ERROR: %s", word(final.Action), final.Id, final.Node, final.Error)
	}
	return final, fmt.Errorf("%s %s of %s not finished (%s)", word(final.Action), final.Id, final.Node, word(final.Status))
}

// progress prints a record's timeline: each operation sent, each result, and each change of the
// record's step and status, every line once however often the record is sent again.
type progress struct {
	w       io.Writer
	printed map[string]bool
}

func newProgress(w io.Writer) *progress { return &progress{w: w, printed: map[string]bool{}} }

// show prints what f says that was not printed yet.
func (p *progress) show(f *coordv1.NodeFence) {
	stamp := func(t interface{ AsTime() time.Time }) string { return t.AsTime().Local().Format("15:04:05.000") }
	for _, op := range f.Operations {
		key := fmt.Sprintf("sent %s %d %s", op.OperationId, op.Attempt, op.Method)
		p.line(key, fmt.Sprintf("%s  %s  %s %s via %s (epoch %d) sent", stamp(op.StartedAt), f.Node, op.Method, op.Action, op.Driver, op.Epoch))
		if op.Result != coordv1.OperationResult_OPERATION_RESULT_UNSPECIFIED {
			line := fmt.Sprintf("%s  %s  %s %s -> %s, read back %s in %s", stamp(op.FinishedAt), f.Node, op.Method, op.Action,
				word(op.Result), word(op.State), op.Elapsed.AsDuration().Round(time.Millisecond))
			if op.Error != "" {
				line += ": " + op.Error
			}
			p.line("result "+key, line)
		}
	}
	state := fmt.Sprintf("%s %s", word(f.Step), word(f.Status))
	if f.Retries > 0 {
		state += fmt.Sprintf(" (retry %d)", f.Retries)
	}
	if f.Error != "" {
		state += ": " + f.Error
	}
	p.line("record "+state, fmt.Sprintf("%s  %s  %s %s %s", stamp(f.UpdatedAt), f.Node, word(f.Action), f.Id, state))
}

func (p *progress) line(key, text string) {
	if p.printed[key] {
		return
	}
	p.printed[key] = true
	fmt.Fprintln(p.w, text)
}

// word is an enum value as one lower-case word: FENCE_STATUS_DONE -> done.
func word(e fmt.Stringer) string { return strings.ToLower(cli.EnumWord(e.String())) }
