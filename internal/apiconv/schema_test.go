package apiconv

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The resource schema is written twice: resource.proto (the API, etcd's
// values) and engine/resource's decoder. These tests hold them to each other
// field by field, so a field added to one and not the other fails here.

// probe is a field no schema has: the decoder must call it unknown wherever it
// is put, which proves the decoder read the object the field under test sits in.
const probe = "zzSchemaProbe"

// TestDecoderKnowsEveryProtoField: every field of resource.proto's Mesh,
// Scope, Policy and Workload, at every depth, is one the decoder reads — set
// alone in its object beside the probe, the probe is unknown and the field is
// not.
func TestDecoderKnowsEveryProtoField(t *testing.T) {
	t.Parallel()
	kinds := map[string]proto.Message{"Mesh": &verdictv1.Mesh{}, "Scope": &verdictv1.Scope{}, "Policy": &verdictv1.Policy{}, "Workload": &verdictv1.Workload{}}
	fields := 0
	for kind, top := range kinds {
		walkFields(top.ProtoReflect().Descriptor(), nil, map[protoreflect.FullName]bool{}, func(path []protoreflect.FieldDescriptor) {
			fields++
			name := kind + "." + jsonPath(path)
			doc := documentWith(t, top, kind, path)
			_, err := resource.DecodeJSON(doc)
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				t.Errorf("%s: the probe beside it was not refused (%v): the decoder did not read its object", name, err)
				return
			}
			last := path[len(path)-1].JSONName()
			sawProbe := false
			for _, fe := range ve.Errors {
				if !strings.HasPrefix(fe.Reason, "unknown field") {
					continue
				}
				switch {
				case strings.HasSuffix(fe.Field, probe):
					sawProbe = true
				case strings.HasSuffix(fe.Field, last) || strings.Contains(fe.Field, last+"."):
					t.Errorf("%s: the decoder does not know it: %s", name, fe)
				}
			}
			if !sawProbe {
				t.Errorf("%s: the probe beside it was not called unknown (%v): the decoder did not read its object", name, err)
			}
		})
	}
	if fields < 40 {
		t.Fatalf("walked %d fields: the walk is broken", fields)
	}
}

