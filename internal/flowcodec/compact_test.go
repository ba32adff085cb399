package flowcodec

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestCompactEncoderMatchesProto: Encode writes protobuf-go's bytes for any
// answer it takes, and declines an answer with an error, an unknown field
// or a policy that is not UTF-8 (protobuf-go refuses that one).
func TestCompactEncoderMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	answer := func() *verdictv1.DecideCompactStreamResponse {
		m := &verdictv1.DecideCompactStreamResponse{Id: rng.Uint64() >> rng.IntN(64)}
		if rng.IntN(8) == 0 {
			return m // no batch
		}
		b := &verdictv1.DecideCompactResponse{Revision: rng.Int64() >> rng.IntN(64)}
		if rng.IntN(8) == 0 {
			b.Revision = -b.Revision - 1
		}
		for range rng.IntN(1200) { // over and under gRPC's pooling threshold
			b.Answers = append(b.Answers, rng.Uint32()>>rng.IntN(32))
		}
		for i := range rng.IntN(5) {
			b.Policies = append(b.Policies, string(make([]byte, i*40))+"p-ü")
		}
		m.Batch = b
		return m
	}
	for i := range 500 {
		m := answer()
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := Encode(m)
		if !ok {
			t.Fatalf("answer %d not taken: %v", i, m)
		}
		if b := got.Materialize(); !bytes.Equal(b, want) {
			t.Fatalf("answer %d: encoded\n%x\nprotobuf-go\n%x", i, b, want)
		}
		got.Free()
	}
	withError := &verdictv1.DecideCompactStreamResponse{Id: 1, Error: &verdictv1.Error{Message: "x"}}
	unknown := &verdictv1.DecideCompactStreamResponse{Batch: &verdictv1.DecideCompactResponse{}}
	unknown.Batch.ProtoReflect().SetUnknown([]byte{0x98, 0x06, 0x01})
	notUTF8 := &verdictv1.DecideCompactStreamResponse{Batch: &verdictv1.DecideCompactResponse{Policies: []string{"\xff"}}}
	for name, m := range map[string]any{"an error": withError, "an unknown field": unknown, "a policy not UTF-8": notUTF8,
		"another message": &verdictv1.DecideCompactResponse{}} {
		if _, ok := Encode(m); ok {
			t.Errorf("%s: taken", name)
		}
	}
}

// TestCompactDecodeReuses: a compact message decoded into one decoded
// before (and marked, as the server's codec marks an undecodable one) is
// the message protobuf-go gives, in the arrays of the one before.
func TestCompactDecodeReuses(t *testing.T) {
	msgs := map[string][]byte{}
	compactMessages(t, msgs)
	for first, a := range msgs {
		for second, b := range msgs {
			for _, mk := range []func() proto.Message{
				func() proto.Message { return &verdictv1.DecideCompactRequest{} },
				func() proto.Message { return &verdictv1.DecideCompactStreamRequest{} },
			} {
				m := mk()
				if !Decode(mem.BufferSlice{mem.SliceBuffer(a)}, m) {
					continue
				}
				m.ProtoReflect().SetUnknown([]byte{0x98, 0x06, 0x01})
				want := mk()
				wantErr := proto.Unmarshal(b, want)
				if !Decode(mem.BufferSlice{mem.SliceBuffer(b)}, m) {
					continue
				}
				if wantErr != nil || !proto.Equal(m, want) {
					t.Errorf("%s after %s as %T: got\n%v\nprotobuf-go (%v)\n%v", second, first, m, m, wantErr, want)
				}
			}
		}
	}
	// The arrays are reused: a second message of the same size allocates
	// no array.
	req := msgs["compact stream"]
	m := &verdictv1.DecideCompactStreamRequest{}
	data := mem.BufferSlice{mem.SliceBuffer(req)}
	Decode(data, m)
	if n := testing.AllocsPerRun(10, func() { Decode(data, m) }); n != 0 {
		t.Errorf("decoding into a used message: %.0f allocations, want 0", n)
	}
}

// BenchmarkCompact: a compact stream's message of 100 flows decoded, and its
// answer encoded, here and by protobuf-go.
func BenchmarkCompact(b *testing.B) {
	msgs := map[string][]byte{}
	compactMessages(b, msgs)
	req := msgs["compact stream"]
	ans := &verdictv1.DecideCompactStreamResponse{Id: 7, Batch: &verdictv1.DecideCompactResponse{
		Policies: []string{"p-004242-svc-17-to-svc-42", "deny-all"}, Revision: 100042}}
	for i := range 100 {
		ans.Batch.Answers = append(ans.Batch.Answers, uint32(i%2+1)<<8|1)
	}
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !Decode(mem.BufferSlice{mem.SliceBuffer(req)}, &verdictv1.DecideCompactStreamRequest{}) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("decode-reused", func(b *testing.B) {
		b.ReportAllocs()
		m := &verdictv1.DecideCompactStreamRequest{}
		for b.Loop() {
			if !Decode(mem.BufferSlice{mem.SliceBuffer(req)}, m) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("decode-protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(req, &verdictv1.DecideCompactStreamRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			out, _ := Encode(ans)
			out.Free()
		}
	})
	b.Run("encode-protobuf-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := proto.Marshal(ans); err != nil {
				b.Fatal(err)
			}
		}
	})
}
