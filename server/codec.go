package server

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/fanout"
	"github.com/verdictpdp/verdict/internal/flowcodec"
	"github.com/verdictpdp/verdict/store"
)

// requestCodec is gRPC's proto codec with one difference, for verdict.v1
// messages: a message that does not decode (invalid UTF-8 in a string, a
// truncated field, nesting beyond protobuf's recursion limit) is not refused
// by gRPC itself, which would answer INTERNAL ("failed to unmarshal") before
// any interceptor or handler sees the call. The message is decoded as an empty
// one (plus its singular scalar fields that decode, such as a DecideStream
// message's id) and marked with the path of the field that failed; validation
// (the method table's validators) then answers INVALID_ARGUMENT naming that
// field, and a DecideStream answers that one message and goes on. Other
// messages (health, reflection) keep gRPC's behaviour.
//
// With limits (withLimits), a message of any type over its type's limit is
// not decoded at all: it is left empty and marked oversized, and the method
// table's check refuses it (RESOURCE_EXHAUSTED; Check: a DENY).
type requestCodec struct {
	encoding.CodecV2
	limits   map[protoreflect.FullName]int // by request type; others: def
	def      int                           // 0: no limits
	smallest int                           // the smallest limit: a message within it is never measured further
}

func newRequestCodec() requestCodec {
	return requestCodec{CodecV2: encoding.GetCodecV2(grpcproto.Name)}
}

// withLimits returns the codec measuring requests against limits (by type),
// def for a type without one.
func (c requestCodec) withLimits(limits map[protoreflect.FullName]int, def int) requestCodec {
	c.limits, c.def, c.smallest = limits, def, def
	for _, l := range limits {
		c.smallest = min(c.smallest, l)
	}
	return c
}

// undecodableField is the unknown field that marks an undecodable message:
// the highest valid field number, bytes "path\x00reason".
const undecodableField protowire.Number = protowire.MaxValidNumber

// maxSalvaged bounds the scalar fields decoded from an oversized message
// (its id: MaxStreamIDLen, with room).
const maxSalvaged = 1 << 10

// oversizedField marks a message over its limit, left undecoded: bytes
// "reason". undecodable reports it too, so that a path that checks only
// for undecodable messages refuses it all the same.
const oversizedField protowire.Number = protowire.MaxValidNumber - 1

// maxLocateDepth bounds the search for the failing field in nested messages:
// each level decodes the bytes again, so a hostile nesting costs at most this
// many passes.
const maxLocateDepth = 8

// Marshal implements encoding.CodecV2: a *fanout.Message, shared by many
// streams, is sent as the parts it holds (never modified: gRPC only reads
// them, and a SliceBuffer's Free does not recycle them); a compact stream's
// answer by flowcodec; anything else as gRPC's proto codec does.
func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := flowcodec.Encode(v); ok {
		return b, nil
	}
	if m, ok := v.(*fanout.Message); ok {
		parts, err := m.Parts()
		if err != nil {
			return nil, err
		}
		out := make(mem.BufferSlice, len(parts))
		for i, p := range parts {
			out[i] = mem.SliceBuffer(p)
		}
		return out, nil
	}
	return c.CodecV2.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(proto.Message); ok {
		if n := data.Len(); c.def > 0 && n > c.smallest {
			limit, ok := c.limits[m.ProtoReflect().Descriptor().FullName()]
			if !ok {
				limit = c.def
			}
			if n > limit {
				proto.Reset(m)
				salvageScalars(data.Materialize(), m, maxSalvaged)
				markOversized(m, fmt.Sprintf("%d bytes, over the limit of %d", n, limit))
				return nil
			}
		}
		if field, reason, over := overWireLimit(data, m); over {
			markUndecodable(m, field, reason)
			return nil
		}
	}
	if flowcodec.Decode(data, v) {
		return nil
	}
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok || !marksUndecodable(m.ProtoReflect().Descriptor().FullName()) {
		return err
	}
	b := data.Materialize()
	field, reason := locate(b, m.ProtoReflect(), "", 0)
	proto.Reset(m)
	salvageScalars(b, m, len(b))
	markUndecodable(m, field, reason)
	return nil
}

