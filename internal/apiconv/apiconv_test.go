package apiconv

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// conformanceResources decodes the resources of every suite of
// testdata/conformance.
func conformanceResources(t testing.TB) []resource.Resource {
	t.Helper()
	files, err := filepath.Glob("../../testdata/conformance/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no conformance suites: %v", err)
	}
	var out []resource.Resource
	for _, f := range files {
		data := readFile(t, f)
		docs, err := resource.ParseYAML(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		top, _ := docs[0].Value.(map[string]any)
		list, _ := top["resources"].([]any)
		for i, v := range list {
			r, err := resource.DecodeValue(v)
			if err != nil {
				t.Fatalf("%s: resources[%d]: %v", f, i, err)
			}
			out = append(out, r)
		}
	}
	return out
}

func TestResourceRoundTrip(t *testing.T) {
	t.Parallel()
	resources := conformanceResources(t)
	// Times as the server stamps them, with every precision protojson writes.
	stamp := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)
	for i, r := range resources {
		if i%3 == 0 {
			resources[i] = r.WithMeta(resource.Meta{CreationTime: stamp, ModificationTime: stamp.Add(time.Duration(i) * time.Millisecond)})
		}
	}
	for i, r := range resources {
		want, err := resource.EncodeJSON(r)
		if err != nil {
			t.Fatal(err)
		}
		pr, err := ResourceToProto(r)
		if err != nil {
			t.Fatalf("%s: to proto: %v\n%s", r.Key(), err, want)
		}
		back, err := ResourceFromProto("resources[0]", pr)
		if err != nil {
			pj, _ := protojson.Marshal(pr)
			t.Fatalf("%s: from proto: %v\n%s", r.Key(), err, pj)
		}
		got, err := resource.EncodeJSON(back)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("resource %d %s: engine → proto → engine changed it:\n got %s\nwant %s", i, r.Key(), got, want)
		}
		if back.Metadata().CreationTime != r.Metadata().CreationTime {
			t.Errorf("%s: creation time %v, want %v", r.Key(), back.Metadata().CreationTime, r.Metadata().CreationTime)
		}
	}
	if len(resources) < 50 {
		t.Fatalf("only %d resources: the suites did not load", len(resources))
	}
}

// jsonToProto is the JSON path the direct mapping replaced: the engine's
// canonical document read as the API's message by protobuf JSON.
func jsonToProto(t *testing.T, r resource.Resource) *verdictv1.Resource {
	t.Helper()
	b, err := resource.EncodeJSON(r)
	if err != nil {
		t.Fatal(err)
	}
	out := &verdictv1.Resource{}
	switch r.(type) {
	case *resource.Mesh:
		m := &verdictv1.Mesh{}
		err = protojson.Unmarshal(b, m)
		out.Resource = &verdictv1.Resource_Mesh{Mesh: m}
	case *resource.Scope:
		m := &verdictv1.Scope{}
		err = protojson.Unmarshal(b, m)
		out.Resource = &verdictv1.Resource_Scope{Scope: m}
	case *resource.Policy:
		m := &verdictv1.Policy{}
		err = protojson.Unmarshal(b, m)
		out.Resource = &verdictv1.Resource_Policy{Policy: m}
	case *resource.Workload:
		m := &verdictv1.Workload{}
		err = protojson.Unmarshal(b, m)
		out.Resource = &verdictv1.Resource_Workload{Workload: m}
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", r.Key(), err, b)
	}
	return out
}

