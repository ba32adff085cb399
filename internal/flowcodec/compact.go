package flowcodec

import (
	"encoding/binary"
	"slices"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The compact path carries a hundred flows in a message of three packed
// arrays; protobuf-go decodes them through its reflection tables and
// allocates each array, and encodes each answer message in two passes
// (size, then bytes). Both are a tenth of the server's CPU on a compact
// stream. The compact messages are decoded here into one allocation of both
// id arrays, and the stream's answers are encoded in one pass into a pooled
// buffer — the same bytes protobuf-go writes (TestCompactEncoderMatchesProto).

// decodeCompactStream decodes b into m, reset first as protobuf-go resets
// it, but keeping its batch's arrays for the new one: a stream that
// receives into the message it answered last (DecideCompactStream's ring)
// allocates nothing per message.
func decodeCompactStream(b []byte, m *verdictv1.DecideCompactStreamRequest) bool {
	spare := m.Batch
	m.Reset()
	if spare != nil {
		resetCompact(spare)
	}
	for len(b) > 0 {
		num, typ, v, rest, ok := nextField(b)
		switch {
		case !ok:
			return false
		case num == 1 && typ == protowire.VarintType:
			m.Id, _ = protowire.ConsumeVarint(v)
		case num == 2 && typ == protowire.BytesType:
			if m.Batch == nil {
				if m.Batch, spare = spare, nil; m.Batch == nil {
					m.Batch = &verdictv1.DecideCompactRequest{}
				}
			}
			if !decodeCompact(v, m.Batch) { // a repeated message field merges
				return false
			}
		default:
			return false
		}
		b = rest
	}
	return true
}

// decodeCompact adds the fields of b to m. The arrays are taken packed only
// (as every encoder writes them); the unpacked form goes to protobuf-go.
func decodeCompact(b []byte, m *verdictv1.DecideCompactRequest) bool {
	src, dst, ports, ok := packedSizes(b)
	if !ok {
		return false
	}
	if len(m.SourceIds)+src > cap(m.SourceIds) && len(m.DestinationIds)+dst > cap(m.DestinationIds) {
		// One array for both: the capacities are exact, so an append to
		// either copies rather than writes into the other.
		ns, nd := len(m.SourceIds)+src, len(m.DestinationIds)+dst
		ids := make([]uint64, ns+nd)
		m.SourceIds = append(ids[:0:ns], m.SourceIds...)
		m.DestinationIds = append(ids[ns:ns:ns+nd], m.DestinationIds...)
	}
	m.PortProtocols = slices.Grow(m.PortProtocols, ports)
	for len(b) > 0 {
		num, typ, v, rest, _ := nextField(b) // packedSizes parsed every field
		switch {
		case (num == 1 || num == 2) && typ == protowire.BytesType:
			s, ok := internString(v)
			if !ok {
				return false
			}
			if num == 1 {
				m.Mesh = s
			} else {
				m.Type = s
			}
		case (num == 3 || num == 4) && typ == protowire.BytesType:
			if len(v)%8 != 0 {
				return false
			}
			out := &m.SourceIds
			if num == 4 {
				out = &m.DestinationIds
			}
			at := len(*out)
			*out = slices.Grow(*out, len(v)/8)[:at+len(v)/8]
			for i := range len(v) / 8 {
				(*out)[at+i] = binary.LittleEndian.Uint64(v[8*i:])
			}
		case num == 5 && typ == protowire.BytesType:
			if !appendPorts(&m.PortProtocols, v) {
				return false
			}
		case num == 6 && typ == protowire.VarintType:
			x, _ := protowire.ConsumeVarint(v)
			m.MinRevision = int64(x)
		default:
			return false
		}
		b = rest
	}
	return true
}

// appendPorts appends the packed varints of v to *out, as protobuf-go
// decodes a packed uint32 field (a wider varint keeps its low 32 bits).
func appendPorts(out *[]uint32, v []byte) bool {
	for len(v) > 0 {
		var x uint64
		k := 1
		switch { // a port word is at most three bytes (protocol<<16 | port)
		case v[0] < 0x80:
			x = uint64(v[0])
		case len(v) > 1 && v[1] < 0x80:
			x, k = uint64(v[0]&0x7f)|uint64(v[1])<<7, 2
		case len(v) > 2 && v[2] < 0x80:
			x, k = uint64(v[0]&0x7f)|uint64(v[1]&0x7f)<<7|uint64(v[2])<<14, 3
		default:
			if x, k = protowire.ConsumeVarint(v); k < 0 {
				return false
			}
		}
		*out = append(*out, uint32(x))
		v = v[k:]
	}
	return true
}

// nextField splits the field at the head of b: its number and wire type,
// its value (a length-delimited field's content, any other's encoding) and
// what follows it; ok is false when b does not parse there.
func nextField(b []byte) (num protowire.Number, typ protowire.Type, v, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, nil, false
	}
	b = b[n:]
	if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
		return 0, 0, nil, nil, false
	}
	v, rest = b[:n], b[n:]
	if typ == protowire.BytesType {
		v, _ = protowire.ConsumeBytes(v)
	}
	return num, typ, v, rest, true
}