// marksUndecodable: the messages decoded as empty and marked when they do not
// decode — verdict.v1's, and Envoy's CheckRequest, which Check then answers
// with a DENY (gRPC's INTERNAL would be a failed check, which Envoy lets pass
// under failure_mode_allow).
func marksUndecodable(name protoreflect.FullName) bool {
	return strings.HasPrefix(string(name), "verdict.v1.") || name == "envoy.service.auth.v3.CheckRequest"
}

// markUndecodable marks m (reset or empty) as refused: validation answers
// INVALID_ARGUMENT naming field.
func markUndecodable(m proto.Message, field, reason string) {
	raw := protowire.AppendTag(nil, undecodableField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte(field+"\x00"+reason))
	m.ProtoReflect().SetUnknown(raw)
}

// markOversized marks m (empty) as over its limit.
func markOversized(m proto.Message, reason string) {
	raw := protowire.AppendTag(nil, oversizedField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte(reason))
	m.ProtoReflect().SetUnknown(raw)
}

// oversized returns the reason of a message requestCodec left undecoded for
// its size; ok is false for any other.
func oversized(req any) (reason string, ok bool) {
	v, ok := marker(req, oversizedField)
	return string(v), ok
}

// wireLimit bounds the entries of repeated fields of a request, counted on the
// wire before anything is decoded: a 4 MiB DecideBatch of two million empty
// flows is refused after one pass over its bytes, without allocating a flow.
type wireLimit struct {
	fields []protowire.Number // counted together
	name   string             // the field named in the error
	max    int
	what   string // "flows, over the limit of 1000 per batch"
}

var wireLimits = map[protoreflect.FullName][]wireLimit{
	"verdict.v1.DecideBatchRequest": {{fields: []protowire.Number{1}, name: "requests", max: MaxBatch,
		what: fmt.Sprintf("flows, over the limit of %d per batch", MaxBatch)}},
	"verdict.v1.IdentifyRequest": {{fields: []protowire.Number{2}, name: "endpoints", max: MaxBatch,
		what: fmt.Sprintf("endpoints, over the limit of %d per call", MaxBatch)}},
	// Packed lists count one entry per packed run; these bound lists sent unpacked.
	"verdict.v1.DecideCompactRequest": {
		{fields: []protowire.Number{3}, name: "sourceIds", max: MaxBatch, what: fmt.Sprintf("entries, over the limit of %d per batch", MaxBatch)},
		{fields: []protowire.Number{4}, name: "destinationIds", max: MaxBatch, what: fmt.Sprintf("entries, over the limit of %d per batch", MaxBatch)},
		{fields: []protowire.Number{5}, name: "portProtocols", max: MaxBatch, what: fmt.Sprintf("entries, over the limit of %d per batch", MaxBatch)},
	},
	"verdict.v1.ApplyRequest": {
		{fields: []protowire.Number{1, 2}, name: "resources", max: store.MaxOps,
			what: fmt.Sprintf("resources and deletes, over the limit of %d per call (one etcd transaction): split the write into several calls", store.MaxOps)},
		{fields: []protowire.Number{4}, name: "expectedRevisions", max: store.MaxOps,
			what: fmt.Sprintf("expected revisions, over the limit of %d per call (one per key written)", store.MaxOps)},
	},
	"verdict.v1.DeleteRequest": {
		{fields: []protowire.Number{1}, name: "keys", max: store.MaxOps,
			what: fmt.Sprintf("keys, over the limit of %d per call (one etcd transaction)", store.MaxOps)},
		{fields: []protowire.Number{2}, name: "expectedRevisions", max: store.MaxOps,
			what: fmt.Sprintf("expected revisions, over the limit of %d per call (one per key written)", store.MaxOps)},
	},
}

// overWireLimit counts the entries of m's limited repeated fields in data (a
// walk over the top-level fields, nothing decoded) and names the first field
// over its limit. Malformed bytes end the count; decoding reports them.
func overWireLimit(data mem.BufferSlice, m proto.Message) (field, reason string, over bool) {
	limits := wireLimits[m.ProtoReflect().Descriptor().FullName()]
	if len(limits) == 0 {
		return "", "", false
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	var counts [8]int // the limited fields are numbered below 8
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		l := protowire.ConsumeFieldValue(num, typ, b[n:])
		if l < 0 {
			break
		}
		b = b[n+l:]
		if num < protowire.Number(len(counts)) {
			counts[num]++
		}
	}
	for _, lim := range limits {
		total := 0
		for _, f := range lim.fields {
			total += counts[f]
		}
		if total > lim.max {
			return lim.name, fmt.Sprintf("%d %s", total, lim.what), true
		}
	}
	return "", "", false
}

