package flowcodec

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine/policygen"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestFlowDecoderKnowsTheSchema fails when a flow message gains, loses or
// retypes a field: the decoder would decline every message carrying it (slow,
// not wrong), and flowFields must follow the protos.
func TestFlowDecoderKnowsTheSchema(t *testing.T) {
	for name, fields := range flowFields {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		md := d.(protoreflect.MessageDescriptor)
		if md.Fields().Len() != len(fields) {
			t.Errorf("%s has %d fields, the decoder knows %d", name, md.Fields().Len(), len(fields))
		}
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			want := protowire.VarintType
			switch f.Kind() {
			case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
				want = protowire.BytesType
			case protoreflect.BoolKind, protoreflect.Uint32Kind, protoreflect.Int64Kind, protoreflect.Uint64Kind:
			case protoreflect.Fixed64Kind:
				want = protowire.Fixed64Type
			default:
				t.Errorf("%s.%s: kind %v is not decoded", name, f.Name(), f.Kind())
			}
			if f.IsList() && f.Kind() != protoreflect.StringKind && f.Kind() != protoreflect.MessageKind {
				want = protowire.BytesType // a repeated scalar: taken packed
			}
			if got, ok := fields[f.Number()]; !ok || got != want {
				t.Errorf("%s.%s (%d): decoder has wire type %v (known %v), want %v", name, f.Name(), f.Number(), got, ok, want)
			}
		}
	}
}

// flowMessages returns encoded flow requests: generated flows alone, in
// batches and in stream messages, with every scalar set, plus the corners of
// the wire format that protobuf-go accepts (fields out of order, a message
// field given twice, a repeated map key, entries without key or value,
// empty workloads).
func flowMessages(t testing.TB) map[string][]byte {
	t.Helper()
	set := policygen.Generate(policygen.Config{Seed: 3, Policies: 300, Scopes: 5})
	out := map[string][]byte{}
	var batch verdictv1.DecideBatchRequest
	for i, f := range set.Flows(4, 40) {
		r := &verdictv1.DecideRequest{Mesh: f.Mesh, Type: f.Type, Protocol: f.Protocol.String(), Port: f.Port,
			Source: &verdictv1.Endpoint{Tags: f.Source}, Destination: &verdictv1.Endpoint{Tags: f.Destination},
			Explain: i%3 == 0, MinRevision: int64(i * 7)}
		out[fmt.Sprintf("decide %d", i)] = wire(t, r)
		out[fmt.Sprintf("stream %d", i)] = wire(t, &verdictv1.DecideStreamRequest{Id: fmt.Sprint("id-", i), Request: r})
		batch.Requests = append(batch.Requests, r)
	}
	batch.MinRevision = 99
	out["batch"] = wire(t, &batch)
	out["past batch"] = wire(t, &verdictv1.DecideBatchRequest{Requests: batch.Requests[:2], AtRevision: 7, AtTime: timestamppb.New(time.Unix(1e9, 5))})
	out["past decide"] = wire(t, &verdictv1.DecideRequest{Mesh: "m", AtRevision: 12, AtTime: &timestamppb.Timestamp{Seconds: -3, Nanos: 2}})
	out["batch, one empty flow"] = wire(t, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{{}}})
	out["empty decide"] = nil
	out["endpoint forms"] = wire(t, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Address: "10.0.0.7", Principal: "spiffe://default/web"},
		Destination: &verdictv1.Endpoint{Workload: "api-1", Identity: 1<<63 | 42}})
	out["empty workloads"] = wire(t, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{}, Destination: &verdictv1.Endpoint{}})
	out["port over 32 bits"] = protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 1<<40|443)
	out["negative revision"] = protowire.AppendVarint(protowire.AppendTag(nil, 8, protowire.VarintType), protowire.EncodeZigZag(0)-1)

	// A source given twice merges; its repeated key keeps the last value.
	src1 := wire(t, &verdictv1.Endpoint{Tags: map[string]string{"app": "web", "env": "prod"}})
	src2 := wire(t, &verdictv1.Endpoint{Tags: map[string]string{"app": "api", "zone": "a"}})
	var twice []byte
	twice = protowire.AppendTag(twice, 5, protowire.BytesType) // protocol before the mesh: out of order
	twice = protowire.AppendString(twice, "TCP")
	for _, w := range [][]byte{src1, src2} {
		twice = protowire.AppendTag(twice, 3, protowire.BytesType)
		twice = protowire.AppendBytes(twice, w)
	}
	twice = protowire.AppendTag(twice, 1, protowire.BytesType)
	twice = protowire.AppendString(twice, "payments")
	out["source twice, fields out of order"] = twice

	// Map entries without a value, without a key, value before key.
	var entries []byte
	for _, e := range [][]byte{
		protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "only-key"),
		protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "only-value"),
		protowire.AppendString(protowire.AppendTag(
			protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "v"), 1, protowire.BytesType), "k"),
	} {
		entries = protowire.AppendTag(entries, 1, protowire.BytesType)
		entries = protowire.AppendBytes(entries, e)
	}
	out["odd map entries"] = protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), entries)

	// A stream message whose request comes in two parts (merged).
	part1 := wire(t, &verdictv1.DecideRequest{Mesh: "m", Source: &verdictv1.Endpoint{Tags: map[string]string{"a": "1"}}})
	part2 := wire(t, &verdictv1.DecideRequest{Port: 80, Source: &verdictv1.Endpoint{Tags: map[string]string{"b": "2"}}})
	var split []byte
	for _, p := range [][]byte{part1, part2} {
		split = protowire.AppendTag(split, 2, protowire.BytesType)
		split = protowire.AppendBytes(split, p)
	}
	out["stream request in two parts"] = split
	compactMessages(t, out)
	return out
}

