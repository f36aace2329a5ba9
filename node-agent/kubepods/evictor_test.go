package kubepods

import (
	"testing"
	"time"

	"github.com/nodefence/nodefence/node-agent/eviction"
)

func TestQueue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var q queue
	a := eviction.Candidate{Namespace: "ns", Name: "a", UID: "1"}
	b := eviction.Candidate{Namespace: "ns", Name: "b", UID: "2"}
	q.add(a, "memory.available", t0)
	q.add(b, "memory.available", t0)
	a.GracePeriod = 5 * time.Second
	q.add(a, "memory.available", t0) // a duplicate takes the newer grace period and keeps its place
	if len(q.items) != 2 || q.items[0].cand.GracePeriod != 5*time.Second {
		t.Fatalf("items after a duplicate grant: %+v", q.items)
	}
	due := q.takeDue(t0)
	if len(due) != 2 || due[0].cand.Name != "a" || due[1].cand.Name != "b" || len(q.items) != 0 {
		t.Fatalf("takeDue = %+v, left %d", due, len(q.items))
	}
	if _, ok := q.next(); ok {
		t.Error("next() on an empty queue")
	}
	due[0].due, due[1].due = t0.Add(3*time.Second), t0.Add(time.Second)
	q.items = append(q.items, due...)
	if next, ok := q.next(); !ok || !next.Equal(t0.Add(time.Second)) {
		t.Errorf("next() = %v, %v; want t0+1s", next, ok)
	}
	if got := q.takeDue(t0.Add(2 * time.Second)); len(got) != 1 || got[0].cand.Name != "b" {
		t.Errorf("takeDue(t0+2s) = %+v; want b", got)
	}
}

func TestGracePeriodSeconds(t *testing.T) {
	for _, tt := range []struct {
		d, floor time.Duration
		want     int64
	}{
		{0, time.Second, 1}, {1500 * time.Millisecond, time.Second, 2}, {30 * time.Second, time.Second, 30}, {-time.Second, time.Second, 1},
	} {
		if got := gracePeriodSeconds(tt.d, tt.floor); got != tt.want {
			t.Errorf("gracePeriodSeconds(%v, %v) = %d; want %d", tt.d, tt.floor, got, tt.want)
		}
	}
}