// undecodable returns the field error of a message requestCodec could not
// decode, or left undecoded for its size (the whole message: field "");
// ok is false for a message that decoded.
func undecodable(req any) (fe resource.FieldError, ok bool) {
	if v, ok := marker(req, undecodableField); ok {
		field, reason, _ := strings.Cut(string(v), "\x00")
		return resource.FieldError{Field: field, Reason: reason}, true
	}
	if reason, ok := oversized(req); ok {
		return resource.FieldError{Reason: reason}, true
	}
	return fe, false
}

// marker returns the bytes of requestCodec's marker field num in req's
// unknown fields.
func marker(req any, num protowire.Number) ([]byte, bool) {
	m, isMsg := req.(proto.Message)
	if !isMsg || m == nil || !m.ProtoReflect().IsValid() {
		return nil, false
	}
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		got, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if got == num && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			return v, n >= 0
		}
		n = protowire.ConsumeFieldValue(got, typ, b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
	}
	return nil, false
}

// locate finds the field of b (a message of m's type) that does not decode,
// descending into nested messages up to maxLocateDepth, and says why.
func locate(b []byte, m protoreflect.Message, path string, depth int) (field, reason string) {
	md := m.Descriptor()
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return path, "does not decode: " + cleanProtoErr(protowire.ParseError(n))
		}
		vlen := protowire.ConsumeFieldValue(num, typ, b[n:])
		fd := md.Fields().ByNumber(num)
		name := fieldName(path, fd, num, seen)
		if vlen < 0 {
			return name, "does not decode: " + cleanProtoErr(protowire.ParseError(vlen))
		}
		whole, value := b[:n+vlen], b[n:n+vlen]
		b = b[n+vlen:]
		if fd == nil {
			continue // an unknown field decodes (and is ignored)
		}
		err := proto.Unmarshal(whole, m.New().Interface())
		if err == nil {
			continue
		}
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && typ == protowire.BytesType && depth < maxLocateDepth &&
			strings.HasPrefix(string(fd.Message().FullName()), "verdict.v1.") { // not into a conf's google.protobuf.Struct
			inner, _ := protowire.ConsumeBytes(value)
			var sub protoreflect.Message
			if fd.IsList() {
				sub = m.NewField(fd).List().NewElement().Message()
			} else {
				sub = m.NewField(fd).Message()
			}
			return locate(inner, sub, name, depth+1)
		}
		return name, "does not decode: " + cleanProtoErr(err)
	}
	// Every field decodes alone: the message as a whole is too deep.
	return path, "does not decode: nested too deeply"
}

// fieldName is the JSON path of a field ("requests[3]", "source.tags").
func fieldName(path string, fd protoreflect.FieldDescriptor, num protowire.Number, seen map[protowire.Number]int) string {
	name := fmt.Sprintf("field %d", num)
	if fd != nil {
		name = fd.JSONName()
		if fd.IsList() {
			name = fmt.Sprintf("%s[%d]", name, seen[num])
		}
	}
	seen[num]++
	if path == "" {
		return name
	}
	return path + "." + name
}

// salvageScalars decodes the singular scalar fields of b of at most
// maxValue bytes that decode on their own into m (a DecideStream message's
// id, so that its error answer carries it).
func salvageScalars(b []byte, m proto.Message, maxValue int) {
	md := m.ProtoReflect().Descriptor()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		vlen := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vlen < 0 {
			return
		}
		whole := b[:n+vlen]
		b = b[n+vlen:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || fd.IsList() || fd.IsMap() || fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind ||
			vlen > maxValue {
			continue
		}
		_ = proto.UnmarshalOptions{Merge: true}.Unmarshal(whole, m)
	}
}

func cleanProtoErr(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "proto: ")
	s = strings.TrimPrefix(s, "proto:\u00a0") // protobuf-go's non-breaking space
	return s
}
