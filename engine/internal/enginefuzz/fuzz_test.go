package enginefuzz_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// watchdog fails the test when f runs longer than limit: a hostile input
// must never hang the engine. The limits are hang detectors, generous enough
// for -race on a busy machine (30 s ran out at load 30), not timings.
func watchdog(t *testing.T, limit time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("still running after %v", limit)
	}
}

var operators = []string{"In", "NotIn", "Exists", "DoesNotExist", "Prefix", "CIDR"}

// FuzzSelectors compiles one policy whose source selector is built from the
// input (a match entry, an expression, or both) and decides a flow whose
// source tags are built from the same strings, then checks the answer against
// docs/selectors.md evaluated directly: ALLOW by the policy when the selector
// matches, DEFAULT_ACTION (DENY) when it does not. Explain must agree.
func FuzzSelectors(f *testing.F) {
	f.Add("app", "web", uint8(0), "web,api", "app", "web", uint8(7))
	f.Add("app", "*", uint8(1), "db", "app", "db", uint8(3))
	f.Add("env", "prod", uint8(4), "we", "app", "web", uint8(5))
	f.Add("ip", "10.0.0.1", uint8(5), "10.0.0.0/8,192.168.0.0/16", "ip", "10.1.2.3", uint8(6))
	f.Add("ip", "x", uint8(11), "::1,fe80::/10", "ip", "fe80::1", uint8(2))
	f.Add("k", "v", uint8(14), "", "other", "v", uint8(1))
	f.Add("k", "v", uint8(15), "a,b", "k", "c", uint8(0))
	f.Fuzz(func(t *testing.T, mk, mv string, op uint8, values, tk, tv string, flags uint8) {
		sel := selector{}
		form := (op / 6) % 3 // 0: match, 1: expression, 2: both
		if form != 1 {
			sel.Match = map[string]string{mk: mv}
		}
		var vals []string
		if values != "" {
			vals = strings.Split(values, ",")
		}
		if form != 0 {
			sel.Expressions = []expression{{Key: tk, Operator: operators[int(op)%len(operators)], Values: vals}}
		}
		doc, err := json.Marshal(map[string]any{"kind": "Policy", "name": "p", "sources": []selector{sel},
			"destinations": []map[string]any{{}}})
		if err != nil {
			return
		}
		r, err := resource.DecodeJSON(doc)
		if err != nil {
			if !errors.Is(err, resource.ErrInvalid) {
				t.Fatalf("decode error that is not ErrInvalid: %v", err)
			}
			return
		}
		src := resource.Tags{}
		if flags&1 != 0 {
			src[mk] = mv
		}
		if flags&2 != 0 {
			src[tk] = tv
		}
		if flags&4 != 0 && len(vals) > 0 {
			src[tk] = vals[0]
		}
		if flags&8 != 0 && len(vals) > 0 {
			src[tk] = vals[len(vals)-1] + tv
		}
		req := engine.Request{Source: src, Destination: resource.Tags{"app": "dst"}}
		if req.Validate() != nil {
			return
		}
		snap := engine.Build(1, []resource.Resource{r})
		if inv := snap.Invalid(); len(inv) > 0 {
			t.Fatalf("a decoded policy is invalid alone: %v", inv[0].Err)
		}
		want, why := sel.matches(src)
		var d engine.Decision
		for try := range 3 { // the snapshot's decision cache admits a flow seen again
			d, err = snap.Decide(&req)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			for _, side := range []engine.SideDecision{d.Outbound, d.Inbound} {
				if want && (side.Action != resource.Allow || side.Policy != "p" || side.Reason != engine.ReasonMatched) ||
					!want && (side.Action != resource.Deny || side.Reason != engine.ReasonDefaultAction) {
					t.Fatalf("selector %+v, source %v, decision %d: side %+v, want match=%v (%s)", sel, src, try+1, side, want, why)
				}
			}
		}
		req.Explain = true
		e, err := snap.Decide(&req)
		if err != nil || e.Action != d.Action || e.Explain == nil {
			t.Fatalf("Decide with explain: %+v %v, without: %v", e, err, d.Action)
		}
	})
}

type selector struct {
	Match       map[string]string `json:"match,omitempty"`
	Expressions []expression      `json:"expressions,omitempty"`
}