// resetCompact resets m as protobuf-go does before decoding into it, but
// keeps its arrays' memory.
func resetCompact(m *verdictv1.DecideCompactRequest) {
	s, d, p := m.SourceIds[:0], m.DestinationIds[:0], m.PortProtocols[:0]
	m.Reset()
	m.SourceIds, m.DestinationIds, m.PortProtocols = s, d, p
}

// packedSizes counts the values of the packed arrays of an encoded
// DecideCompactRequest, to size them once; ok is false for bytes that do
// not parse as fields (the decoder then declines).
func packedSizes(b []byte) (src, dst, ports int, ok bool) {
	for len(b) > 0 {
		num, typ, v, rest, ok := nextField(b)
		if !ok {
			return 0, 0, 0, false
		}
		if typ == protowire.BytesType {
			switch num {
			case 3:
				src += len(v) / 8
			case 4:
				dst += len(v) / 8
			case 5:
				for _, c := range v {
					if c < 0x80 { // a varint's last byte
						ports++
					}
				}
			}
		}
		b = rest
	}
	return src, dst, ports, true
}

// Encode encodes v when it is a compact stream's answer that carries no
// error and no unknown field, in the bytes protobuf-go would write (buffers
// from gRPC's pool, as gRPC's codec does); false leaves v to protobuf-go.
func Encode(v any) (mem.BufferSlice, bool) {
	m, ok := v.(*verdictv1.DecideCompactStreamResponse)
	if !ok || m.Error != nil || len(m.ProtoReflect().GetUnknown()) > 0 {
		return nil, false
	}
	batch, inner, answers := m.Batch, 0, 0
	if batch != nil {
		if len(batch.ProtoReflect().GetUnknown()) > 0 {
			return nil, false
		}
		for _, p := range batch.Policies {
			if !utf8.ValidString(p) { // protobuf-go refuses to encode it
				return nil, false
			}
		}
		answers = answersSize(batch.Answers)
		inner = compactSize(batch, answers)
	}
	size := 0
	if m.Id != 0 {
		size += 1 + protowire.SizeVarint(m.Id)
	}
	if batch != nil {
		size += 1 + protowire.SizeBytes(inner)
	}
	var buf *[]byte
	var pool mem.BufferPool
	if mem.IsBelowBufferPoolingThreshold(size) {
		b := make([]byte, 0, size)
		buf = &b
	} else {
		pool = mem.DefaultBufferPool()
		buf = pool.Get(size)
	}
	b := (*buf)[:0]
	if m.Id != 0 {
		b = protowire.AppendVarint(append(b, 1<<3|byte(protowire.VarintType)), m.Id)
	}
	if batch != nil {
		b = protowire.AppendVarint(append(b, 2<<3|byte(protowire.BytesType)), uint64(inner))
		b = appendCompact(b, batch, answers)
	}
	*buf = b
	if pool == nil {
		return mem.BufferSlice{mem.SliceBuffer(b)}, true
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, true
}

// compactSize is the encoded size of m's fields, answers that of its
// answers' values.
func compactSize(m *verdictv1.DecideCompactResponse, answers int) int {
	n := 0
	if len(m.Answers) > 0 {
		n += 1 + protowire.SizeBytes(answers)
	}
	for _, p := range m.Policies {
		n += 1 + protowire.SizeBytes(len(p))
	}
	if m.Revision != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.Revision))
	}
	return n
}

func answersSize(as []uint32) int {
	n := 0
	for _, a := range as {
		n += protowire.SizeVarint(uint64(a))
	}
	return n
}

func appendCompact(b []byte, m *verdictv1.DecideCompactResponse, answers int) []byte {
	if len(m.Answers) > 0 {
		b = protowire.AppendVarint(append(b, 1<<3|byte(protowire.BytesType)), uint64(answers))
		for _, a := range m.Answers {
			b = protowire.AppendVarint(b, uint64(a))
		}
	}
	for _, p := range m.Policies {
		b = protowire.AppendString(append(b, 2<<3|byte(protowire.BytesType)), p)
	}
	if m.Revision != 0 {
		b = protowire.AppendVarint(append(b, 3<<3|byte(protowire.VarintType)), uint64(m.Revision))
	}
	return b
}
