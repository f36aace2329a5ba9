package kit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/nodefence/nodefence/services/fault"
)

// maxRemembered bounds how many completed operations are kept for de-duplication, in memory and
// in the operations file (which holds at most twice as many lines before it is compacted).
const maxRemembered = 4096

// operation is one mutating call, shared by every request carrying its operation_id.
type operation struct {
	// what is the action and device; a reused operation_id must name the same.
	what string
	done chan struct{}
	// resp and err are the result, valid once done is closed.
	resp proto.Message
	err  error
	// line is the persisted form of a successful operation.
	line opRecord
}

// opTable de-duplicates mutating calls by operation_id. Successful operations are remembered (the
// newest maxRemembered) and persisted before they are answered, so a resend after a driver restart
// gets the first answer instead of acting again; failed ones are forgotten, so retrying an id that
// failed tries again. An operation cut short by a crash was never answered and is not remembered:
// its resend acts again.
type opTable struct {
	mu    sync.Mutex
	ops   map[string]*operation
	order []string // completed successful ids, oldest first
	log   *opLog   // nil: in memory only
	warn  *slog.Logger
	limit int // operations remembered: maxRemembered
}

func newOpTable() *opTable { return &opTable{ops: map[string]*operation{}, limit: maxRemembered} }

// opsFile is the name of the persisted operations inside Options.StateDir.
const opsFile = "operations.jsonl"

// opRecord is one line of the operations file: a successful operation and its answer.
type opRecord struct {
	ID   string    `json:"id"`
	What string    `json:"what"`
	At   time.Time `json:"at"`
	// Resp is the answer as a serialized google.protobuf.Any.
	Resp []byte `json:"resp"`
}

// opLog appends operation records to a file, one JSON line each, fsynced before the answer.
type opLog struct {
	path  string
	f     *os.File
	lines int
}

// loadOpTable reads the operations file in dir (creating it) into a table. Lines that cannot be
// decoded (a write torn by a crash) are skipped and counted; an unreadable file is an error.
func loadOpTable(dir string, log *slog.Logger, limit int) (*opTable, error) {
	t := newOpTable()
	t.warn, t.limit = log, limit
	path := filepath.Join(dir, opsFile)
	f, err := os.Open(path)
	var recs []opRecord
	skipped := 0
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read operations: %w", err)
	default:
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var r opRecord
			if json.Unmarshal(sc.Bytes(), &r) != nil || r.ID == "" {
				skipped++
				continue
			}
			recs = append(recs, r)
		}
		err := sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read operations file %s: %w", path, err)
		}
	}
	if len(recs) > limit {
		recs = recs[len(recs)-limit:]
	}
	for _, r := range recs {
		var a anypb.Any
		if err := proto.Unmarshal(r.Resp, &a); err != nil {
			skipped++
			continue
		}
		resp, err := a.UnmarshalNew()
		if err != nil {
			skipped++
			continue
		}
		if _, dup := t.ops[r.ID]; !dup {
			t.order = append(t.order, r.ID)
		}
		op := &operation{what: r.What, done: make(chan struct{}), resp: resp, line: r}
		close(op.done)
		t.ops[r.ID] = op
	}
	if skipped > 0 && log != nil {
		log.Warn("operations file: skipped unreadable lines; those operations act again if resent", "file", path, "lines", skipped)
	}
	t.log = &opLog{path: path}
	// Rewrite the file with what was kept: drops torn lines and proves the directory is writable.
	if err := t.log.rewrite(t.records()); err != nil {
		return nil, fmt.Errorf("write operations file %s: %w", path, err)
	}
	return t, nil
}

// records are the remembered operations, oldest first.
func (t *opTable) records() []opRecord {
	out := make([]opRecord, 0, len(t.order))
	for _, id := range t.order {
		out = append(out, t.ops[id].line)
	}
	return out
}

