package agentwire

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers of the acknowledgement (proto/nodefence/agent/v1/agent.proto).
const (
	fieldAck      = 1 // ConnectResponse.ack
	fieldAckedSeq = 1 // Ack.acked_seq
)

// AppendAck appends the encoding of ConnectResponse{ack: {acked_seq: seq}} to b, the bytes
// protobuf-go writes for it (TestAppendAck), without building the message: every stream sends one
// a second.
func AppendAck(b []byte, seq uint64) []byte {
	b = protowire.AppendTag(b, fieldAck, protowire.BytesType)
	if seq == 0 { // proto3 leaves a zero field out: an empty Ack
		return protowire.AppendVarint(b, 0)
	}
	b = protowire.AppendVarint(b, uint64(protowire.SizeTag(fieldAckedSeq)+protowire.SizeVarint(seq)))
	b = protowire.AppendTag(b, fieldAckedSeq, protowire.VarintType)
	return protowire.AppendVarint(b, seq)
}
