// Package agentwire decodes what agents send on their stream. Heartbeats and samples, nearly all of
// the traffic, are decoded into memory the Decoder reuses, so a coordinator serving 10,000 agents
// does not allocate (and later collect) a handful of objects per message; everything else is decoded
// by protobuf-go.
//
// The reusing path takes only the plain shape a protobuf encoder writes for these messages: known
// fields, each at most once (signals repeated), valid UTF-8. Anything else, however legal, goes to
// protobuf-go, so the result is always what proto.Unmarshal would give (FuzzDecode checks this).
package agentwire

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// Field numbers of the messages decoded here (proto/nodefence/agent/v1/agent.proto).
const (
	fieldSeq       = 1  // ConnectRequest.seq
	fieldHeartbeat = 11 // ConnectRequest.heartbeat
	fieldSample    = 12 // ConnectRequest.sample
	fieldSentAt    = 1  // Heartbeat.sent_at
	fieldWanted    = 2  // Heartbeat.lease_wanted
	fieldLeaseEp   = 3  // Heartbeat.lease_epoch
	fieldLeaseID   = 4  // Heartbeat.lease_grant_id
	fieldObserved  = 1  // SignalSample.observed_at
	fieldSignals   = 2  // SignalSample.signals
	fieldName      = 1  // Signal.name
	fieldAvailable = 2  // Signal.available
	fieldCapacity  = 3  // Signal.capacity
	fieldSeconds   = 1  // Timestamp.seconds
	fieldNanos     = 2  // Timestamp.nanos
)

// maxReusedSignals bounds the signals a reused sample holds (kubelet has nine): a larger sample is
// decoded afresh, so one odd message cannot make a stream keep a large buffer for its lifetime.
const maxReusedSignals = 32

// kubeletSignals are the signal names agents send; decoding one of them allocates nothing.
var kubeletSignals = map[string]string{}

func init() {
	for _, s := range []string{
		"memory.available", "allocatableMemory.available", "nodefs.available", "nodefs.inodesFree",
		"imagefs.available", "imagefs.inodesFree", "containerfs.available", "containerfs.inodesFree",
		"pid.available",
	} {
		kubeletSignals[s] = s
	}
}

// Decoder decodes the requests of one stream. It is not safe for concurrent use.
type Decoder struct {
	req     agentv1.ConnectRequest
	hbCase  agentv1.ConnectRequest_Heartbeat
	hb      agentv1.Heartbeat
	smCase  agentv1.ConnectRequest_Sample
	sample  agentv1.SignalSample
	ts      timestamppb.Timestamp
	signals []*agentv1.Signal
}

// Decode decodes one encoded ConnectRequest. When reused is true, m and everything it points to
// belong to the Decoder and are valid only until the next Decode: a caller keeping the message
// longer must proto.Clone it. An error is protobuf-go's, for bytes that are not a ConnectRequest.
func (d *Decoder) Decode(b []byte) (m *agentv1.ConnectRequest, reused bool, err error) {
	if d.decodeHot(b) {
		return &d.req, true, nil
	}
	m = new(agentv1.ConnectRequest)
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, false, err
	}
	return m, false, nil
}

// field is one varint or length-delimited field of an encoded message.
type field struct {
	num    protowire.Number
	typ    protowire.Type
	varint uint64
	bytes  []byte
}

// next consumes the field at the start of b into f and returns how many bytes it took, or -1 if b
// does not start with a well-formed varint or length-delimited field (other wire types included).
// Tags, lengths and values under 128 (nearly all of a sample) take one byte and no call.
func next(b []byte, f *field) int {
	if len(b) == 0 {
		return -1
	}
	tag, n := uint64(b[0]), 1
	if tag >= 0x80 {
		if tag, n = protowire.ConsumeVarint(b); n < 0 {
			return -1
		}
	}
	num, typ := protowire.DecodeTag(tag)
	if num < protowire.MinValidNumber {
		return -1
	}
	f.num, f.typ = num, typ
	b = b[n:]
	var v uint64
	m := 1
	switch {
	case len(b) > 0 && b[0] < 0x80:
		v = uint64(b[0])
	default:
		if v, m = protowire.ConsumeVarint(b); m < 0 {
			return -1
		}
	}
	switch typ {
	case protowire.VarintType:
		f.varint, f.bytes = v, nil
	case protowire.BytesType:
		if v > uint64(len(b)-m) {
			return -1
		}
		f.varint, f.bytes = 0, b[m:m+int(v)]
		m += int(v)
	default:
		return -1
	}
	return n + m
}

// seen records which of fields 1..63 a message had, to refuse a repeated singular field (protobuf
// would keep the last scalar but merge messages; such input goes to protobuf-go).
type seen uint64

func (s *seen) first(num protowire.Number) bool {
	if num < 1 || num > 63 || *s&(1<<num) != 0 {
		return false
	}
	*s |= 1 << num
	return true
}

