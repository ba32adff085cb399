package resource_test

import (
	"github.com/verdictpdp/verdict/engine/resource"

	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestDecodeKumaForms: each of Kuma's forms reads as the verdict document it
// means (compared through the canonical encoding, so the test states the
// meaning in verdict's own words).
func TestDecodeKumaForms(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, kuma, verdict string
	}{
		{"no top-level targetRef is kind Mesh",
			`{type: MeshTimeout, name: t, mesh: default, spec: {to: [{targetRef: {kind: Mesh}, default: {connectionTimeout: 2s}}]}}`,
			`{kind: Policy, type: MeshTimeout, name: t, targetRef: {kind: Mesh}, to: [{targetRef: {kind: Mesh}, conf: {connectionTimeout: 2s}}]}`},
		{"top-level default is a merge defaults block",
			`{type: MeshTrace, name: tr, spec: {targetRef: {kind: Mesh}, default: {sampling: {overall: 80}}}}`,
			`{kind: Policy, type: MeshTrace, name: tr, targetRef: {kind: Mesh}, defaults: {strategy: merge, rules: {sampling: {overall: 80}}}}`},
		{"top-level default without targetRef",
			`{type: MeshMetric, name: m, spec: {default: {backends: []}}}`,
			`{kind: Policy, type: MeshMetric, name: m, targetRef: {kind: Mesh}, defaults: {strategy: merge, rules: {backends: []}}}`},
		{"Dataplane by labels",
			`{type: MeshTrafficPermission, name: p, spec: {targetRef: {kind: Dataplane, labels: {app: orders}}, from: [{targetRef: {kind: Mesh}, default: {action: Allow}}]}}`,
			`{kind: Policy, type: MeshTrafficPermission, name: p, targetRef: {kind: Proxy, tags: {app: orders}}, from: [{targetRef: {kind: Mesh}, action: ALLOW}]}`},
		{"every Dataplane",
			`{type: MeshTrafficPermission, name: p, spec: {targetRef: {kind: Dataplane}, from: [{targetRef: {kind: Mesh}, default: {action: Deny}}]}}`,
			`{kind: Policy, type: MeshTrafficPermission, name: p, targetRef: {kind: Proxy}, from: [{targetRef: {kind: Mesh}, action: DENY}]}`},
		{"rules without matches are inbound items for every peer",
			`{type: MeshTLS, name: tls, spec: {targetRef: {kind: Mesh}, rules: [{default: {mode: Strict}}]}}`,
			`{kind: Policy, type: MeshTLS, name: tls, targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, conf: {mode: Strict}}]}`},
		{"rules matches on the peer's SPIFFE ID",
			`{type: MeshTimeout, name: mt, spec: {rules: [{matches: [{spiffeID: {type: Exact, value: 'spiffe://default/web'}}, {spiffeID: {type: Prefix, value: 'spiffe://default/ns/'}}], default: {idleTimeout: 20s}}]}}`,
			`{kind: Policy, type: MeshTimeout, name: mt, targetRef: {kind: Mesh}, from: [
			  {targetRef: {kind: MeshSubset, tags: {principal: 'spiffe://default/web'}}, conf: {idleTimeout: 20s}},
			  {targetRef: {kind: MeshSubset, expressions: [{key: principal, operator: Prefix, values: ['spiffe://default/ns/']}]}, conf: {idleTimeout: 20s}}]}`},
		{"MeshTrafficPermission rules: denies first, then shadow denies, then allows",
			`{type: MeshTrafficPermission, name: p, spec: {targetRef: {kind: Mesh}, rules: [{default: {
			   allow: [{spiffeID: {type: Prefix, value: 'spiffe://default/'}}], allowWithShadowDeny: [{spiffeID: {type: Exact, value: 'spiffe://default/c'}}],
			   deny: [{spiffeID: {type: Exact, value: 'spiffe://default/b'}}]}}]}}`,
			`{kind: Policy, type: MeshTrafficPermission, name: p, targetRef: {kind: Mesh}, denyFirst: true, from: [
			  {targetRef: {kind: MeshSubset, tags: {principal: 'spiffe://default/b'}}, action: DENY},
			  {targetRef: {kind: MeshSubset, tags: {principal: 'spiffe://default/c'}}, action: AllowWithShadowDeny},
			  {targetRef: {kind: MeshSubset, expressions: [{key: principal, operator: Prefix, values: ['spiffe://default/']}]}, action: ALLOW}]}`},
		{"dataplane policy selectors are sources with destinations [{}]",
			`{type: ProxyTemplate, mesh: default, name: custom-template-1, selectors: [{match: {kuma.io/service: web}}], conf: {imports: [default-proxy]}}`,
			`{kind: Policy, type: ProxyTemplate, name: custom-template-1, sources: [{match: {kuma.io/service: web}}], destinations: [{}], conf: {imports: [default-proxy]}}`},
		{"dataplane policy with no selectors matches every proxy",
			`{type: TrafficTrace, name: tt, selectors: [], conf: {backend: zipkin}}`,
			`{kind: Policy, type: TrafficTrace, name: tt, sources: [{}], destinations: [{}], conf: {backend: zipkin}}`},
		{"kind Policy in verdict's form may use the Kuma forms too",
			`{kind: Policy, type: MeshTLS, name: tls, rules: [{default: {mode: Permissive}}]}`,
			`{kind: Policy, type: MeshTLS, name: tls, targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, conf: {mode: Permissive}}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := decodeOne(t, tc.kuma)
			want := decodeOne(t, tc.verdict)
			if !reflect.DeepEqual(resource.DocumentOf(got), resource.DocumentOf(want)) {
				t.Fatalf("Kuma form reads as\n  %v\nwant\n  %v", resource.DocumentOf(got), resource.DocumentOf(want))
			}
		})
	}
}

func decodeOne(t *testing.T, doc string) resource.Resource {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(doc))
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d resources", len(rs))
	}
	return rs[0]
}

// TestDecodeKumaErrors: errors name the user's own path, and a document or a
// field verdict does not model gets exactly one error saying why.
func TestDecodeKumaErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		doc    string
		errors []string // every error, "field: part of the reason", in order
	}{
		{"an item's default.action", `{type: MeshTrafficPermission, name: x, spec: {targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, default: {action: Allw}}]}}`,
			[]string{`spec.from[0].default.action: "Allw" is not ALLOW or DENY`}},
		{"AllowWithShadowDeny beyond an item", `{type: TrafficPermission, name: x, action: AllowWithShadowDeny, sources: [{match: {kuma.io/service: a}}], destinations: [{match: {kuma.io/service: b}}]}`,
			[]string{`action: AllowWithShadowDeny is the action of a from or to item`}},
		{"AllowWithShadowDeny as a catch-all", `{kind: Scope, name: s, selectors: [{}], catchAll: AllowWithShadowDeny}`,
			[]string{`catchAll: AllowWithShadowDeny is the action of a from or to item`}},
		{"a typo'd kind gives one error", `{type: MeshTrafficPermission, name: x, spec: {targetRef: {kind: MeshServce, name: web}, from: [{targetRef: {kind: Mesh}, default: {action: Allow}}]}}`,
			[]string{`spec.targetRef.kind: "MeshServce" is not Mesh`}},
		{"a Dataplane by name and labels", `{type: MeshTrafficPermission, name: x, spec: {targetRef: {kind: Dataplane, name: a, labels: {app: b}}, from: [{targetRef: {kind: Mesh}, default: {action: Allow}}]}}`,
			[]string{`spec.targetRef.labels: kind Proxy selects by name or by tags`}},
		{"a rule's bad match", `{type: MeshTrafficPermission, name: y, spec: {rules: [{default: {deny: [{spiffeID: {type: Prefx, value: 'spiffe://x/'}}], allow: [{sni: {type: Exact, value: a}}]}}]}}`,
			[]string{`spec.rules[0].default.deny[0].spiffeID.type: "Prefx" is not Exact or Prefix`, `spec.rules[0].default.allow[0].sni: verdict does not see the TLS SNI`}},
		{"an empty permission rule", `{type: MeshTrafficPermission, name: y, spec: {rules: [{default: {}}]}}`,
			[]string{`spec.rules[0]: at least one of 'allow', 'allowWithShadowDeny', 'deny'`}},
		{"rules and from", `{type: MeshTLS, name: y, spec: {from: [{targetRef: {kind: Mesh}, default: {mode: Strict}}], rules: [{default: {mode: Strict}}]}}`,
			[]string{`spec.rules: rules and from cannot be given together`}},
		{"a rule's bad item conf path", `{type: MeshTimeout, name: y, spec: {rules: [{default: {action: Maybe}}]}}`,
			[]string{`spec.rules[0].default.action: "Maybe" is not ALLOW or DENY`}},
		{"selectors with sources", `{type: ProxyTemplate, name: y, selectors: [{}], sources: [{}], destinations: [{}]}`,
			[]string{`selectors: a dataplane policy's selectors are its sources`}},
		{"a dataplane policy's bad selector", `{type: ProxyTemplate, name: y, selectors: [{match: {'': x}}]}`,
			[]string{`selectors[0].match: key`}},
		{"top-level default and conf", `{type: MeshTrace, name: y, spec: {default: {a: 1}, conf: {b: 2}}}`,
			[]string{`spec.default: is given with conf`}},
		{"a route", `{type: MeshHTTPRoute, name: r, spec: {targetRef: {kind: Mesh}, to: [{targetRef: {kind: MeshService, name: x}, rules: []}]}}`,
			[]string{`type: MeshHTTPRoute is outside what verdict models: routes`}},
		{"a gateway", `{type: MeshGatewayInstance, name: g, spec: {replicas: 1}}`,
			[]string{`type: MeshGatewayInstance is outside what verdict models`}},
		{"a virtual outbound", `{type: VirtualOutbound, name: v, selectors: [{match: {kuma.io/service: '*'}}], conf: {host: x}}`,
			[]string{`type: VirtualOutbound is outside what verdict models`}},
		{"sectionName", `{type: MeshTimeout, name: t, spec: {targetRef: {kind: Dataplane, labels: {app: a}, sectionName: http}, rules: [{default: {idleTimeout: 1s}}]}}`,
			[]string{`spec.targetRef.sectionName: verdict does not model the sections`}},
		{"proxyTypes and namespace in an item", `{type: MeshTimeout, name: t, spec: {to: [{targetRef: {kind: MeshService, name: a, namespace: ns, proxyTypes: [Sidecar]}, default: {idleTimeout: 1s}}]}}`,
			[]string{`spec.to[0].targetRef.namespace: verdict has no Kubernetes namespaces`, `spec.to[0].targetRef.proxyTypes: verdict does not tell gateways from sidecars`}},
		{"a gateway kind", `{type: MeshTimeout, name: t, spec: {targetRef: {kind: MeshGateway, name: gw}, to: [{targetRef: {kind: Mesh}, default: {idleTimeout: 1s}}]}}`,
			[]string{`spec.targetRef.kind: MeshGateway is outside what verdict models`}},
		{"MeshService by labels", `{type: MeshTimeout, name: t, spec: {to: [{targetRef: {kind: MeshService, labels: {app: a}}, default: {idleTimeout: 1s}}]}}`,
			[]string{`spec.to[0].targetRef.labels: labels on kind MeshService select MeshService resources`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := resource.DecodeYAML([]byte(tc.doc))
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a validation error", err)
			}
			if len(ve.Errors) != len(tc.errors) {
				t.Fatalf("got %d errors, want %d: %v", len(ve.Errors), len(tc.errors), err)
			}
			for i, want := range tc.errors {
				field, why, _ := strings.Cut(want, ": ")
				fe := ve.Errors[i]
				if fe.Field != "documents[0] (line 1)."+field || !strings.Contains(fe.Reason, why) {
					t.Errorf("error %d is %q, want %q", i, fe.Error(), want)
				}
			}
		})
	}
}

// TestDecodeDuplicateKey: a key given twice is refused, naming the key and
// both lines (Kuma would keep the last value silently).
func TestDecodeDuplicateKey(t *testing.T) {
	t.Parallel()
	doc := "type: MeshTimeout\nname: a\nspec:\n  default: {}\nname: b\n"
	_, err := resource.DecodeYAML([]byte(doc))
	if err == nil || !strings.Contains(err.Error(), `key "name" is given twice, on lines 2 and 5`) {
		t.Fatalf("got %v", err)
	}
}