// TestDirectMappingEqualsJSON: ResourceToProto maps field by field; its
// message equals the one protobuf JSON reads from the canonical document, for
// every conformance resource, with and without times, and for values the
// suites may not hold (every conf value type, empty blocks, unset flags).
func TestDirectMappingEqualsJSON(t *testing.T) {
	t.Parallel()
	resources := conformanceResources(t)
	stamp := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)
	extra := decodeAll(t, `
kind: Mesh
name: m
defaultAction: ALLOW
unenforcedAction: DENY
tieBreak: NewestModified
itemOrder: LastWins
profile: KongMesh
invalidResources: Skip
types: {TrafficPermission: {combine: DenyOverrides, defaultAction: ALLOW, select: PerDestination}, TrafficLog: {}, MeshTimeout: {tieBreak: Name}}
---
kind: Scope
mesh: m
name: s
priority: -3
selectors: [{match: {env: prod}}]
catchAll: DENY
catchAllTypes: [TrafficPermission, TrafficLog]
enforced: false
---
kind: Policy
mesh: m
name: conf-values
rank: Absolute
priority: 7
sources: [{match: {app: a}, expressions: [{key: env, operator: In, values: [x, y]}, {key: k, operator: Exists}]}]
destinations: [{}]
ports: [{protocol: TCP, ports: "80,8000-8100"}, {}]
action: DENY
conf: {s: x, n: 1.5, big: 12345678901234567890, neg: -0, t: true, f: false, z: null, l: [1, "a", [], {}], o: {p: {q: 1e-7}}, e: {}}
unset: [a.b, c]
---
kind: Policy
mesh: m
name: target
type: CustomTimeout
targetRef: {kind: MeshSubset, tags: {app: a}}
from: [{targetRef: {kind: Mesh}, conf: {}}, {targetRef: {kind: Service, name: web}, action: DENY, conf: {a: 1}}]
denyFirst: true
---
kind: Policy
mesh: m
name: blocks
type: MeshTimeout
targetRef: {kind: Mesh}
defaults: {rules: {}}
overrides: {strategy: merge, when: "true", rules: {x: {y: 2}}}
`)
	resources = append(resources, extra...)
	for i, r := range resources {
		for _, meta := range []resource.Meta{r.Metadata(), {CreationTime: stamp, ModificationTime: stamp.Add(time.Duration(i) * time.Millisecond)}} {
			r := r.WithMeta(meta)
			got, err := ResourceToProto(r)
			if err != nil {
				t.Fatalf("%s: %v", r.Key(), err)
			}
			if want := jsonToProto(t, r); !proto.Equal(got, want) {
				t.Errorf("resource %d %s: the direct mapping differs from the JSON path:\n got %v\nwant %v", i, r.Key(), got, want)
			}
		}
	}
}

func decodeAll(t *testing.T, yaml string) []resource.Resource {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestResourceFromProtoErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    *verdictv1.Resource
		field string
	}{
		{"no member", &verdictv1.Resource{}, "resources[3]"},
		{"bad action", &verdictv1.Resource{Resource: &verdictv1.Resource_Policy{Policy: &verdictv1.Policy{
			Name: "p", Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}}, Action: "MAYBE"}}},
			"resources[3].policy.action"},
		{"kind of another member", &verdictv1.Resource{Resource: &verdictv1.Resource_Scope{Scope: &verdictv1.Scope{
			Kind: "Mesh", Name: "m"}}}, "resources[3].scope.kind"},
		{"bad selector key", &verdictv1.Resource{Resource: &verdictv1.Resource_Policy{Policy: &verdictv1.Policy{
			Name: "p", Sources: []*verdictv1.Selector{{Match: map[string]string{"": "x"}}}, Destinations: []*verdictv1.Selector{{}}}}},
			"resources[3].policy.sources[0].match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ResourceFromProto("resources[3]", tc.in)
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v (%T), want a validation error", err, err)
			}
			found := false
			for _, fe := range ve.Errors {
				found = found || fe.Field == tc.field
			}
			if !found {
				t.Errorf("fields %v, want %q among them", ve.Errors, tc.field)
			}
		})
	}
}

func TestConfCacheSharesConversions(t *testing.T) {
	t.Parallel()
	c := NewConfCache(2)
	a := resource.Object{"backend": "splunk", "n": jsonNum("3")}
	b := resource.Object{"x": []any{jsonNum("1.5"), true, nil}}
	pa := c.Get(a)
	if pa != c.Get(a) {
		t.Error("a second get of one conf converted it again")
	}
	if got := pa.Fields["n"].GetNumberValue(); got != 3 {
		t.Errorf("n = %v, want 3", got)
	}
	if c.Get(b).Fields["x"].GetListValue().Values[0].GetNumberValue() != 1.5 {
		t.Error("list value not converted")
	}
	c.Get(resource.Object{"y": "z"}) // past the bound: the cache starts over
	if c.Get(a).Fields["backend"].GetStringValue() != "splunk" {
		t.Error("conf changed after a reset")
	}
	if c.Get(nil) != nil {
		t.Error("no conf must stay nil")
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
func jsonNum(s string) json.Number { return json.Number(s) }

// BenchmarkResourceToProto: the direct mapping against the JSON path it
// replaced, over the conformance resources.
func BenchmarkResourceToProto(b *testing.B) {
	resources := conformanceResources(b)
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := ResourceToProto(resources[i%len(resources)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := resources[i%len(resources)]
			doc, err := resource.EncodeJSON(r)
			if err != nil {
				b.Fatal(err)
			}
			var m proto.Message
			switch r.(type) {
			case *resource.Mesh:
				m = &verdictv1.Mesh{}
			case *resource.Scope:
				m = &verdictv1.Scope{}
			default:
				m = &verdictv1.Policy{}
			}
			if err := protojson.Unmarshal(doc, m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