// compactMessages adds encoded compact requests to out: a batch alone and
// in a stream message, every field set, and the corners protobuf-go
// accepts (a batch in two parts, an array in two runs, the unpacked form,
// a port word over 32 bits).
func compactMessages(t testing.TB, out map[string][]byte) {
	t.Helper()
	c := &verdictv1.DecideCompactRequest{Mesh: "payments", Type: "TrafficPermission", MinRevision: 41}
	for i := range 100 {
		c.SourceIds = append(c.SourceIds, uint64(i)*0x9e3779b97f4a7c15)
		c.DestinationIds = append(c.DestinationIds, uint64(i)<<40|7)
		c.PortProtocols = append(c.PortProtocols, uint32(i%4)<<16|uint32(i*661%65536))
	}
	out["compact"] = wire(t, c)
	out["compact stream"] = wire(t, &verdictv1.DecideCompactStreamRequest{Id: 1<<60 | 9, Batch: c})
	out["compact stream, empty batch"] = wire(t, &verdictv1.DecideCompactStreamRequest{Id: 3, Batch: &verdictv1.DecideCompactRequest{}})
	out["compact, ports only"] = wire(t, &verdictv1.DecideCompactRequest{PortProtocols: []uint32{0, 1 << 31, 443}})

	var twice []byte
	for _, p := range []*verdictv1.DecideCompactRequest{
		{Mesh: "m", SourceIds: []uint64{1, 2}, PortProtocols: []uint32{80}},
		{Type: "t", SourceIds: []uint64{3}, DestinationIds: []uint64{4, 5, 6}, PortProtocols: []uint32{1<<16 | 443}},
	} {
		twice = protowire.AppendTag(twice, 2, protowire.BytesType)
		twice = protowire.AppendBytes(twice, wire(t, p))
	}
	out["compact stream, batch in two parts"] = twice

	// An array in two runs, and ids in the unpacked form.
	runs := wire(t, &verdictv1.DecideCompactRequest{SourceIds: []uint64{1, 2}, DestinationIds: []uint64{9}})
	runs = append(runs, wire(t, &verdictv1.DecideCompactRequest{SourceIds: []uint64{3}})...)
	out["compact, an array in two runs"] = runs
	var wide []byte
	wide = protowire.AppendTag(wide, 5, protowire.BytesType)
	wide = protowire.AppendBytes(wide, protowire.AppendVarint(protowire.AppendVarint(nil, 1<<40|443), 1<<63))
	out["compact, port words over 32 bits"] = wide
}

