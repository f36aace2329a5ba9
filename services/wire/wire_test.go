package wire

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestCodecPassesEncodedThrough(t *testing.T) {
	c := Codec()
	if c.Name() != "proto" {
		t.Fatalf("Name = %q: the codec must keep gRPC's proto content subtype", c.Name())
	}
	e := &Encoded{B: []byte("abc")}
	out, err := c.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	e.B[0] = 'X' // the caller reuses its buffer as soon as SendMsg returns
	if got := out.Materialize(); string(got) != "abc" {
		t.Errorf("Marshal(*Encoded) = %q after the caller changed its buffer, want %q", got, "abc")
	}
	out.Free()

	// Unmarshal joins gRPC's buffers into e.B, reusing its capacity.
	in := &Encoded{B: make([]byte, 0, 64)}
	backing := &in.B[:1][0]
	data := mem.BufferSlice{mem.SliceBuffer("hello, "), mem.SliceBuffer("world")}
	if err := c.Unmarshal(data, in); err != nil {
		t.Fatal(err)
	}
	if string(in.B) != "hello, world" || &in.B[0] != backing {
		t.Errorf("Unmarshal into *Encoded = %q (same buffer: %v)", in.B, &in.B[0] == backing)
	}
}

func TestCodecIsProtoForMessages(t *testing.T) {
	c := Codec()
	m := wrapperspb.String("a message")
	out, err := c.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(m)
	if !bytes.Equal(out.Materialize(), want) {
		t.Errorf("Marshal = %x, want protobuf's %x", out.Materialize(), want)
	}
	var back wrapperspb.StringValue
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, &back); err != nil || back.Value != "a message" {
		t.Errorf("Unmarshal = %q, %v", back.Value, err)
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0xff})}, &back); err == nil {
		t.Error("Unmarshal of truncated bytes succeeded")
	}
}