// TestCanonicalDocumentsAreProto: every canonical document the encoder writes
// for the repository's examples and suites reads as resource.proto's message
// with no field left over.
func TestCanonicalDocumentsAreProto(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../testdata/conformance/*.yaml")
	more, _ := filepath.Glob("../../testdata/*.yaml")
	files = append(append(files, more...), "../../examples/policies.yaml", "../../examples/kuma-traffic-permission.yaml")
	kinds := map[resource.Kind]func() proto.Message{
		resource.KindMesh:     func() proto.Message { return &verdictv1.Mesh{} },
		resource.KindScope:    func() proto.Message { return &verdictv1.Scope{} },
		resource.KindPolicy:   func() proto.Message { return &verdictv1.Policy{} },
		resource.KindWorkload: func() proto.Message { return &verdictv1.Workload{} },
	}
	seen := map[resource.Kind]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range suiteOrDocuments(t, data) {
			b, err := resource.EncodeJSON(r)
			if err != nil {
				t.Fatalf("%s: %s: %v", f, r.Key(), err)
			}
			m := kinds[r.Key().Kind]()
			if err := protojson.Unmarshal(b, m); err != nil {
				t.Errorf("%s: %s: the canonical document is not a %T: %v\n%s", f, r.Key(), m, err, b)
			}
			seen[r.Key().Kind]++
		}
	}
	for k := range kinds {
		if seen[k] == 0 {
			t.Errorf("no %s among the documents: the test reads nothing of that kind", k)
		}
	}
}

// suiteOrDocuments returns a suite's resources, or a file's documents.
func suiteOrDocuments(t *testing.T, data []byte) []resource.Resource {
	t.Helper()
	docs, err := resource.ParseYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	var out []resource.Resource
	for _, d := range docs {
		m, ok := d.Value.(resource.Object)
		if !ok {
			continue
		}
		list, isSuite := m["resources"].([]any)
		if !isSuite {
			list = []any{m}
		}
		for _, v := range list {
			if r, err := resource.DecodeValue(v); err == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// walkFields calls visit with the path of every field under md, depth first,
// each message type entered once per path.
func walkFields(md protoreflect.MessageDescriptor, prefix []protoreflect.FieldDescriptor, onPath map[protoreflect.FullName]bool,
	visit func([]protoreflect.FieldDescriptor)) {
	onPath[md.FullName()] = true
	defer delete(onPath, md.FullName())
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		path := append(append([]protoreflect.FieldDescriptor(nil), prefix...), fd)
		visit(path)
		sub := fd.Message()
		if fd.IsMap() {
			sub = fd.MapValue().Message()
		}
		if sub != nil && sub.FullName().Parent() == md.FullName().Parent() && !onPath[sub.FullName()] {
			walkFields(sub, path, onPath, visit)
		}
	}
}

func jsonPath(path []protoreflect.FieldDescriptor) string {
	parts := make([]string, len(path))
	for i, fd := range path {
		parts[i] = fd.JSONName()
	}
	return strings.Join(parts, ".")
}

// documentWith returns the JSON of top with only path set (one element in
// each list or map on the way), kind set, and the probe beside the last field.
func documentWith(t *testing.T, top proto.Message, kind string, path []protoreflect.FieldDescriptor) []byte {
	t.Helper()
	m := top.ProtoReflect().New()
	if f := m.Descriptor().Fields().ByName("kind"); f != nil {
		m.Set(f, protoreflect.ValueOfString(kind))
	}
	cur := m
	for i, fd := range path {
		if i == len(path)-1 {
			if fd.Name() != "kind" { // the kind is set already: the one value it may have
				setSample(cur, fd)
			}
			break
		}
		switch {
		case fd.IsList():
			cur = cur.Mutable(fd).List().AppendMutable().Message()
		case fd.IsMap():
			cur = cur.Mutable(fd).Map().Mutable(protoreflect.ValueOfString("TrafficPermission").MapKey()).Message()
		default:
			cur = cur.Mutable(fd).Message()
		}
	}
	b, err := protojson.Marshal(m.Interface())
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	obj := doc
	for _, fd := range path[:len(path)-1] {
		switch v := obj[fd.JSONName()].(type) {
		case []any:
			obj = v[0].(map[string]any)
		case map[string]any:
			if fd.IsMap() {
				obj = v["TrafficPermission"].(map[string]any)
			} else {
				obj = v
			}
		}
	}
	obj[probe] = 1
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// setSample sets fd in m to a value protojson writes (not the zero value).
func setSample(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	one := func() protoreflect.Value {
		switch fd.Kind() {
		case protoreflect.StringKind:
			return protoreflect.ValueOfString("x")
		case protoreflect.BoolKind:
			return protoreflect.ValueOfBool(true)
		case protoreflect.Int32Kind:
			return protoreflect.ValueOfInt32(1)
		case protoreflect.Int64Kind:
			return protoreflect.ValueOfInt64(1)
		case protoreflect.Uint32Kind:
			return protoreflect.ValueOfUint32(1)
		case protoreflect.Uint64Kind:
			return protoreflect.ValueOfUint64(1)
		case protoreflect.EnumKind:
			return protoreflect.ValueOfEnum(1)
		}
		return protoreflect.Value{}
	}
	message := func(md protoreflect.MessageDescriptor) proto.Message {
		switch md.FullName() {
		case "google.protobuf.Struct":
			s, _ := structpb.NewStruct(map[string]any{"a": 1})
			return s
		case "google.protobuf.Value":
			return structpb.NewStringValue("x")
		case "google.protobuf.Timestamp":
			return timestamppb.New(time.Unix(1, 0))
		}
		return nil
	}
	switch {
	case fd.IsList():
		l := m.Mutable(fd).List()
		if fd.Message() != nil {
			if w := message(fd.Message()); w != nil {
				l.Append(protoreflect.ValueOfMessage(w.ProtoReflect()))
			} else {
				l.AppendMutable()
			}
			return
		}
		l.Append(one())
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		k := protoreflect.ValueOfString("k").MapKey()
		if fd.MapValue().Message() != nil {
			mp.Mutable(k)
			return
		}
		mp.Set(k, protoreflect.ValueOfString("v"))
	case fd.Message() != nil:
		if w := message(fd.Message()); w != nil {
			m.Set(fd, protoreflect.ValueOfMessage(w.ProtoReflect()))
			return
		}
		m.Mutable(fd)
	default:
		m.Set(fd, one())
	}
}
