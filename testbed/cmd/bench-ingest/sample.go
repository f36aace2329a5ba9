package main

import (
	"encoding/binary"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the sample request (proto/nodefence/agent/v1/agent.proto).
const (
	fieldSeq       = 1  // ConnectRequest.seq
	fieldSample    = 12 // ConnectRequest.sample
	fieldObserved  = 1  // SignalSample.observed_at
	fieldSignals   = 2  // SignalSample.signals
	fieldName      = 1  // Signal.name
	fieldAvailable = 2  // Signal.available
	fieldCapacity  = 3  // Signal.capacity
	fieldSeconds   = 1  // Timestamp.seconds
	fieldNanos     = 2  // Timestamp.nanos
)

// appendSample appends, as one gRPC message, the bytes appendMessage writes for
// newSampler().next(seq, now) (TestAppendSample), encoded by hand: protobuf-go's reflection took
// a seventh of the h2 generator's CPU, which the coordinator it measures shares the machine with.
func appendSample(b []byte, seq uint64, now time.Time) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, 0)
	var ts, mem, pid, sample [64]byte
	t := protowire.AppendVarint(protowire.AppendTag(ts[:0], fieldSeconds, protowire.VarintType), uint64(now.Unix()))
	if nanos := now.Nanosecond(); nanos != 0 {
		t = protowire.AppendVarint(protowire.AppendTag(t, fieldNanos, protowire.VarintType), uint64(nanos))
	}
	m := appendSignal(mem[:0], "memory.available", 8<<30+int64(seq%1024)<<20, 64<<30)
	p := appendSignal(pid[:0], "pid.available", 4000000, 4194304)
	s := protowire.AppendBytes(protowire.AppendTag(sample[:0], fieldObserved, protowire.BytesType), t)
	b = protowire.AppendVarint(protowire.AppendTag(b, fieldSeq, protowire.VarintType), seq)
	b = protowire.AppendTag(b, fieldSample, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(s)+2*protowire.SizeTag(fieldSignals)+protowire.SizeBytes(len(m))+protowire.SizeBytes(len(p))))
	b = append(b, s...)
	b = protowire.AppendBytes(protowire.AppendTag(b, fieldSignals, protowire.BytesType), m)
	b = protowire.AppendBytes(protowire.AppendTag(b, fieldSignals, protowire.BytesType), p)
	binary.BigEndian.PutUint32(b[start+1:start+5], uint32(len(b)-start-5))
	return b
}

// appendSignal appends the encoding of Signal{name, available, capacity} (none of them zero).
func appendSignal(b []byte, name string, available, capacity int64) []byte {
	b = protowire.AppendString(protowire.AppendTag(b, fieldName, protowire.BytesType), name)
	b = protowire.AppendVarint(protowire.AppendTag(b, fieldAvailable, protowire.VarintType), uint64(available))
	return protowire.AppendVarint(protowire.AppendTag(b, fieldCapacity, protowire.VarintType), uint64(capacity))
}
