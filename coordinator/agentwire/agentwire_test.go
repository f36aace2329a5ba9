package agentwire

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

func sample(seq uint64, signals ...*agentv1.Signal) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Seq: seq, Msg: &agentv1.ConnectRequest_Sample{Sample: &agentv1.SignalSample{
		ObservedAt: &timestamppb.Timestamp{Seconds: 1_700_000_000 + int64(seq), Nanos: 123456789}, Signals: signals}}}
}

func heartbeat(seq uint64) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Seq: seq, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{
		SentAt: &timestamppb.Timestamp{Seconds: -5, Nanos: -1}}}}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// appendField appends one raw field, for shapes an encoder would not write.
func appendField(b []byte, num protowire.Number, v any) []byte {
	switch v := v.(type) {
	case uint64:
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	case []byte:
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, v)
	case uint32:
		b = protowire.AppendTag(b, num, protowire.Fixed32Type)
		return protowire.AppendFixed32(b, v)
	}
	panic("appendField: unsupported value")
}

func manySignals(n int) []*agentv1.Signal {
	var s []*agentv1.Signal
	for i := range n {
		s = append(s, &agentv1.Signal{Name: "custom." + string(rune('a'+i%26)), Available: int64(i)})
	}
	return s
}

// TestDecode checks each input against proto.Unmarshal, one Decoder for all of them in order, so a
// value left over from an earlier message would show; and that the common shapes take the reusing path.
func TestDecode(t *testing.T) {
	mem := &agentv1.Signal{Name: "memory.available", Available: 8 << 30, Capacity: 64 << 30}
	pid := &agentv1.Signal{Name: "pid.available", Available: 4_000_000, Capacity: 4_194_304}
	sampleBody := mustMarshal(t, sample(1, mem).GetSample())
	tests := []struct {
		name   string
		in     []byte
		reused bool
		fails  bool
	}{
		{name: "sample of two signals", in: mustMarshal(t, sample(7, mem, pid)), reused: true},
		{name: "sample of one signal", in: mustMarshal(t, sample(8, pid)), reused: true},
		{name: "heartbeat", in: mustMarshal(t, heartbeat(9)), reused: true},
		{name: "heartbeat asking for a lease", in: mustMarshal(t, &agentv1.ConnectRequest{Seq: 20, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{
			SentAt: &timestamppb.Timestamp{Seconds: 7}, LeaseWanted: true, LeaseEpoch: -3, LeaseGrantId: 1 << 63}}}), reused: true},
		{name: "lease epoch as bytes", in: appendField(nil, fieldHeartbeat, appendField(nil, fieldLeaseEp, []byte{1}))},
		{name: "lease wanted as 2 (a bool)", in: appendField(nil, fieldHeartbeat, appendField(nil, fieldWanted, uint64(2))), reused: true},
		{name: "sample without signals", in: mustMarshal(t, sample(10)), reused: true},
		{name: "sample without a time", in: mustMarshal(t, &agentv1.ConnectRequest{Seq: 11, Msg: &agentv1.ConnectRequest_Sample{Sample: &agentv1.SignalSample{Signals: []*agentv1.Signal{mem}}}}), reused: true},
		{name: "empty heartbeat", in: mustMarshal(t, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}}), reused: true},
		{name: "empty time", in: mustMarshal(t, &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{SentAt: &timestamppb.Timestamp{}}}}), reused: true},
		{name: "unknown signal name", in: mustMarshal(t, sample(12, &agentv1.Signal{Name: "gpu.memory.available", Available: 1})), reused: true},
		{name: "fields in reverse order", in: appendField(appendField(nil, fieldSample, sampleBody), fieldSeq, uint64(3)), reused: true},
		{name: "hello", in: mustMarshal(t, &agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{NodeName: "n1"}}})},
		{name: "condition", in: mustMarshal(t, &agentv1.ConnectRequest{Seq: 2, Msg: &agentv1.ConnectRequest_Condition{Condition: &agentv1.ConditionChange{}}})},
		{name: "seq only", in: mustMarshal(t, &agentv1.ConnectRequest{Seq: 4})},
		{name: "empty message", in: nil},
		{name: "more signals than reused", in: mustMarshal(t, sample(13, manySignals(maxReusedSignals+1)...))},
		{name: "as many signals as reused", in: mustMarshal(t, sample(14, manySignals(maxReusedSignals)...)), reused: true},
		{name: "sample twice (protobuf merges)", in: appendField(appendField(nil, fieldSample, sampleBody), fieldSample, sampleBody)},
		{name: "heartbeat then sample (the last wins)", in: appendField(mustMarshal(t, heartbeat(5)), fieldSample, sampleBody)},
		{name: "seq twice (the last wins)", in: appendField(mustMarshal(t, sample(15, mem)), fieldSeq, uint64(99))},
		{name: "unknown field", in: appendField(mustMarshal(t, sample(16, mem)), 99, uint64(1))},
		{name: "unknown fixed32 field", in: appendField(mustMarshal(t, sample(17, mem)), 98, uint32(1))},
		{name: "unknown field in a signal", in: appendField(nil, fieldSample, appendField(nil, fieldSignals, appendField(mustMarshal(t, mem), 7, uint64(1))))},
		{name: "signal name twice", in: appendField(nil, fieldSample, appendField(nil, fieldSignals, appendField(mustMarshal(t, mem), fieldName, []byte("pid.available"))))},
		{name: "name as a varint", in: appendField(nil, fieldSample, appendField(nil, fieldSignals, appendField(nil, fieldName, uint64(1))))},
		{name: "invalid UTF-8 name", in: appendField(nil, fieldSample, appendField(nil, fieldSignals, appendField(nil, fieldName, []byte{0xff, 'a'}))), fails: true},
		{name: "truncated", in: mustMarshal(t, sample(18, mem))[:20], fails: true},
		{name: "bad tag", in: []byte{0x00, 0x01}, fails: true},
		{name: "negative values", in: mustMarshal(t, sample(19, &agentv1.Signal{Name: "memory.available", Available: -1, Capacity: -1 << 62})), reused: true},
	}
	var d Decoder
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := new(agentv1.ConnectRequest)
			werr := proto.Unmarshal(tt.in, want)
			got, reused, err := d.Decode(tt.in)
			if (err != nil) != tt.fails || (werr != nil) != tt.fails {
				t.Fatalf("Decode error %v, proto.Unmarshal error %v; want failure %v", err, werr, tt.fails)
			}
			if err != nil {
				return
			}
			if reused != tt.reused {
				t.Errorf("reused = %v, want %v", reused, tt.reused)
			}
			if !proto.Equal(got, want) {
				t.Errorf("Decode = %v\nproto.Unmarshal = %v", got, want)
			}
		})
	}
}

