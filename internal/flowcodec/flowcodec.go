// Package flowcodec decodes the flow requests — DecideRequest,
// DecideBatchRequest, DecideStreamRequest and the compact ones — without
// protobuf-go's reflection, tag strings interned, and encodes the compact
// stream's answers (compact.go). Decoding the tag maps was the largest
// cost of a batch (a third of the CPU of client and server together,
// BENCHMARKS.md): protobuf-go allocates every key and value of every flow,
// though a sidecar sends the same few hundred strings again and again.
//
// It takes only what it fully understands: the fields of the schema, with
// their wire types, valid UTF-8. Anything else — an unknown field, a wrong
// wire type, a truncated value, invalid UTF-8 — makes Decode decline, and the
// caller (the server's codec) decodes the message with protobuf-go, which
// reports the error precisely (or keeps the unknown field). So the result is
// always the message protobuf-go would give: FuzzFlowDecoderMatchesProto
// checks that on any input, and TestFlowDecoderKnowsTheSchema fails when the
// protos gain a field the decoder does not know. It imports no more than
// protobuf's wire format, gRPC's buffers and the API's messages.
package flowcodec

import (
	"hash/maphash"
	"slices"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// flowFields lists, per message, the fields Decode handles and their wire
// types; TestFlowDecoderKnowsTheSchema compares it with the descriptors.
var flowFields = map[string]map[protowire.Number]protowire.Type{
	"verdict.v1.DecideRequest": {
		1: protowire.BytesType, 2: protowire.BytesType, 3: protowire.BytesType, 4: protowire.BytesType,
		5: protowire.BytesType, 6: protowire.VarintType, 7: protowire.VarintType, 8: protowire.VarintType,
		9: protowire.VarintType, 10: protowire.BytesType,
	},
	"verdict.v1.Endpoint": {
		1: protowire.BytesType, 2: protowire.BytesType, 3: protowire.BytesType, 4: protowire.BytesType,
		5: protowire.VarintType,
	},
	"verdict.v1.DecideBatchRequest":  {1: protowire.BytesType, 2: protowire.VarintType, 3: protowire.VarintType, 4: protowire.BytesType},
	"verdict.v1.DecideStreamRequest": {1: protowire.BytesType, 2: protowire.BytesType},
	// The compact arrays are taken packed (BytesType).
	"verdict.v1.DecideCompactRequest": {
		1: protowire.BytesType, 2: protowire.BytesType, 3: protowire.BytesType, 4: protowire.BytesType,
		5: protowire.BytesType, 6: protowire.VarintType,
	},
	"verdict.v1.DecideCompactStreamRequest": {1: protowire.VarintType, 2: protowire.BytesType},
}

// presize bounds the flows of a batch allocated together (a first pass
// counts them); a batch over it has its further flows allocated one by one.
// The server refuses a batch over its limit (1,000) before decoding it.
const presize = 1024

// Decode decodes data into v when v is one of the flow requests and the
// bytes hold nothing unexpected; false leaves v to protobuf-go (v may then be
// partly filled: protobuf-go resets it first). It never keeps data: every
// string kept is copied or interned.
func Decode(data mem.BufferSlice, v any) bool {
	switch v.(type) {
	case *verdictv1.DecideRequest, *verdictv1.DecideBatchRequest, *verdictv1.DecideStreamRequest,
		*verdictv1.DecideCompactRequest, *verdictv1.DecideCompactStreamRequest:
	default:
		return false
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData() // only read: every string kept is copied or interned
	} else {
		b = data.Materialize()
	}
	switch m := v.(type) {
	case *verdictv1.DecideRequest:
		var eps endpointSlab
		return decodeDecide(b, m, &eps)
	case *verdictv1.DecideBatchRequest:
		return decodeBatch(b, m)
	case *verdictv1.DecideStreamRequest:
		return decodeStreamRequest(b, m)
	case *verdictv1.DecideCompactRequest:
		resetCompact(m)
		return decodeCompact(b, m)
	case *verdictv1.DecideCompactStreamRequest:
		return decodeCompactStream(b, m)
	}
	return false
}

func decodeBatch(b []byte, m *verdictv1.DecideBatchRequest) bool {
	// The flows and their endpoints come from two slices sized by a first
	// pass: three allocations per batch instead of three per flow.
	n := countFields(b, 1, presize)
	flows := make([]verdictv1.DecideRequest, n)
	eps := endpointSlab(make([]verdictv1.Endpoint, 2*n))
	m.Requests = slices.Grow(m.Requests, n)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			var r *verdictv1.DecideRequest
			if len(flows) > 0 {
				r, flows = &flows[0], flows[1:]
			} else {
				r = &verdictv1.DecideRequest{}
			}
			if !decodeDecide(v, r, &eps) {
				return false
			}
			m.Requests = append(m.Requests, r)
			b = b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			m.MinRevision = int64(v)
			b = b[n:]
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			m.AtRevision = int64(v)
			b = b[n:]
		case num == 4 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !mergeTime(v, &m.AtTime) {
				return false
			}
			b = b[n:]
		default:
			return false
		}
	}
	return true
}

// mergeTime merges an encoded Timestamp into *t, as protobuf-go merges a
// message field given again (rare: past reads; protobuf-go decodes it).
func mergeTime(b []byte, t **timestamppb.Timestamp) bool {
	if *t == nil {
		*t = &timestamppb.Timestamp{}
	}
	return proto.UnmarshalOptions{Merge: true}.Unmarshal(b, *t) == nil
}

