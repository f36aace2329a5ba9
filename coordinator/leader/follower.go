package leader

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Follower is a replica's view of who leads, for redirecting clients. The oldest election key is not
// enough: a leader killed with SIGKILL keeps its key until its lease expires, and a redirect to it
// sends every agent into a refused connection and a longer backoff. So the view is verified: the key
// was read from etcd a moment ago and the leader's address accepts connections.
//
// A leader whose address refuses connections (nothing listens there: the process is gone) for
// OrphanAfter while its key stays is removed from the election by revoking its lease, so the next
// replica in line takes over at once instead of after the rest of the lease. This never weakens the
// fencing token: a replica that was in fact alive finds its guarded writes refused and its term
// ended, and drivers refuse its epoch once the new leader used a higher one.
type Follower struct {
	cli    *clientv3.Client
	prefix string
	self   string
	log    *slog.Logger

	// Probe reports whether something answers at addr; nil dials TCP within ProbeTimeout. An error
	// wrapping syscall.ECONNREFUSED means nothing listens there.
	Probe func(ctx context.Context, addr string) error
	// MaxAge is how long a view is reused (250 ms by default).
	MaxAge time.Duration
	// OrphanAfter is how long a leader's address must keep refusing connections before its key is
	// removed (300 ms by default; at least three probes in a row must be refused).
	OrphanAfter time.Duration

	mu       sync.Mutex
	view     View
	busy     chan struct{} // closed when the running refresh is done; nil when none runs
	refused  int           // probes of refusedEpoch's address refused in a row
	since    time.Time     // first of those refusals
	refEpoch int64
}

// View is the verified state of the election.
type View struct {
	// Leader and Epoch name the oldest election key's replica; Found is false when there is none.
	Leader Info
	Epoch  int64
	Found  bool
	// Answers is true when the leader is this replica or its address accepted a connection.
	Answers bool
	// Err is set when etcd could not be read: nothing is known.
	Err error
	// At is when the view was taken.
	At time.Time

	lease clientv3.LeaseID
}

// ProbeTimeout bounds one probe of a leader's address.
const ProbeTimeout = 300 * time.Millisecond

// readTimeout bounds the follower's read of the election: a replica cut from etcd says so quickly.
const readTimeout = time.Second

// NewFollower returns the view of the election under prefix for the replica named self.
func NewFollower(cli *clientv3.Client, prefix, self string, log *slog.Logger) *Follower {
	return &Follower{cli: cli, prefix: prefix, self: self, log: log, MaxAge: 250 * time.Millisecond, OrphanAfter: 300 * time.Millisecond}
}

// View returns a view at most MaxAge old, refreshing it if needed (one refresh at a time; callers
// meanwhile wait for it, or for ctx).
func (f *Follower) View(ctx context.Context) View {
	return f.view0(ctx, f.MaxAge)
}

func (f *Follower) view0(ctx context.Context, maxAge time.Duration) View {
	for {
		f.mu.Lock()
		if v := f.view; !v.At.IsZero() && time.Since(v.At) < maxAge {
			f.mu.Unlock()
			return v
		}
		if f.busy != nil {
			busy := f.busy
			f.mu.Unlock()
			select {
			case <-busy:
				maxAge = time.Hour // whatever that refresh found is fresh
				continue
			case <-ctx.Done():
				return View{Err: ctx.Err(), At: time.Now()}
			}
		}
		busy := make(chan struct{})
		f.busy = busy
		f.mu.Unlock()
		v := f.refresh(ctx)
		f.mu.Lock()
		f.view, f.busy = v, nil
		f.mu.Unlock()
		close(busy)
		return v
	}
}

// Run refreshes the view every interval until ctx ends, so that a dead leader is noticed (and its
// key removed) even when no client asks.
func (f *Follower) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.view0(ctx, interval/2)
		}
	}
}

// refresh reads the election, probes the leader, and removes an orphaned key.
func (f *Follower) refresh(ctx context.Context) View {
	now := time.Now()
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	// Serializable, like the leader's own check: a busy etcd cluster must not look unreachable. A
	// stale answer names a leader that either answers (and redirects in turn) or is probed dead.
	resp, err := f.cli.Get(rctx, f.prefix+"/", append(clientv3.WithFirstCreate(), clientv3.WithSerializable())...)
	cancel()
	if err != nil {
		return View{Err: err, At: now}
	}
	if len(resp.Kvs) == 0 {
		return View{At: now}
	}
	kv := resp.Kvs[0]
	v := View{Epoch: kv.CreateRevision, Found: true, At: now, lease: clientv3.LeaseID(kv.Lease)}
	if err := json.Unmarshal(kv.Value, &v.Leader); err != nil {
		return View{Err: errors.New("leader key holds no replica info"), At: now}
	}
	if v.Leader.ID == f.self {
		v.Answers = true
		return v
	}
	perr := f.probe(ctx, v.Leader.Address)
	v.Answers = perr == nil
	if !errors.Is(perr, syscall.ECONNREFUSED) {
		f.refused = 0
		return v
	}
	if f.refused == 0 || f.refEpoch != v.Epoch {
		f.refused, f.since, f.refEpoch = 0, now, v.Epoch
	}
	f.refused++
	if f.refused >= 3 && now.Sub(f.since) >= f.OrphanAfter {
		f.log.Warn("removing the election key of a leader whose address refuses connections",
			"leader", v.Leader.ID, "address", v.Leader.Address, "epoch", v.Epoch, "refused_for", now.Sub(f.since).Round(time.Millisecond))
		rctx, cancel := context.WithTimeout(ctx, CallTimeout)
		_, err := f.cli.Revoke(rctx, v.lease)
		cancel()
		if err != nil {
			f.log.Warn("could not revoke the orphaned leader's lease", "leader", v.Leader.ID, "err", err)
		} else {
			f.refused = 0
			v.At = time.Time{} // stale at once: the next caller reads the new leader
		}
	}
	return v
}

func (f *Follower) probe(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	if f.Probe != nil {
		return f.Probe(ctx, addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}
