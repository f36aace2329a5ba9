// Package leader elects one coordinator replica as leader through etcd and guards every write the
// leader makes with its fencing token.
//
// The epoch of a leadership term is the create revision of the replica's election key. Every leader
// write is a Txn whose first comparison is CreateRevision(key) == epoch, so a replica that lost its
// lease (and with it the key) can no longer change anything, even if it has not noticed yet. The same
// epoch travels on every driver call, where drivers reject epochs lower than the highest they saw.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/nodefence/nodefence/services/fault"
)

// ErrDeposed is returned by a guarded write whose epoch is no longer the leader's.
var ErrDeposed = fmt.Errorf("%w: this replica is no longer the leader", fault.ErrStaleEpoch)

// ErrConflict is returned by a guarded write whose extra comparisons failed (a concurrent change);
// it maps to Aborted: the caller may retry its whole read-modify-write.
var ErrConflict = fmt.Errorf("%w: the guarded keys changed", fault.ErrConflict)

// ErrKeyLost is returned by a campaign whose election key vanished (its lease expired) while it
// waited for the older keys: no term is started, the caller campaigns again.
var ErrKeyLost = errors.New("election key no longer exists")

// Info identifies a replica; it is the value of its election key.
type Info struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// Elector campaigns for leadership on behalf of one replica.
type Elector struct {
	cli    *clientv3.Client
	prefix string
	info   Info
	ttl    int
	log    *slog.Logger
	// OnUnwritable, if set, hears why a term ended because etcd would not take its writes
	// (writable.go): the coordinator's alarm. Set it before the first Campaign.
	OnUnwritable func(reason string)
}

// NewElector returns an elector under prefix (for example "/nodefence/leader"). ttlSeconds is the
// lease TTL: how long a dead leader keeps the key before another replica may take over.
func NewElector(cli *clientv3.Client, prefix string, info Info, ttlSeconds int, log *slog.Logger) *Elector {
	return &Elector{cli: cli, prefix: prefix, info: info, ttl: ttlSeconds, log: log}
}

// Term is one leadership term. Its context is cancelled as soon as leadership is lost (lease expired,
// key deleted, or Resign).
type Term struct {
	// Epoch is the fencing token: the election key's create revision.
	Epoch int64
	// Key is the election key.
	Key string

	cli     *clientv3.Client
	ctx     context.Context
	cancel  context.CancelFunc
	session *concurrency.Session
	el      *concurrency.Election

	// txnTimeout bounds one guarded write: the lease TTL (at least CallTimeout). A leader that cannot
	// commit within its lease is no longer safely the leader.
	txnTimeout time.Duration

	resignOnce sync.Once // concurrency.Election is not safe for concurrent use
	resignErr  error

	writes writeState // the guarded writes' outcomes, for the guard (writable.go)
}

// CallTimeout bounds every single etcd call of the election and of a term's guarded writes: a
// replica cut from etcd must notice, not wait for ever.
const CallTimeout = 3 * time.Second