// countFields counts the top-level fields of b numbered field (any, with
// 0), up to limit, to size a slice or map once; it stops at the first
// malformed field (the decoder then declines).
func countFields(b []byte, field protowire.Number, limit int) int {
	n := 0
	for len(b) > 0 && n < limit {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			break
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(num, typ, b)
		if l < 0 {
			break
		}
		b = b[l:]
		if field == 0 || num == field {
			n++
		}
	}
	return n
}

// endpointSlab hands out the endpoints of a batch's flows from one slice; an
// empty slab allocates each.
type endpointSlab []verdictv1.Endpoint

func (s *endpointSlab) next() *verdictv1.Endpoint {
	if len(*s) == 0 {
		return &verdictv1.Endpoint{}
	}
	e := &(*s)[0]
	*s = (*s)[1:]
	return e
}

func decodeStreamRequest(b []byte, m *verdictv1.DecideStreamRequest) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case 1:
			if !utf8.Valid(v) {
				return false
			}
			m.Id = string(v) // ids differ per message: not interned
		case 2:
			if m.Request == nil {
				m.Request = &verdictv1.DecideRequest{}
			}
			var eps endpointSlab
			if !decodeDecide(v, m.Request, &eps) { // a repeated message field merges
				return false
			}
		default:
			return false
		}
	}
	return true
}

// decodeDecide adds the fields of b to m; its endpoints come from eps.
func decodeDecide(b []byte, m *verdictv1.DecideRequest, eps *endpointSlab) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num >= 6 && num <= 9):
		case typ == protowire.BytesType && (num >= 1 && num <= 5 || num == 10):
		default:
			return false
		}
		if typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			switch num {
			case 6:
				m.Port = uint32(v)
			case 7:
				m.Explain = v != 0
			case 8:
				m.MinRevision = int64(v)
			case 9:
				m.AtRevision = int64(v)
			}
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var ok bool
		switch num {
		case 1:
			m.Mesh, ok = internString(v)
		case 2:
			m.Type, ok = internString(v)
		case 5:
			m.Protocol, ok = internString(v)
		case 3:
			if m.Source == nil {
				m.Source = eps.next()
			}
			ok = decodeWorkload(v, m.Source)
		case 4:
			if m.Destination == nil {
				m.Destination = eps.next()
			}
			ok = decodeWorkload(v, m.Destination)
		case 10:
			ok = mergeTime(v, &m.AtTime)
		}
		if !ok {
			return false
		}
	}
	return true
}

// decodeWorkload adds the fields of b to w (a repeated message field merges:
// tags add up, a scalar's last value wins).
func decodeWorkload(b []byte, w *verdictv1.Endpoint) bool {
	if w.Tags == nil {
		w.Tags = make(map[string]string, countFields(b, 0, 1<<10))
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 5 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			w.Identity = v
			continue
		case num >= 2 && num <= 4 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			str, ok := internString(v)
			if !ok {
				return false
			}
			switch num {
			case 2:
				w.Workload = str
			case 3:
				w.Address = str
			default:
				w.Principal = str
			}
			continue
		case num != 1 || typ != protowire.BytesType:
			return false
		}
		entry, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		key, value, ok := decodeTag(entry)
		if !ok {
			return false
		}
		w.Tags[key] = value // a repeated key: the last wins, as in protobuf-go
	}
	return true
}

// decodeTag decodes a tag map entry: an entry without a key or value has it
// empty; a field given twice, the last wins.
func decodeTag(entry []byte) (key, value string, ok bool) {
	for len(entry) > 0 {
		num, typ, n := protowire.ConsumeTag(entry)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return "", "", false
		}
		entry = entry[n:]
		v, n := protowire.ConsumeBytes(entry)
		if n < 0 {
			return "", "", false
		}
		entry = entry[n:]
		s, ok := internString(v)
		if !ok {
			return "", "", false
		}
		if num == 1 {
			key = s
		} else {
			value = s
		}
	}
	return key, value, true
}

// The intern table: a fixed number of slots, each holding the last string
// stored there; a hit costs a hash and a comparison, a miss one allocation (as
// protobuf-go would make anyway). Hostile input can only evict: the table never
// grows. (A second table of whole tag entries won in a benchmark of a few
// repeated flows and lost in make loadtest's, whose ends name 40k workloads:
// a miss there cost a third lookup before the two it meant to save.)
const (
	internSlots  = 1 << 13
	internMaxLen = 64 // longer strings are copied, not kept
)

var (
	internSeed  = maphash.MakeSeed()
	internTable [internSlots]atomic.Pointer[string]
)

// internString returns b as a string, shared with earlier calls for the same
// bytes when it can; ok is false when b is not valid UTF-8 (protobuf-go refuses
// such a string field in a proto3 message).
func internString(b []byte) (s string, ok bool) {
	if len(b) == 0 {
		return "", true
	}
	var slot *atomic.Pointer[string]
	if len(b) <= internMaxLen {
		slot = &internTable[maphash.Bytes(internSeed, b)&(internSlots-1)]
		// Only valid UTF-8 is ever stored, so a hit needs no check. The
		// conversion in the comparison does not allocate.
		if p := slot.Load(); p != nil && *p == string(b) {
			return *p, true
		}
	}
	if !utf8.Valid(b) {
		return "", false
	}
	if slot == nil {
		return string(b), true // long: copied, not kept
	}
	fresh := new(string) // only here: a pointer to s itself would put s on the heap on every call
	*fresh = string(b)
	slot.Store(fresh)
	return *fresh, true
}