type expression struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// matches is docs/selectors.md, written directly from the text.
func (s selector) matches(tags resource.Tags) (bool, string) {
	for k, v := range s.Match {
		tv, ok := tags[k]
		if !ok {
			return false, "match key " + k + " missing"
		}
		if v != "*" && tv != v {
			return false, "match value of " + k + " differs"
		}
	}
	for _, e := range s.Expressions {
		v, ok := tags[e.Key]
		var hold bool
		switch e.Operator {
		case "In":
			hold = ok && slices.Contains(e.Values, v)
		case "NotIn":
			hold = !ok || !slices.Contains(e.Values, v)
		case "Exists":
			hold = ok
		case "DoesNotExist":
			hold = !ok
		case "Prefix":
			hold = ok && slices.ContainsFunc(e.Values, func(p string) bool { return strings.HasPrefix(v, p) })
		case "CIDR":
			addr, err := netip.ParseAddr(v)
			hold = ok && err == nil && slices.ContainsFunc(e.Values, func(c string) bool {
				p, err := netip.ParsePrefix(c)
				if !strings.Contains(c, "/") {
					a, aerr := netip.ParseAddr(c)
					p, err = netip.PrefixFrom(a, a.BitLen()), aerr
				}
				return err == nil && p.Masked().Contains(addr)
			})
		}
		if !hold {
			return false, e.Operator + " on " + e.Key + " does not hold"
		}
	}
	return true, ""
}

// FuzzWhen compiles a defaults block whose `when` is the input and resolves
// it: an expression is refused on write with ErrInvalid, or evaluated within
// the cost limit (an evaluation error skips the block and is reported), never
// a panic and never a hang.
func FuzzWhen(f *testing.F) {
	l := "[1,2,3,4,5,6,7,8,9,10]"
	for _, w := range []string{
		"true", `self.rules.size() == 0`, `has(self.rules.limit)`, `self.rules["limit"] > 50.0`, `1/0 == 1`,
		`[1,2].exists(x, x > 1)`, `string(self) == "x"`, `dyn(1) == "a"`, `self.rules.all(k, self.rules.all(j, k == j))`,
		l + ".map(a, " + l + ".map(b, " + l + ".map(c, " + l + ".map(d, " + l + ".map(e, a+b+c+d+e))))).size() > 0",
		strings.Repeat("(", 70) + "true" + strings.Repeat(")", 70), `"a" + "b" == "ab" && 'x'.matches('^x+$')`,
	} {
		f.Add(w, `{"limit": 10}`, `{"limit": 100}`)
	}
	f.Fuzz(func(t *testing.T, when, defaults, overrides string) {
		var d, o map[string]any
		if json.Unmarshal([]byte(defaults), &d) != nil || json.Unmarshal([]byte(overrides), &o) != nil || len(d) == 0 || len(o) == 0 {
			return
		}
		docs := []map[string]any{
			{"kind": "Policy", "name": "a", "type": "RateLimit", "sources": []any{map[string]any{}}, "destinations": []any{map[string]any{}},
				"defaults": map[string]any{"strategy": "merge", "when": when, "rules": d}},
			{"kind": "Policy", "name": "b", "type": "RateLimit", "rank": "Absolute", "sources": []any{map[string]any{}},
				"destinations": []any{map[string]any{}}, "overrides": map[string]any{"when": when, "rules": o}},
		}
		var rs []resource.Resource
		for _, doc := range docs {
			b, err := json.Marshal(doc)
			if err != nil {
				return
			}
			r, err := resource.DecodeJSON(b)
			if err != nil {
				if !errors.Is(err, resource.ErrInvalid) {
					t.Fatalf("decode error that is not ErrInvalid: %v", err)
				}
				return
			}
			rs = append(rs, r)
		}
		watchdog(t, 2*time.Minute, func() {
			snap := engine.Build(1, rs)
			res, err := snap.Resolve(&engine.ResolveRequest{Type: "RateLimit", Source: resource.Tags{"app": "a"}, Destination: resource.Tags{"app": "b"}})
			if err != nil {
				t.Errorf("Resolve: %v", err)
				return
			}
			if res.Main == nil || len(res.Main.Status) != 2 {
				t.Errorf("Resolve: %+v", res.Main)
			}
		})
	})
}

