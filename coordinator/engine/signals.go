package engine

// signalValues holds a node's latest value of each signal. A node reports a handful of signals, so
// a short slice searched in order beats a map on the hot path (no hashing, one cache line or two).
type signalValues []signalValue

type signalValue struct {
	name  string
	value int64
}

// maxSignals bounds what one node can make the coordinator keep: kubelet has eight signals; names
// beyond the bound are not kept.
const maxSignals = 32

func (s *signalValues) set(name string, v int64) {
	for i := range *s {
		if (*s)[i].name == name {
			(*s)[i].value = v
			return
		}
	}
	if len(*s) < maxSignals {
		*s = append(*s, signalValue{name, v})
	}
}

func (s signalValues) get(name string) (int64, bool) {
	for _, sv := range s {
		if sv.name == name {
			return sv.value, true
		}
	}
	return 0, false
}
