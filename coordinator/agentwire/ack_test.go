package agentwire

import (
	"bytes"
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
)

func ackResponse(seq uint64) *agentv1.ConnectResponse {
	return &agentv1.ConnectResponse{Msg: &agentv1.ConnectResponse_Ack{Ack: &agentv1.Ack{AckedSeq: seq}}}
}

// AppendAck writes what protobuf-go writes for the acknowledgement, and it decodes back to it.
func TestAppendAck(t *testing.T) {
	for _, seq := range []uint64{0, 1, 127, 128, 16383, 16384, 1 << 32, math.MaxInt64, math.MaxUint64} {
		want, err := proto.Marshal(ackResponse(seq))
		if err != nil {
			t.Fatal(err)
		}
		got := AppendAck([]byte("prefix"), seq)
		if !bytes.Equal(got[len("prefix"):], want) || string(got[:len("prefix")]) != "prefix" {
			t.Fatalf("seq %d: AppendAck %x, protobuf-go %x", seq, got, want)
		}
		var back agentv1.ConnectResponse
		if err := proto.Unmarshal(got[len("prefix"):], &back); err != nil || !proto.Equal(&back, ackResponse(seq)) {
			t.Fatalf("seq %d: decodes to %v (%v)", seq, &back, err)
		}
	}
}

// BenchmarkAppendAck is the acknowledgement every agent stream sends once a second, into a reused
// buffer; BenchmarkMarshalAck is the same through protobuf-go, as before.
func BenchmarkAppendAck(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	for i := uint64(0); b.Loop(); i++ {
		buf = AppendAck(buf[:0], 1000+i)
	}
}

func BenchmarkMarshalAck(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	m := ackResponse(0)
	for i := uint64(0); b.Loop(); i++ {
		m.GetAck().AckedSeq = 1000 + i
		buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], m)
	}
}