// FuzzKumaYAML runs YAML files — native documents and Kuma's universal format,
// seeded with the examples — through the whole engine: decode, CheckApply,
// Build, then Decide, Explain, Resolve and RulesFor for flows made of the
// documents' own tags. Errors must be validation errors (or an unknown mesh);
// nothing may panic or hang.
func FuzzKumaYAML(f *testing.F) {
	files, _ := filepath.Glob("../../../examples/*.yaml")
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"type: TrafficPermission\nname: tp\nmesh: default\nsources:\n  - match:\n      kuma.io/service: web\ndestinations:\n  - match:\n      kuma.io/service: backend\n",
		"type: MeshTrafficPermission\nname: mtp\nmesh: default\nspec:\n  targetRef: {kind: MeshService, name: backend}\n  from:\n    - targetRef: {kind: MeshSubset, tags: {kuma.io/service: web}}\n      default: {action: Deny}\n",
		"type: TrafficLog\nname: tl\nmesh: default\nsources: [{match: {kuma.io/service: '*'}}]\ndestinations: [{match: {kuma.io/service: '*'}}]\nconf: {backend: file}\n",
		"type: MeshTimeout\nname: mt\nspec:\n  targetRef: {kind: Mesh}\n  to:\n    - targetRef: {kind: MeshService, name: db}\n      default: {connectTimeout: 2s}\n",
		"kind: Scope\nname: Apps\nselectors: [{match: {tier: app}}]\ncatchAll: DENY\n---\nkind: Policy\nname: p\nscope: Apps\nsources: [{expressions: [{key: ip, operator: CIDR, values: [10.0.0.0/8]}]}]\ndestinations: [{}]\n",
		"type: Dataplane\nname: dp\n",
		// Kuma >= 2.10 forms: no top-level targetRef, Dataplane labels, rules with spiffeID matches,
		// a top-level default, a dataplane policy's selectors
		"type: MeshTrafficPermission\nname: r\nspec:\n  targetRef: {kind: Dataplane, labels: {app: api}}\n  rules:\n    - default:\n        deny: [{spiffeID: {type: Exact, value: 'spiffe://default/legacy'}}]\n        allow: [{spiffeID: {type: Prefix, value: 'spiffe://default/'}}]\n",
		"type: MeshTimeout\nname: mt\nspec:\n  rules:\n    - matches: [{spiffeID: {type: Prefix, value: 'spiffe://x/'}}]\n      default: {idleTimeout: 1s}\n",
		"type: MeshTrace\nname: tr\nspec:\n  targetRef: {kind: Dataplane}\n  default: {sampling: {overall: 80}}\n",
		"type: ProxyTemplate\nname: pt\nselectors: [{match: {kuma.io/service: web}}]\nconf: {imports: [default-proxy]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := resource.DecodeYAML(data)
		if err != nil {
			if !errors.Is(err, resource.ErrInvalid) {
				t.Fatalf("decode error that is not ErrInvalid: %v", err)
			}
			return
		}
		watchdog(t, 2*time.Minute, func() { exercise(t, rs) })
	})
}

func exercise(t *testing.T, rs []resource.Resource) {
	_ = engine.Empty().CheckApply(rs, nil)
	snap := engine.Build(1, rs)
	var tagSets []resource.Tags
	meshes := map[string]bool{}
	types := map[string]bool{}
	for _, r := range rs {
		meshes[r.Key().Mesh] = true
		p, ok := r.(*resource.Policy)
		if !ok {
			continue
		}
		types[p.Type] = true
		for _, s := range slices.Concat(p.Sources, p.Destinations) {
			tags := resource.Tags{}
			for k, v := range s.Match {
				tags[k] = strings.ReplaceAll(v, "*", "x")
			}
			tagSets = append(tagSets, tags)
		}
	}
	tagSets = append(tagSets, resource.Tags{}, resource.Tags{"kuma.io/service": "web"})
	// An answer or one of the engine's refusals with an API code (an unknown
	// mesh or type, an invalid request, a mesh and type closed by an invalid
	// stored resource: docs/api.md); anything else is a defect.
	ok := func(err error) bool {
		_, refusal := engine.CodeName(err)
		return err == nil || refusal
	}
	for mesh := range meshes {
		for typ := range types {
			for i, src := range tagSets {
				dst := tagSets[(i+1)%len(tagSets)]
				req := engine.Request{Mesh: mesh, Type: typ, Source: src, Destination: dst, Explain: i%2 == 0}
				if req.Validate() != nil {
					continue
				}
				if _, err := snap.Decide(&req); !ok(err) {
					t.Fatalf("Decide: %v", err)
				}
				if _, err := snap.Resolve(&engine.ResolveRequest{Mesh: mesh, Type: typ, Source: src, Destination: dst}); !ok(err) {
					t.Fatalf("Resolve: %v", err)
				}
				if _, err := snap.RulesFor(mesh, typ, dst); !ok(err) {
					t.Fatalf("RulesFor: %v", err)
				}
			}
		}
	}
	_ = snap.Digest()
}
