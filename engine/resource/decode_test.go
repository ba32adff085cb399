package resource_test

import (
	"github.com/verdictpdp/verdict/engine/resource"

	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		doc   string
		field string // the field path the error must name
		why   string // a part of the reason
	}{
		{"no kind, no type", `{name: x}`, "kind", "required"},
		{"unknown kind", `{kind: Gateway, name: x}`, "kind", "not Mesh, Scope, Policy or Workload"},
		{"unknown field", `{kind: Policy, name: x, sources: [{}], destinations: [{}], actoin: DENY}`, "actoin", "unknown field"},
		{"unknown nested field", `{kind: Policy, name: x, sources: [{mach: {a: b}}], destinations: [{}]}`, "sources[0].mach", "unknown field"},
		{"unknown field near a known one", `{kind: Policy, name: x, sources: [{}], destination: [{}]}`, "destination", "unknown field; did you mean destinations?"},
		{"unknown nested field near a known one", `{kind: Policy, name: x, sources: [{mach: {a: b}}], destinations: [{}]}`, "sources[0].mach", "did you mean match?"},
		{"empty name", `{kind: Policy, name: '', sources: [{}], destinations: [{}]}`, "name", "required"},
		{"slash in name", `{kind: Policy, name: a/b, sources: [{}], destinations: [{}]}`, "name", "names use only"},
		{"long name", `{kind: Policy, name: ` + strings.Repeat("n", 254) + `, sources: [{}], destinations: [{}]}`, "name", "over the limit"},
		{"slash in type", `{kind: Policy, name: x, type: kuma.io/TrafficLog, sources: [{}], destinations: [{}]}`, "type", "names use only"},
		{"bad action", `{kind: Policy, name: x, sources: [{}], destinations: [{}], action: PERMIT}`, "action", "not ALLOW or DENY"},
		{"empty match key", `{kind: Policy, name: x, sources: [{match: {'': a}}], destinations: [{}]}`, "sources[0].match", `key "" is empty`},
		{"empty match value", `{kind: Policy, name: x, sources: [{match: {a: ''}}], destinations: [{}]}`, `sources[0].match["a"]`, "use '*'"},
		{"sources without destinations", `{kind: Policy, name: x, sources: [{}]}`, "destinations", "required"},
		{"empty sources", `{kind: Policy, name: x, sources: [], destinations: [{}]}`, "sources", "at least one"},
		{"neither form", `{kind: Policy, name: x, action: ALLOW}`, "", "needs sources and destinations, or a targetRef"},
		{"both forms", `{kind: Policy, name: x, sources: [{}], destinations: [{}], targetRef: {kind: Mesh}}`, "targetRef", "not both"},
		{"port range reversed", `{kind: Policy, name: x, sources: [{}], destinations: [{}], ports: [{protocol: TCP, ports: '8100-8000'}]}`, "ports[0].ports", "ends below"},
		{"port too big", `{kind: Policy, name: x, sources: [{}], destinations: [{}], ports: [{ports: '65536'}]}`, "ports[0].ports", "1 to 65535"},
		{"port zero", `{kind: Policy, name: x, sources: [{}], destinations: [{}], ports: [{ports: '0'}]}`, "ports[0].ports", "1 to 65535"},
		{"bad protocol", `{kind: Policy, name: x, sources: [{}], destinations: [{}], ports: [{protocol: SCTP}]}`, "ports[0].protocol", "not TCP"},
		{"bad CIDR", `{kind: Policy, name: x, sources: [{}], destinations: [{expressions: [{key: ip, operator: CIDR, values: [10.0.0.0/33]}]}]}`, "destinations[0].expressions[0].values[0]", "not a CIDR"},
		{"bad operator", `{kind: Policy, name: x, sources: [{expressions: [{key: a, operator: Like, values: [b]}]}], destinations: [{}]}`, "sources[0].expressions[0].operator", "not In"},
		{"In without values", `{kind: Policy, name: x, sources: [{expressions: [{key: a, operator: In}]}], destinations: [{}]}`, "sources[0].expressions[0].values", "at least one"},
		{"Exists with values", `{kind: Policy, name: x, sources: [{expressions: [{key: a, operator: Exists, values: [b]}]}], destinations: [{}]}`, "sources[0].expressions[0].values", "must be empty"},
		{"targetRef with scope", `{kind: Policy, name: x, scope: Apps, targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}}]}`, "scope", "names no scope"},
		{"targetRef kind", `{kind: Policy, name: x, targetRef: {kind: HTTPRoute, name: r}}`, "targetRef.kind", "not Mesh"},
		{"Service without name", `{kind: Policy, name: x, targetRef: {kind: Service}, from: [{targetRef: {kind: Mesh}}]}`, "targetRef.name", "required"},
		{"Mesh with name", `{kind: Policy, name: x, targetRef: {kind: Mesh, name: y}, from: [{targetRef: {kind: Mesh}}]}`, "targetRef.name", "must be empty"},
		{"item without targetRef", `{kind: Policy, name: x, targetRef: {kind: Mesh}, from: [{action: DENY}]}`, "from[0].targetRef", "required"},
		{"items and blocks", `{kind: Policy, name: x, targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}}], defaults: {rules: {a: 1}}}`, "defaults", "cannot be mixed"},
		{"conf and blocks", `{kind: Policy, name: x, targetRef: {kind: Mesh}, conf: {a: 1}, defaults: {rules: {a: 1}}}`, "conf", "not both"},
		{"block strategy", `{kind: Policy, name: x, targetRef: {kind: Mesh}, defaults: {strategy: deep, rules: {a: 1}}}`, "defaults.strategy", "not atomic or merge"},
		{"block without rules", `{kind: Policy, name: x, targetRef: {kind: Mesh}, defaults: {strategy: merge}}`, "defaults.rules", "required"},
		{"when does not parse", `{kind: Policy, name: x, targetRef: {kind: Mesh}, defaults: {when: 'size(self.rules) >', rules: {a: 1}}}`, "defaults.when", "ERROR: <input>:1:"},
		{"when not bool", `{kind: Policy, name: x, targetRef: {kind: Mesh}, defaults: {when: '1 + 2', rules: {a: 1}}}`, "defaults.when", "not bool"},
		{"when unknown variable", `{kind: Policy, name: x, targetRef: {kind: Mesh}, defaults: {when: 'other > 1', rules: {a: 1}}}`, "defaults.when", "undeclared reference"},
		{"scope own parent", `{kind: Scope, name: a, parent: a, selectors: [{}]}`, "parent", "own parent"},
		{"scope without selectors", `{kind: Scope, name: a}`, "selectors", "required"},
		{"empty catchAllTypes", `{kind: Scope, name: a, selectors: [{}], catchAll: DENY, catchAllTypes: []}`, "catchAllTypes", "at least one"},
		{"priority not integer", `{kind: Scope, name: a, selectors: [{}], priority: 1.5}`, "priority", "integer"},
		{"priority too big", `{kind: Scope, name: a, selectors: [{}], priority: 3000000000}`, "priority", "integer"},
		{"enforced not bool", `{kind: Scope, name: a, selectors: [{}], enforced: 'yes'}`, "enforced", "true or false"},
		{"mesh tieBreak", `{kind: Mesh, name: m, tieBreak: Oldest}`, "tieBreak", "not Name"},
		{"denyFirst without from items", `{kind: Policy, name: x, targetRef: {kind: Mesh}, to: [{targetRef: {kind: Mesh}}], denyFirst: true}`, "denyFirst", "orders from items"},
		{"type tieBreak", `{kind: Mesh, name: m, types: {MeshTimeout: {tieBreak: Oldest}}}`, `types["MeshTimeout"].tieBreak`, "not Name"},
		{"mesh combine", `{kind: Mesh, name: m, types: {TrafficPermission: {combine: AnyMatch}}}`, `types["TrafficPermission"].combine`, "not FirstMatch"},
		{"bad time", `{kind: Policy, name: x, sources: [{}], destinations: [{}], creationTime: yesterday}`, "creationTime", "RFC 3339"},
		{"conf not object", `{kind: Policy, name: x, sources: [{}], destinations: [{}], conf: [1, 2]}`, "conf", "must be an object"},
		{"kuma spec and top-level", `{type: TrafficLog, name: x, sources: [{}], spec: {sources: [{}]}}`, "spec.sources", "also given outside spec"},
		{"kuma default and action", `{type: MeshTrafficPermission, name: x, spec: {targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, action: Deny, default: {action: Allow}}]}}`, "spec.from[0].default", "given with action"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := resource.DecodeYAML([]byte(tc.doc))
			if err == nil {
				t.Fatalf("accepted %s", tc.doc)
			}
			if !errors.Is(err, resource.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T is not a *ValidationError", err)
			}
			want := "documents[0] (line 1)"
			if tc.field != "" {
				want += "." + tc.field
			}
			for _, fe := range ve.Errors {
				if fe.Field == want && strings.Contains(fe.Reason, tc.why) {
					return
				}
			}
			t.Fatalf("want an error on %q containing %q, got %v", want, tc.why, err)
		})
	}
}

