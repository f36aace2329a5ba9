package agentwire

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

// benchDecode decodes m's encoding once per iteration on one Decoder, as a stream does, and fails
// when the message is not decoded into reused memory.
func benchDecode(b *testing.B, m *agentv1.ConnectRequest) {
	enc, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	var d Decoder
	b.ReportAllocs()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if _, reused, err := d.Decode(enc); err != nil || !reused {
			b.Fatalf("decode: reused %v, error %v", reused, err)
		}
	}
}

// BenchmarkDecodeSample is the ingest path's message: a sample of two kubelet signals (as
// bench-ingest sends). It must not allocate.
func BenchmarkDecodeSample(b *testing.B) {
	benchDecode(b, &agentv1.ConnectRequest{Seq: 1234, Msg: &agentv1.ConnectRequest_Sample{Sample: &agentv1.SignalSample{
		ObservedAt: &timestamppb.Timestamp{Seconds: 1_800_000_000, Nanos: 123456789},
		Signals: []*agentv1.Signal{
			{Name: "memory.available", Available: 8 << 30, Capacity: 64 << 30},
			{Name: "pid.available", Available: 4000000, Capacity: 4194304},
		},
	}}})
}

// BenchmarkDecodeHeartbeat is a heartbeat that asks for a watchdog lease.
func BenchmarkDecodeHeartbeat(b *testing.B) {
	benchDecode(b, &agentv1.ConnectRequest{Seq: 1234, Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{
		SentAt: &timestamppb.Timestamp{Seconds: 1_800_000_000, Nanos: 123456789}, LeaseWanted: true, LeaseEpoch: 7, LeaseGrantId: 99,
	}}})
}