// eachField calls fn with each field of the encoded message b in order and reports whether b is
// well formed, no field but repeated (0: none) occurs twice, and fn accepted every field.
func eachField(b []byte, repeated protowire.Number, fn func(field) bool) bool {
	var (
		have seen
		f    field
	)
	for len(b) > 0 {
		n := next(b, &f)
		if n < 0 || (f.num != repeated && !have.first(f.num)) || !fn(f) {
			return false
		}
		b = b[n:]
	}
	return true
}

// decodeHot decodes b into d.req if it is a heartbeat or sample in the plain shape.
func (d *Decoder) decodeHot(b []byte) bool {
	var (
		seq  uint64
		kind protowire.Number
		body []byte
	)
	ok := eachField(b, 0, func(f field) bool {
		switch {
		case f.num == fieldSeq && f.typ == protowire.VarintType:
			seq = f.varint
		case (f.num == fieldHeartbeat || f.num == fieldSample) && f.typ == protowire.BytesType && kind == 0:
			kind, body = f.num, f.bytes
		default:
			return false
		}
		return true
	})
	if !ok {
		return false
	}
	switch kind {
	case fieldHeartbeat:
		if !d.decodeHeartbeat(body) {
			return false
		}
		d.hbCase.Heartbeat = &d.hb
		d.req.Msg = &d.hbCase
	case fieldSample:
		if !d.decodeSample(body) {
			return false
		}
		d.smCase.Sample = &d.sample
		d.req.Msg = &d.smCase
	default:
		return false
	}
	d.req.Seq = seq
	return true
}

func (d *Decoder) decodeHeartbeat(b []byte) bool {
	d.hb.SentAt, d.hb.LeaseWanted, d.hb.LeaseEpoch, d.hb.LeaseGrantId = nil, false, 0, 0
	return eachField(b, 0, func(f field) bool {
		switch {
		case f.num == fieldSentAt && f.typ == protowire.BytesType && decodeTimestamp(f.bytes, &d.ts):
			d.hb.SentAt = &d.ts
		case f.num == fieldWanted && f.typ == protowire.VarintType:
			d.hb.LeaseWanted = protowire.DecodeBool(f.varint)
		case f.num == fieldLeaseEp && f.typ == protowire.VarintType:
			d.hb.LeaseEpoch = int64(f.varint)
		case f.num == fieldLeaseID && f.typ == protowire.VarintType:
			d.hb.LeaseGrantId = f.varint
		default:
			return false
		}
		return true
	})
}

func (d *Decoder) decodeSample(b []byte) bool {
	d.sample.ObservedAt = nil
	count := 0
	ok := eachField(b, fieldSignals, func(f field) bool {
		switch {
		case f.typ != protowire.BytesType:
			return false
		case f.num == fieldObserved:
			if !decodeTimestamp(f.bytes, &d.ts) {
				return false
			}
			d.sample.ObservedAt = &d.ts
		case f.num == fieldSignals:
			if count == maxReusedSignals {
				return false
			}
			if count == len(d.signals) {
				d.signals = append(d.signals, new(agentv1.Signal))
			}
			if !decodeSignal(f.bytes, d.signals[count]) {
				return false
			}
			count++
		default:
			return false
		}
		return true
	})
	if !ok {
		return false
	}
	d.sample.Signals = nil
	if count > 0 {
		d.sample.Signals = d.signals[:count:count]
	}
	return true
}

func decodeSignal(b []byte, s *agentv1.Signal) bool {
	var (
		name      string
		available int64
		capacity  int64
	)
	ok := eachField(b, 0, func(f field) bool {
		switch {
		case f.num == fieldName && f.typ == protowire.BytesType:
			var ok bool
			name, ok = signalName(f.bytes)
			return ok
		case f.num == fieldAvailable && f.typ == protowire.VarintType:
			available = int64(f.varint)
		case f.num == fieldCapacity && f.typ == protowire.VarintType:
			capacity = int64(f.varint)
		default:
			return false
		}
		return true
	})
	if ok {
		s.Name, s.Available, s.Capacity = name, available, capacity
	}
	return ok
}

// signalName returns b as a string, without allocating for kubelet's names; ok is false for
// invalid UTF-8, which protobuf-go refuses in a proto3 string.
func signalName(b []byte) (string, bool) {
	if s, ok := kubeletSignals[string(b)]; ok {
		return s, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

func decodeTimestamp(b []byte, ts *timestamppb.Timestamp) bool {
	var (
		seconds int64
		nanos   int32
	)
	ok := eachField(b, 0, func(f field) bool {
		switch {
		case f.typ != protowire.VarintType:
			return false
		case f.num == fieldSeconds:
			seconds = int64(f.varint)
		case f.num == fieldNanos:
			nanos = int32(f.varint)
		default:
			return false
		}
		return true
	})
	if ok {
		ts.Seconds, ts.Nanos = seconds, nanos
	}
	return ok
}