// TestDecodeAllocates nothing for what agents send all day.
func TestDecodeAllocates(t *testing.T) {
	in := mustMarshal(t, sample(1, &agentv1.Signal{Name: "memory.available", Available: 1 << 30}, &agentv1.Signal{Name: "pid.available", Available: 1000}))
	hb := mustMarshal(t, heartbeat(2))
	var d Decoder
	d.Decode(in) // grows the reused signals once
	allocs := testing.AllocsPerRun(100, func() {
		if _, reused, err := d.Decode(in); err != nil || !reused {
			t.Fatalf("Decode: reused %v, %v", reused, err)
		}
		if _, reused, err := d.Decode(hb); err != nil || !reused {
			t.Fatalf("Decode heartbeat: reused %v, %v", reused, err)
		}
	})
	if allocs != 0 {
		t.Errorf("Decode allocates %v times per sample and heartbeat, want 0", allocs)
	}
}

// FuzzDecode: whatever the bytes, Decode agrees with proto.Unmarshal, also after decoding another
// message first with the same Decoder.
func FuzzDecode(f *testing.F) {
	mem := &agentv1.Signal{Name: "memory.available", Available: 8 << 30, Capacity: 64 << 30}
	for _, m := range []proto.Message{sample(1, mem), sample(2), heartbeat(3), sample(4, manySignals(3)...),
		&agentv1.ConnectRequest{Seq: 1, Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{NodeName: "n1"}}},
		&agentv1.ConnectRequest{Seq: 5, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{LeaseWanted: true, LeaseEpoch: 9, LeaseGrantId: 3}}}} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, b)
	}
	f.Fuzz(func(t *testing.T, first, second []byte) {
		var d Decoder
		d.Decode(first)
		for _, in := range [][]byte{second, first} {
			want := new(agentv1.ConnectRequest)
			werr := proto.Unmarshal(in, want)
			got, _, err := d.Decode(in)
			if (err != nil) != (werr != nil) {
				t.Fatalf("Decode error %v, proto.Unmarshal error %v", err, werr)
			}
			if err == nil && !proto.Equal(got, want) {
				t.Fatalf("Decode = %v\nproto.Unmarshal = %v", got, want)
			}
		}
	})
}
