package decisionlog

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestJSONKnowsTheSchema fails when the record's messages gain (or lose) a
// field the JSON encoder does not write: add it to appendRecord and
// jsonFields.
func TestJSONKnowsTheSchema(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		name := string(md.FullName())
		if seen[name] || strings.HasPrefix(name, "google.protobuf.") {
			return
		}
		seen[name] = true
		want, ok := jsonFields[name]
		if !ok {
			t.Errorf("%s: a message the encoder does not know", name)
			return
		}
		var got []string
		fields := md.Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			got = append(got, string(f.Name()))
			if m := f.Message(); m != nil && !f.IsMap() {
				walk(m)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: fields %v, the encoder writes %v", name, got, want)
		}
	}
	walk((&verdictv1.DecisionRecord{}).ProtoReflect().Descriptor())
	for name := range jsonFields {
		if !seen[name] {
			t.Errorf("the encoder knows %s, which no record holds", name)
		}
	}
}

// checkJSON holds appendRecord to protojson on r: the same members with the
// same JSON values (names, strings for 64-bit integers, the time's form,
// zero values left out), and a line protojson reads back as r.
func checkJSON(t *testing.T, r *Record) {
	t.Helper()
	line := appendRecord(nil, r)
	want, err := protojson.Marshal(r)
	if err != nil {
		t.Fatalf("protojson: %v", err)
	}
	var g, w any
	if err := json.Unmarshal(line, &g); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, line)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("encoded\n%s\nprotojson\n%s", line, want)
	}
	back := &Record{}
	if err := protojson.Unmarshal(line, back); err != nil || !proto.Equal(back, r) {
		t.Fatalf("read back %v (%v), want %v", back, err, r)
	}
}

func TestJSONMatchesProtojson(t *testing.T) {
	t.Parallel()
	full := record(7, "DENY")
	full.Audit = &verdictv1.RecordAudit{Action: "ALLOW", Policy: "a", Scope: "s", Rule: "r", Side: "inbound"}
	full.Source.Tags = map[string]string{"z": "1", "a": "2", "kuma.io/service": "web", "": "empty key", "q\"\\": "\n\t\x01\x7f é €"}
	full.Source.Workload, full.Source.Principal, full.Source.Identity = "w", "spiffe://x/y", ^uint64(0)
	full.Caller.Identity = "dns.example"
	full.LatencyNs, full.Repeats, full.Truncated, full.Revision = 1830, 12, true, -1
	for _, tc := range []struct {
		name string
		r    *Record
	}{
		{"a full record", full},
		{"the test record", record(1, "ALLOW")},
		{"an empty record", &Record{}},
		{"empty parts", &Record{Source: &verdictv1.RecordEndpoint{}, Outbound: &verdictv1.RecordSide{}, Caller: &verdictv1.RecordCaller{},
			Audit: &verdictv1.RecordAudit{}, Time: &timestamppb.Timestamp{}}},
		{"a summary", &Record{Time: timestamppb.New(full.Time.AsTime()), Dropped: []*verdictv1.RecordsDropped{
			{Mesh: "default", Reason: ReasonQueueFull, Count: 1 << 40}, {Mesh: OtherMesh, Reason: ReasonQueueFull, Count: 1}}}},
		{"milliseconds", &Record{Time: &timestamppb.Timestamp{Seconds: 1_700_000_000, Nanos: 123_000_000}}},
		{"microseconds", &Record{Time: &timestamppb.Timestamp{Seconds: 1_700_000_000, Nanos: 123_456_000}}},
		{"nanoseconds", &Record{Time: &timestamppb.Timestamp{Seconds: 1_700_000_000, Nanos: 1}}},
		{"before 1970", &Record{Time: &timestamppb.Timestamp{Seconds: -1, Nanos: 5}}},
		{"many tags", &Record{Destination: &verdictv1.RecordEndpoint{Tags: bigTags(64, 3, "v")}}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkJSON(t, tc.r) })
	}
	rng := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		const alphabet = "ab\"\\\n\x00\x1f é€😀/:"
		var b strings.Builder
		for range rng.IntN(8) {
			r := []rune(alphabet)
			b.WriteRune(r[rng.IntN(len(r))])
		}
		return b.String()
	}
	for i := range 500 {
		r := &Record{Time: &timestamppb.Timestamp{Seconds: rng.Int64N(1 << 34), Nanos: rng.Int32N(1e9)}, Rpc: str(),
			Revision: rng.Int64(), Mesh: str(), Port: rng.Uint32(), Action: str(), Repeats: rng.Int64N(3), Truncated: i%2 == 0,
			Source:  &verdictv1.RecordEndpoint{Tags: map[string]string{str(): str(), str(): str()}, Identity: rng.Uint64()},
			Inbound: &verdictv1.RecordSide{Rule: str(), Reason: str()}, Caller: &verdictv1.RecordCaller{Address: str()}}
		checkJSON(t, r)
	}
}

// A string that is not UTF-8 — protojson refuses the record — is written
// with U+FFFD in place of its bad bytes: the record is not lost.
func TestJSONReplacesBadUTF8(t *testing.T) {
	t.Parallel()
	line := appendRecord(nil, &Record{Mesh: "a\xffb", Source: &verdictv1.RecordEndpoint{Tags: map[string]string{"k\xc3": "v"}}})
	var r Record
	if err := protojson.Unmarshal(line, &r); err != nil || r.Mesh != "a\ufffdb" || r.Source.Tags["k\ufffd"] != "v" || !utf8.Valid(line) {
		t.Errorf("%s: %v", line, err)
	}
}

func FuzzJSONMatchesProtojson(f *testing.F) {
	f.Add("default", "k", "v\n\"", int64(42), int32(123_000_000), uint64(1))
	f.Add("", "", "", int64(0), int32(0), uint64(0))
	f.Fuzz(func(t *testing.T, mesh, k, v string, rev int64, nanos int32, id uint64) {
		if !utf8.ValidString(mesh) || !utf8.ValidString(k) || !utf8.ValidString(v) || nanos < 0 || nanos >= 1e9 {
			return // protojson refuses these
		}
		checkJSON(t, &Record{Time: &timestamppb.Timestamp{Seconds: 1_700_000_000, Nanos: nanos}, Mesh: mesh, Revision: rev,
			Source: &verdictv1.RecordEndpoint{Tags: map[string]string{k: v}, Identity: id}})
	})
}