// Campaign blocks until this replica is leader, ctx ends, or the replica's lease is lost while it
// waits (then it returns an error and the caller campaigns again with a new lease).
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	gctx, gcancel := context.WithTimeout(ctx, CallTimeout)
	lease, err := e.cli.Grant(gctx, int64(e.ttl))
	gcancel()
	if err != nil {
		return nil, fmt.Errorf("election lease: %w", err)
	}
	session, err := concurrency.NewSession(e.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(e.ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("election session: %w", err)
	}
	val, _ := json.Marshal(e.info)
	el := concurrency.NewElection(session, e.prefix)
	// Waiting in line is a watch without a deadline: stop waiting when the lease is gone.
	cctx, ccancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-session.Done():
		case <-cctx.Done():
		}
		ccancel()
	}()
	err = el.Campaign(cctx, string(val))
	ccancel()
	if err != nil {
		session.Close()
		select {
		case <-session.Done():
			if ctx.Err() == nil {
				return nil, fmt.Errorf("campaign: election lease lost while waiting: %w", err)
			}
		default:
		}
		return nil, fmt.Errorf("campaign: %w", err)
	}
	// Campaign returns once every older key is gone, without looking at its own: a key lost while
	// waiting (its lease expired during an etcd outage) would make a leader without a key. Check
	// that the key is still ours before calling this a term.
	kctx, kcancel := context.WithTimeout(ctx, CallTimeout)
	got, err := e.cli.Get(kctx, el.Key())
	kcancel()
	if err != nil || len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != el.Rev() {
		session.Close()
		if err == nil {
			err = ErrKeyLost
		}
		return nil, fmt.Errorf("campaign won with key %s: %w", el.Key(), err)
	}
	tctx, cancel := context.WithCancel(ctx)
	t := &Term{Epoch: el.Rev(), Key: el.Key(), cli: e.cli, ctx: tctx, cancel: cancel, session: session, el: el,
		txnTimeout: max(CallTimeout, time.Duration(e.ttl)*time.Second)}
	t.writes.refusing = make(chan string, 1)
	// Leadership ends when the lease is gone, the key is deleted by anyone (watched from the
	// revision of the check above, so a deletion right after it is seen), or etcd cannot be read
	// for four fifths of the lease: a leader cut from etcd steps down before another replica can
	// take over, and one that is merely slow (a loaded machine, an election in etcd) does not.
	watch := e.cli.Watch(tctx, t.Key, clientv3.WithRev(got.Header.Revision+1))
	ttl := time.Duration(e.ttl) * time.Second
	every := min(time.Second, ttl/4)
	readTimeout := min(CallTimeout, ttl/2)
	check := time.NewTicker(every)
	lastRead := time.Now()
	go e.guard(tctx, t, session, cancel, watch, check, ttl, readTimeout, lastRead)
	e.log.Info("became leader", "id", e.info.ID, "epoch", t.Epoch)
	return t, nil
}

// guard ends term t when its leadership is lost: session gone, tctx (the term's context, cancel its
// cancel) done, the key gone from etcd (read on every tick of check, each read bounded by
// readTimeout; lastRead is the latest successful one) or deleted (seen on watch), or etcd unreadable
// for four fifths of ttl.
func (e *Elector) guard(tctx context.Context, t *Term, session *concurrency.Session, cancel context.CancelFunc,
	watch clientv3.WatchChan, check *time.Ticker, ttl, readTimeout time.Duration, lastRead time.Time) {
	// A term that ends itself (its key gone or deleted, its watch ended, etcd unreachable) gives
	// its key and lease up: the session would otherwise keep the lease alive, and with it the
	// key every later campaign (this replica's next one included) queues behind, so no replica
	// would lead again. A term ended from outside (Resign, Abandon) or whose session is gone
	// has nothing to give up.
	release := true
	failing := 0                     // consecutive ticks with guarded writes failing and none succeeding
	every := min(time.Second, ttl/4) // check's period, as Campaign made it
	defer func() {
		cancel()
		check.Stop()
		if release {
			rctx, rcancel := context.WithTimeout(context.Background(), CallTimeout)
			_ = t.Resign(rctx)
			rcancel()
		}
	}()
	for {
		select {
		case <-session.Done():
			e.log.Warn("leadership lost: election session ended", "epoch", t.Epoch)
			release = false
			return
		case <-tctx.Done():
			release = false
			return
		case reason := <-t.writes.refusing:
			e.unwritable(t, reason)
			return
		case <-check.C:
			start := time.Now() // not the tick's time: a tick that waited behind a hung read is stale
			if failing = t.writes.failingTicks(failing); unwritableFor(failing, every, ttl) {
				e.unwritable(t, UnwritableFailing)
				return
			}
			// The read never runs past the step-down deadline: a read that hangs (etcd blackholed)
			// would otherwise hold the check for readTimeout, and the next tick's read as long,
			// stepping down a whole read late — after another replica may have been elected.
			timeout := min(readTimeout, ttl*4/5-start.Sub(lastRead))
			var live bool
			err := context.DeadlineExceeded
			if timeout > 0 {
				live, err = t.keyLive(tctx, timeout)
			}
			if err == nil && !live {
				e.log.Warn("leadership lost: election key gone", "epoch", t.Epoch)
				return
			}
			if err == nil {
				lastRead = start
				continue
			}
			if held := time.Since(lastRead); held >= ttl*4/5 && tctx.Err() == nil {
				e.log.Error("stepping down: this coordinator cannot reach etcd", "epoch", t.Epoch, "for", held.Round(time.Millisecond), "err", err)
				return
			}
		case wr, ok := <-watch:
			if tctx.Err() != nil {
				release = false // the watch ended with the term
				return
			}
			if !ok {
				e.log.Warn("leadership lost: the watch of the election key ended", "epoch", t.Epoch)
				return
			}
			if err := wr.Err(); err != nil {
				e.log.Warn("leadership lost: the watch of the election key failed", "epoch", t.Epoch, "err", err)
				return
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					e.log.Warn("leadership lost: election key deleted", "epoch", t.Epoch)
					return
				}
			}
		}
	}
}

