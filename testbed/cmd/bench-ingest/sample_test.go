package main

import (
	"bytes"
	"testing"
	"time"
)

// appendSample writes what protobuf-go writes for the sampler's message, whatever the seq and time.
func TestAppendSample(t *testing.T) {
	s := newSampler()
	for _, seq := range []uint64{2, 127, 128, 1023, 1024, 1 << 20, 1 << 40} {
		for _, now := range []time.Time{time.Unix(1_800_000_000, 0), time.Unix(1_800_000_000, 1), time.Unix(1_800_000_000, 999_999_999), time.Now()} {
			want, err := appendMessage([]byte("x"), s.next(seq, now))
			if err != nil {
				t.Fatal(err)
			}
			if got := appendSample([]byte("x"), seq, now); !bytes.Equal(got, want) {
				t.Fatalf("seq %d at %v:\n got  %x\n want %x", seq, now, got, want)
			}
		}
	}
}

// BenchmarkAppendSample is the h2 generator's encoding of one sample; BenchmarkMarshalSample is
// protobuf-go's, which it replaced.
func BenchmarkAppendSample(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	now := time.Now()
	for i := uint64(2); b.Loop(); i++ {
		buf = appendSample(buf[:0], i, now)
	}
}

func BenchmarkMarshalSample(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	now := time.Now()
	s := newSampler()
	for i := uint64(2); b.Loop(); i++ {
		buf, _ = appendMessage(buf[:0], s.next(i, now))
	}
}
