package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nodefence/nodefence/coordinator/store"
)

// TestAuditPruningKeepsUp holds the audit writer's rate and the audit pruning's pass together: a
// flood of entries leaves the writer at most at its rate (DefaultAuditRate, the coordinator's
// setting), and one PruneAudit pass every AuditPruneEvery brings a trail growing at that rate back
// within AuditMaxEntries, interval after interval, so the trail stays bounded however long the
// flood lasts. (A pass smaller than one interval's growth leaves more after each interval.)
func TestAuditPruningKeepsUp(t *testing.T) {
	ctx, cli, st, term := setup(t)
	count := func() int64 {
		r, err := cli.Get(ctx, prefix+"/audit/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}

	// The writer, flooded far beyond its rate for a second and a half, writes at most its rate.
	w := st.NewAuditWriter(term, store.AuditLimits{})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(wctx) }()
	began := time.Now()
	for i := 0; time.Since(began) < 1500*time.Millisecond; i++ {
		w.Append(base, "flood", "condition", fmt.Sprintf("entry %d", i))
		if i%1000 == 999 {
			time.Sleep(10 * time.Millisecond) // let the writer's pace run; the queue still overflows
		}
	}
	elapsed := time.Since(began)
	stop()
	<-done
	written := count()
	maxRate := float64(store.DefaultAuditRate)
	if limit := int64(maxRate*elapsed.Seconds()) + int64(maxRate/10); written > limit {
		t.Fatalf("the audit writer wrote %d entries in %s: more than its rate %g a second allows (%d)", written, elapsed, maxRate, limit)
	}
	if w.Dropped() == 0 {
		t.Fatal("the flood dropped nothing: not a flood")
	}

	// Interval after interval, the most the writer can add in AuditPruneEvery, then one pass.
	const maxEntries = 1000
	r := store.Retention{AuditMaxEntries: maxEntries}
	perInterval := int(maxRate * store.AuditPruneEvery.Seconds())
	seq := 0
	for interval := range 6 {
		for added := 0; added < perInterval; {
			ops := make([]clientv3.Op, 0, 100)
			for ; len(ops) < cap(ops) && added < perInterval; added++ {
				seq++
				ops = append(ops, st.AuditOp(base.Add(time.Duration(seq)*time.Millisecond), term.Epoch, "flood", "condition", fmt.Sprintf("entry %d", seq)))
			}
			if _, err := term.Txn(ctx, nil, ops...); err != nil {
				t.Fatal(err)
			}
		}
		before := count()
		if _, err := st.PruneAudit(ctx, term, base.Add(time.Hour), r); err != nil {
			t.Fatal(err)
		}
		if after := count(); after > maxEntries {
			t.Fatalf("interval %d: %d entries after %d were added, %d after the pass: pruning falls behind a trail growing %g a second (bound %d)",
				interval, before, perInterval, after, maxRate, maxEntries)
		}
	}
}