// keyLive reads the election key within timeout: is it still this term's? Reachability is judged by
// a serializable read: any reachable member answers from its own state, without a round of the etcd
// cluster's consensus, so a busy cluster (thousands of agents saying hello at once) is not taken for
// an unreachable one. A member that lags may not have the key yet, so "gone" is confirmed by a
// linearizable read before the term ends; if that read cannot be made, nothing is concluded (the
// watch, the lease and every guarded write still end a deposed term).
func (t *Term) keyLive(ctx context.Context, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	mine := func(resp *clientv3.GetResponse) bool {
		return len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == t.Epoch
	}
	resp, err := t.cli.Get(ctx, t.Key, clientv3.WithSerializable())
	if err != nil {
		return false, err
	}
	if mine(resp) {
		return true, nil
	}
	if resp, err = t.cli.Get(ctx, t.Key); err != nil {
		return true, nil
	}
	return mine(resp), nil
}

// Context is cancelled when the term ends; run leader-only work under it.
func (t *Term) Context() context.Context { return t.ctx }

// Resign gives up leadership and ends the term. Callers racing to resign (the engine loop failing
// while the coordinator shuts down) resign once; every caller gets that one result.
func (t *Term) Resign(ctx context.Context) error {
	t.resignOnce.Do(func() {
		defer t.cancel()
		t.resignErr = t.el.Resign(ctx)
		t.session.Close()
	})
	return t.resignErr
}

// Abandon ends the term without resigning (the lease expires on its own): used by tests to simulate
// a leader that stalls.
func (t *Term) Abandon() { t.cancel(); t.session.Orphan() }

// Guard is the comparison that makes a Txn valid only for this term.
func (t *Term) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Epoch)
}

// Txn commits ops if this term is still the leader's and every extra comparison holds. It returns
// ErrDeposed when the term is over and ErrConflict when an extra comparison failed.
func (t *Term) Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, max(t.txnTimeout, CallTimeout))
	defer cancel()
	resp, err := t.cli.Txn(ctx).
		If(append([]clientv3.Cmp{t.Guard()}, cmps...)...).
		Then(ops...).
		Else(clientv3.OpGet(t.Key)).
		Commit()
	t.writes.noteWrite(ctx, err)
	if err != nil {
		return nil, fmt.Errorf("etcd txn: %w", err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != t.Epoch {
		t.cancel()
		return resp, ErrDeposed
	}
	return resp, ErrConflict
}

// Current returns the current leader (the oldest election key under prefix) and its epoch.
// ok is false when no replica leads.
func Current(ctx context.Context, cli *clientv3.Client, prefix string) (info Info, epoch int64, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return Info{}, 0, false, fmt.Errorf("read leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Info{}, 0, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		return Info{}, 0, false, errors.New("leader key holds no replica info")
	}
	return info, resp.Kvs[0].CreateRevision, true, nil
}