func wire(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// flowTargets are fresh messages of the three flow request types.
func flowTargets() []func() proto.Message {
	return []func() proto.Message{
		func() proto.Message { return &verdictv1.DecideRequest{} },
		func() proto.Message { return &verdictv1.DecideBatchRequest{} },
		func() proto.Message { return &verdictv1.DecideStreamRequest{} },
		func() proto.Message { return &verdictv1.DecideCompactRequest{} },
		func() proto.Message { return &verdictv1.DecideCompactStreamRequest{} },
	}
}

// checkLikeProto decodes b as each flow request type through the flow decoder
// and compares it with protobuf-go. It returns how many types the flow
// decoder took. (The server's codec test runs the same through the codec.)
func checkLikeProto(t *testing.T, name string, b []byte) (taken int) {
	t.Helper()
	for _, mk := range flowTargets() {
		want := mk()
		wantErr := proto.Unmarshal(b, want)
		fast := mk()
		if Decode(mem.BufferSlice{mem.SliceBuffer(b)}, fast) {
			taken++
			if wantErr != nil {
				t.Errorf("%s as %T: the flow decoder took what protobuf-go refuses (%v): %v", name, want, wantErr, fast)
			} else if !proto.Equal(fast, want) {
				t.Errorf("%s as %T: flow decoder\n%v\nprotobuf-go\n%v", name, want, fast, want)
			}
		}
	}
	return taken
}

func TestFlowDecoderMatchesProto(t *testing.T) {
	for name, b := range flowMessages(t) {
		if checkLikeProto(t, name, b) == 0 {
			t.Errorf("%s: the flow decoder took it as no type at all", name)
		}
	}
	// Bytes split over several buffers, as gRPC may hand them over.
	b := flowMessages(t)["batch"]
	var parts mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 37)
		parts = append(parts, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	got, want := &verdictv1.DecideBatchRequest{}, &verdictv1.DecideBatchRequest{}
	if !Decode(parts, got) || proto.Unmarshal(flowMessages(t)["batch"], want) != nil || !proto.Equal(got, want) {
		t.Errorf("batch in pieces: %v", got)
	}
}

// TestFlowDecoderDeclines: what it does not understand goes to protobuf-go.
func TestFlowDecoderDeclines(t *testing.T) {
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)
	badUTF8 := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff, 0xfe})
	wrongType := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 1)
	truncated := protowire.AppendTag(nil, 3, protowire.BytesType)
	truncated = protowire.AppendVarint(truncated, 50)
	for name, b := range map[string][]byte{"unknown field": unknown, "invalid UTF-8": badUTF8,
		"wrong wire type": wrongType, "truncated": truncated} {
		if Decode(mem.BufferSlice{mem.SliceBuffer(b)}, &verdictv1.DecideRequest{}) {
			t.Errorf("%s: taken", name)
		}
		checkLikeProto(t, name, b)
	}
	// The compact arrays: the unpacked form, ids not whole, a varint cut short.
	for name, b := range map[string][]byte{
		"unpacked id":   protowire.AppendFixed64(protowire.AppendTag(nil, 3, protowire.Fixed64Type), 77),
		"ids not whole": protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), make([]byte, 12)),
		"varint cut":    protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), []byte{0x80}),
		"invalid UTF-8": protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte{0xc3}),
		"unknown field": unknown,
	} {
		if Decode(mem.BufferSlice{mem.SliceBuffer(b)}, &verdictv1.DecideCompactRequest{}) {
			t.Errorf("compact, %s: taken", name)
		}
		checkLikeProto(t, "compact, "+name, b)
	}
}