func TestDecodeKumaUniversal(t *testing.T) {
	t.Parallel()
	doc := `
type: MeshTrafficPermission
mesh: demo
name: backend-permissions
labels: {kuma.io/origin: zone}
spec:
  targetRef: {kind: MeshService, name: backend}
  from:
    - targetRef: {kind: MeshServiceSubset, name: web, tags: {version: v2}}
      default: {action: Deny}
    - targetRef: {kind: Dataplane, name: dp-1}
      default: {action: Allow}
---
type: AuditedPermission
name: audited
spec:
  targetRef: {kind: MeshService, name: backend}
  from:
    - targetRef: {kind: Dataplane, name: dp-1}
      default: {action: Allow, audit: {sink: file}}
---
type: TrafficLog
name: catch-all
sources: [{match: {kuma.io/service: '*'}}]
destinations: [{match: {kuma.io/service: '*'}}]
conf: {backend: logstash}
`
	rs, err := resource.DecodeYAML([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p := rs[0].(*resource.Policy)
	if p.Mesh != "demo" || p.Type != "MeshTrafficPermission" || p.TargetRef.Kind != resource.TargetService || p.TargetRef.Name != "backend" {
		t.Fatalf("targetRef: %+v", p)
	}
	if p.From[0].TargetRef.Kind != resource.TargetServiceSubset || p.From[0].Action != resource.Deny || p.From[0].Conf != nil {
		t.Fatalf("from[0]: %+v", p.From[0])
	}
	if p.From[1].TargetRef.Kind != resource.TargetProxy || p.From[1].Action != resource.Allow || p.From[1].Conf != nil {
		t.Fatalf("from[1]: %+v", p.From[1])
	}
	// A type whose schema verdict does not know: the rest of default is conf.
	if a := rs[1].(*resource.Policy); a.From[0].Action != resource.Allow || a.From[0].Conf["audit"] == nil {
		t.Fatalf("an opaque type's from[0]: %+v", a.From[0])
	}
	log := rs[2].(*resource.Policy)
	if log.Mesh != "default" || log.Type != "TrafficLog" || log.Conf["backend"] != "logstash" || log.Action != resource.ActionUnset {
		t.Fatalf("legacy policy: %+v", log)
	}
}

// TestEncodeRoundTrip: every resource of the conformance suites survives
// EncodeJSON → DecodeJSON unchanged.
func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../testdata/conformance/*.yaml")
	if len(files) == 0 {
		t.Fatal("no conformance suites found")
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := resource.ParseYAML(data)
		if err != nil {
			t.Fatal(err)
		}
		top := docs[0].Value.(map[string]any)
		for _, v := range top["resources"].([]any) {
			r, err := resource.DecodeValue(v)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			checkRoundTrip(t, r)
			n++
		}
	}
	if n < 100 {
		t.Fatalf("only %d resources round-tripped", n)
	}
}

func checkRoundTrip(t *testing.T, r resource.Resource) {
	t.Helper()
	b, err := resource.EncodeJSON(r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := resource.DecodeJSON(b)
	if err != nil {
		t.Fatalf("%s does not decode: %v", b, err)
	}
	b2, err := resource.EncodeJSON(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, b2) {
		t.Fatalf("round trip changed the document:\n%s\n%s", b, b2)
	}
}

func TestParseYAMLRefusesHostileInput(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 200) + strings.Repeat("]", 200)
	bomb := "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
	for name, doc := range map[string]string{"deep nesting": deep, "aliases": bomb, "merge keys": "a: {x: 1}\nb: {<<: {y: 2}}\n",
		"invalid UTF-8": "{kind: Policy, name: x, sources: [{match: {a: \xff}}], destinations: [{}]}"} {
		if _, err := resource.DecodeYAML([]byte(doc)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func FuzzDecodeYAML(f *testing.F) {
	files, _ := filepath.Glob("../../testdata/conformance/*.yaml")
	for _, file := range files {
		data, _ := os.ReadFile(file)
		docs, _ := resource.ParseYAML(data)
		if len(docs) == 0 {
			continue
		}
		for i, v := range docs[0].Value.(map[string]any)["resources"].([]any) {
			if i%7 != 0 {
				continue
			}
			if r, err := resource.DecodeValue(v); err == nil {
				b, _ := resource.EncodeJSON(r)
				f.Add(b)
			}
		}
	}
	f.Add([]byte("type: TrafficLog\nname: x\nspec: {sources: [{}], destinations: [{}]}\n"))
	f.Add([]byte("type: MeshTrafficPermission\nname: r\nspec:\n  rules: [{default: {allow: [{spiffeID: {type: Prefix, value: 'spiffe://m/'}}]}}]\n"))
	f.Add([]byte("type: MeshTrace\nname: t\nspec: {targetRef: {kind: Dataplane, labels: {app: a}}, default: {sampling: {overall: 1}}}\n"))
	f.Add([]byte("type: TrafficTrace\nname: t\nselectors: []\nconf: {backend: b}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := resource.DecodeYAML(data)
		if err != nil && !errors.Is(err, resource.ErrInvalid) {
			t.Fatalf("error that is not ErrInvalid: %v", err)
		}
		for _, r := range rs {
			checkRoundTrip(t, r)
		}
	})
}
