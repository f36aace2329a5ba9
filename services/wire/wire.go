// Package wire holds what nodefence's gRPC servers and clients agree on below the API: the static
// flow-control windows, and a codec that can hand a busy stream a message's encoded bytes, so that
// the stream can decode its common messages into memory it reuses instead of allocating each time.
package wire

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Static flow-control windows. What nodefence peers send each other is small (agent samples, fence
// requests), so a fixed window bounds what one peer can make the other buffer, and it spares the
// bandwidth-delay-product pings of a dynamic window, which cost the coordinator about 7% of its CPU
// at 50,000 agent messages a second (make bench-ingest). grpc-go keeps a window static when it is
// set to at least 64 KiB.
const (
	// StreamWindow is each stream's receive window in bytes.
	StreamWindow = 64 << 10
	// ConnWindow is each connection's receive window in bytes.
	ConnWindow = 1 << 20
)

// Encoded is one message still in its encoding. RecvMsg(&e) on a stream served or called with Codec
// stores the message's bytes in e.B, reusing e.B's capacity; SendMsg(&e) sends e.B as it is (copied,
// so e.B may be reused as soon as SendMsg returns).
type Encoded struct {
	B []byte
}

// Codec is the protobuf codec gRPC uses by default, extended to pass *Encoded through undecoded.
// Every other message is marshalled and unmarshalled exactly as without it.
func Codec() encoding.CodecV2 { return codec{encoding.GetCodecV2(proto.Name)} }

type codec struct{ proto encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*Encoded); ok {
		// gRPC writes the buffer after SendMsg returns, so it gets its own copy.
		return mem.BufferSlice{mem.Copy(e.B, mem.DefaultBufferPool())}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if e, ok := v.(*Encoded); ok {
		e.B = e.B[:0]
		for _, b := range data {
			e.B = append(e.B, b.ReadOnlyData()...)
		}
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// Name is the content subtype: the codec speaks plain protobuf on the wire.
func (codec) Name() string { return proto.Name }
