package loadtest

// The compact scenarios' wire: a batch is encoded once, before the run, and
// sent as those bytes on every call (a stream message is a few bytes of
// header in front of the batch's, not a copy); an answer is read by walking
// its answer words, counting them and checking their codes, into no message.
// A sidecar does as much — it packs its flows once and reads the words — and
// the load tester shares the cores with the server it measures: encoding
// 1,000 fixed64 pairs per call with protobuf-go and decoding every answer's
// policy names into strings was the larger part of its CPU. The empty
// handler and verdictd receive the same bytes.

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// encodedBatch is a DecideCompactRequest's bytes; sent as a whole message
// (DecideCompact) or as the batch of a stream message (withID).
type encodedBatch struct {
	b []byte
	n int // flows
}

func encodeBatches(batches []*verdictv1.DecideCompactRequest) ([]encodedBatch, error) {
	out := make([]encodedBatch, len(batches))
	for i, r := range batches {
		b, err := proto.Marshal(r)
		if err != nil {
			return nil, err
		}
		out[i] = encodedBatch{b: b, n: len(r.GetSourceIds())}
	}
	return out, nil
}

// streamMessage is a DecideCompactStreamRequest: its id, then the batch.
type streamMessage struct {
	hdr   []byte // field 1 (id) and the tag and length of field 2, reused
	batch []byte
}

func (m *streamMessage) set(id uint64, batch []byte) {
	m.hdr = m.hdr[:0]
	if id != 0 { // proto3: a zero is not sent
		m.hdr = protowire.AppendTag(m.hdr, 1, protowire.VarintType)
		m.hdr = protowire.AppendVarint(m.hdr, id)
	}
	m.hdr = protowire.AppendTag(m.hdr, 2, protowire.BytesType)
	m.hdr = protowire.AppendVarint(m.hdr, uint64(len(batch)))
	m.batch = batch
}

// answers is what an answer (DecideCompactResponse, or the stream's
// DecideCompactStreamResponse) holds for the load tester: its answer words
// counted, the first per-flow error code, a whole-batch error.
type answers struct {
	stream bool // a DecideCompactStreamResponse
	n      int
	err    error
}

// compactCodec sends encodedBatch and streamMessage as their bytes and reads
// answers; any other message goes to protobuf-go's codec. Its name is
// "proto", so the server sees the content type of any client.
type compactCodec struct{ proto encoding.CodecV2 }

func newCompactCodec() compactCodec { return compactCodec{proto: encoding.GetCodecV2("proto")} }

func (c compactCodec) Name() string { return "proto" }

func (c compactCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *encodedBatch:
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	case *streamMessage:
		return mem.BufferSlice{mem.SliceBuffer(m.hdr), mem.SliceBuffer(m.batch)}, nil
	}
	return c.proto.Marshal(v)
}

func (c compactCodec) Unmarshal(data mem.BufferSlice, v any) error {
	a, ok := v.(*answers)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	a.n, a.err = 0, nil
	if !a.stream {
		return a.readBatch(b)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num == 2 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := a.readBatch(v); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		if num == 3 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			e := &verdictv1.Error{}
			if err := proto.Unmarshal(v, e); err != nil {
				return err
			}
			a.err = fmt.Errorf("%s: %s", e.GetCode(), e.GetMessage())
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// readBatch reads a DecideCompactResponse: the answer words (field 1,
// packed or not), the rest skipped.
func (a *answers) readBatch(b []byte) error {
	word := func(w uint64) {
		a.n++
		if code := w >> 3 & 15; code != 0 && a.err == nil {
			a.err = fmt.Errorf("flow %d: %s", a.n-1, verdictv1.CompactCode(code))
		}
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			for len(v) > 0 {
				w, m := protowire.ConsumeVarint(v)
				if m < 0 {
					return protowire.ParseError(m)
				}
				word(w)
				v = v[m:]
			}
			b = b[n:]
		case num == 1 && typ == protowire.VarintType:
			w, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			word(w)
			b = b[n:]
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

var errShortAnswer = errors.New("fewer answers than flows")
