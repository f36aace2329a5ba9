package engine

import "strings"

// signalValues holds a node's latest value of each signal. A node reports a handful of signals, so
// a short slice searched in order beats a map on the hot path (no hashing, one cache line or two).
type signalValues []signalValue

type signalValue struct {
	name     string
	value    int64
	capacity int64
}

// maxSignals bounds what one node can make the coordinator keep: kubelet has eight signals; names
// beyond the bound are not kept.
const maxSignals = 32

func (s *signalValues) set(name string, v, capacity int64) {
	for i := range *s {
		if (*s)[i].name == name {
			(*s)[i].value, (*s)[i].capacity = v, capacity
			return
		}
	}
	if len(*s) < maxSignals {
		*s = append(*s, signalValue{name, v, capacity})
	}
}

// stalledPercent is a pressure-stall signal's stalled share in percent: the agent sends the share
// NOT stalled (so that, like every eviction signal, lower means more pressure) out of its capacity.
func (sv signalValue) stalledPercent() (float64, bool) {
	if !strings.HasPrefix(sv.name, "psi.") || sv.capacity <= 0 || sv.value < 0 || sv.value > sv.capacity {
		return 0, false
	}
	return 100 * float64(sv.capacity-sv.value) / float64(sv.capacity), true
}

func (s signalValues) get(name string) (int64, bool) {
	for _, sv := range s {
		if sv.name == name {
			return sv.value, true
		}
	}
	return 0, false
}