func FuzzFlowDecoderMatchesProto(f *testing.F) {
	for _, b := range flowMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkLikeProto(t, "input", b)
	})
}

// TestInternShares: the same bytes give the same string, without allocating.
func TestInternShares(t *testing.T) {
	a, _ := internString([]byte("kuma.io/service"))
	b, _ := internString([]byte("kuma.io/service"))
	if a != b || unsafeData(a) != unsafeData(b) {
		t.Errorf("not shared: %q %q", a, b)
	}
	key := []byte("kuma.io/service")
	if n := testing.AllocsPerRun(100, func() { internString(key) }); n != 0 {
		t.Errorf("%v allocations for an interned string", n)
	}
	long := make([]byte, internMaxLen+1)
	if s, ok := internString(long); !ok || len(s) != len(long) {
		t.Errorf("long string: %d bytes, %v", len(s), ok)
	}
}

func BenchmarkRequestDecode(b *testing.B) {
	enc := flowMessages(b)["batch"]
	flows := len(mustBatch(b, enc).Requests)
	for _, c := range []struct {
		name string
		dec  func(mem.BufferSlice, any) error
	}{
		{"flow-decoder", func(d mem.BufferSlice, v any) error {
			if !Decode(d, v) {
				return fmt.Errorf("declined")
			}
			return nil
		}},
		{"protobuf-go", func(d mem.BufferSlice, v any) error { return proto.Unmarshal(d.Materialize(), v.(proto.Message)) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.dec(mem.BufferSlice{mem.SliceBuffer(enc)}, &verdictv1.DecideBatchRequest{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*flows), "ns/flow")
		})
	}
}

func mustBatch(tb testing.TB, b []byte) *verdictv1.DecideBatchRequest {
	m := &verdictv1.DecideBatchRequest{}
	if err := proto.Unmarshal(b, m); err != nil {
		tb.Fatal(err)
	}
	return m
}

func unsafeData(s string) *byte { return unsafe.StringData(s) }

// TestDecodeTag: a tag entry decodes the same the first time and after, its
// strings from the string table (without allocating); an entry the decoder
// declines is declined every time.
func TestDecodeTag(t *testing.T) {
	entry := func(fields ...string) []byte { // number, value, number, value...
		var b []byte
		for i := 0; i < len(fields); i += 2 {
			b = protowire.AppendString(protowire.AppendTag(b, protowire.Number(fields[i][0]-'0'), protowire.BytesType), fields[i+1])
		}
		return b
	}
	long := string(make([]byte, internMaxLen))
	for name, c := range map[string]struct {
		b          []byte
		key, value string
		ok         bool
	}{
		"tag":                  {entry("1", "app", "2", "web"), "app", "web", true},
		"value first":          {entry("2", "web", "1", "app"), "app", "web", true},
		"key twice":            {entry("1", "a", "1", "app", "2", "web"), "app", "web", true},
		"only a key":           {entry("1", "app"), "app", "", true},
		"empty":                {nil, "", "", true},
		"long":                 {entry("1", long, "2", long+"x"), long, long + "x", true},
		"invalid UTF-8":        {entry("1", "app", "2", "\xff"), "", "", false},
		"unknown field":        {entry("3", "app"), "", "", false},
		"truncated":            {entry("1", "app")[:3], "", "", false},
		"a varint, not a tag":  {protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7), "", "", false},
		"the same bytes again": {entry("1", "app", "2", "web"), "app", "web", true},
	} {
		for round := range 2 {
			key, value, ok := decodeTag(c.b)
			if ok != c.ok || ok && (key != c.key || value != c.value) {
				t.Errorf("%s, round %d: %q %q %v, want %q %q %v", name, round, key, value, ok, c.key, c.value, c.ok)
			}
		}
	}
	b := entry("1", "kuma.io/service", "2", "web")
	decodeTag(b)
	if n := testing.AllocsPerRun(100, func() { decodeTag(b) }); n != 0 {
		t.Errorf("%v allocations for an interned tag", n)
	}
}