// rewrite replaces the file with recs atomically and reopens it for appending.
func (l *opLog) rewrite(recs []opRecord) error {
	var data []byte
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		data = append(append(data, b...), '\n')
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	if err := writeFileAtomic(l.path, data); err != nil {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	l.f, l.lines = f, len(recs)
	return nil
}

// append writes one record and fsyncs it.
func (l *opLog) append(r opRecord) error {
	if l.f == nil {
		return errors.New("operations file is not open")
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		return err
	}
	l.lines++
	return l.f.Sync()
}

// persist records a successful operation before it is answered; the file is compacted to the
// remembered operations once it holds twice as many lines.
func (t *opTable) persist(id string, op *operation) error {
	a, err := anypb.New(op.resp)
	if err != nil {
		return err
	}
	b, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	op.line = opRecord{ID: id, What: op.what, At: time.Now().UTC(), Resp: b}
	if t.log == nil {
		return nil
	}
	if err := t.log.append(op.line); err != nil {
		return err
	}
	if t.log.lines > 2*t.limit {
		return t.log.rewrite(t.records())
	}
	return nil
}

// begin returns the operation for id. owner is true when the caller created it and must run it
// and call finish; otherwise the caller waits on op.done. A reused id naming another action or
// device is an error, and so is the repeat of an operation a later successful operation on the
// same device superseded (fault.ErrFailedPrecondition): its answer no longer describes the device.
// Only a caller whose history was rewound sends one (a coordinator restored from a backup resends
// an operation its lost successor resolved and then undid); it must retry with a new id.
func (t *opTable) begin(id, what string) (op *operation, owner bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if op, ok := t.ops[id]; ok {
		if op.what != what {
			var inv fault.Invalid
			inv.Add("operation_id", "%q was already used for %s, not %s", id, op.what, what)
			return nil, false, inv.Err()
		}
		if later := t.supersededBy(id, what); later != "" {
			return nil, false, fmt.Errorf("operation_id %q (%s) was superseded by the later operation %q on the same device; its answer no longer describes the device: retry with a new operation_id: %w",
				id, what, later, fault.ErrFailedPrecondition)
		}
		return op, false, nil
	}
	op = &operation{what: what, done: make(chan struct{})}
	t.ops[id] = op
	return op, true, nil
}

// supersededBy returns the id of a successful operation on what's device completed after id, or
// "". t.mu is held.
func (t *opTable) supersededBy(id, what string) string {
	dev := deviceOf(what)
	found := false
	for _, o := range t.order {
		switch {
		case o == id:
			found = true
		case found && deviceOf(t.ops[o].what) == dev:
			return o
		}
	}
	return ""
}

// deviceOf is the device key of an operation's what ("<action> on <device key>").
func deviceOf(what string) string {
	if i := strings.LastIndex(what, " on "); i >= 0 {
		return what[i+len(" on "):]
	}
	return what
}

// finish records the result and wakes the waiters.
func (t *opTable) finish(id string, op *operation, resp proto.Message, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	op.resp, op.err = resp, err
	if err != nil {
		close(op.done)
		if t.ops[id] == op {
			delete(t.ops, id)
		}
		return
	}
	t.order = append(t.order, id)
	for len(t.order) > t.limit {
		delete(t.ops, t.order[0])
		t.order = t.order[1:]
	}
	// Durable before answered. If the disk fails the device has still acted: answer, and say
	// that a resend after a restart would act again.
	if perr := t.persist(id, op); perr != nil && t.warn != nil {
		t.warn.Error("operation not persisted; a resend after a driver restart would act again", "operation_id", id, "err", perr)
	}
	close(op.done)
}

// deviceLocks serialises mutating operations per device key.
type deviceLocks struct {
	mu    sync.Mutex
	locks map[string]*deviceLock
}

type deviceLock struct {
	sem  chan struct{}
	refs int
}

// lock waits for the device's lock or the context's end. The returned func releases it.
func (l *deviceLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*deviceLock{}
	}
	dl := l.locks[key]
	if dl == nil {
		dl = &deviceLock{sem: make(chan struct{}, 1)}
		l.locks[key] = dl
	}
	dl.refs++
	l.mu.Unlock()

	release := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if dl.refs--; dl.refs == 0 {
			delete(l.locks, key)
		}
	}
	select {
	case dl.sem <- struct{}{}:
		return func() { <-dl.sem; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
