package resource_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
)

// Control characters in a tag would make two tag sets share the bytes their
// identity is hashed from ({app: web, env: prod} and {app: "web\0env\0prod"}):
// they are refused in every key and value a resource or a request carries.
func TestControlCharactersRefusedInTags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		doc   string
		field string
	}{
		{"workload tag value", `{kind: Workload, name: w, tags: {app: "web\0env\0prod"}}`, `tags["app"]`},
		{"workload tag key", `{kind: Workload, name: w, tags: {"a\x01pp": web}}`, `tags`},
		{"workload port tag", `{kind: Workload, name: w, tags: {app: web}, ports: [{port: 80, tags: {v: "1\n"}}]}`, `ports[0].tags["v"]`},
		{"workload principal", `{kind: Workload, name: w, tags: {app: web}, principal: "spiffe://m/a\x7f"}`, `principal`},
		{"match value", `{kind: Policy, name: x, sources: [{match: {app: "web\0env"}}], destinations: [{}]}`, `sources[0].match["app"]`},
		{"match key", `{kind: Policy, name: x, sources: [{match: {"app\t": web}}], destinations: [{}]}`, `sources[0].match`},
		{"expression key", `{kind: Policy, name: x, sources: [{expressions: [{key: "a\x1fb", operator: Exists}]}], destinations: [{}]}`, `sources[0].expressions[0].key`},
		{"expression value", `{kind: Policy, name: x, sources: [{expressions: [{key: a, operator: In, values: [ok, "b\0"]}]}], destinations: [{}]}`, `sources[0].expressions[0].values[1]`},
		{"targetRef tags", `{kind: Policy, name: x, targetRef: {kind: MeshSubset, tags: {app: "w\re"}}, from: [{targetRef: {kind: Mesh}}]}`, `targetRef.tags["app"]`},
		{"targetRef name", `{kind: Policy, name: x, targetRef: {kind: Service, name: "web\0"}, from: [{targetRef: {kind: Mesh}}]}`, `targetRef.name`},
		{"kuma dataplane inbound tags", `{type: Dataplane, name: d, networking: {address: 10.0.0.1, inbound: [{port: 80, tags: {kuma.io/service: "web\0x"}}]}}`, `networking.inbound[0].tags["kuma.io/service"]`},
		{"kuma labels", `{type: MeshTrafficPermission, name: x, spec: {targetRef: {kind: Dataplane, labels: {app: "a\x00"}}, from: [{targetRef: {kind: Mesh}, default: {action: Allow}}]}}`, `spec.targetRef.labels["app"]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := resource.DecodeYAML([]byte(tc.doc))
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("accepted or not a validation error: %v", err)
			}
			want := "documents[0] (line 1)." + tc.field
			for _, fe := range ve.Errors {
				if fe.Field == want && strings.Contains(fe.Reason, "control character") {
					return
				}
			}
			t.Fatalf("want an error on %q naming a control character, got %v", want, err)
		})
	}
}

func TestCheckTagsRefusesControlCharacters(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		tags map[string]string
		ok   bool
	}{
		{"plain", map[string]string{"app": "web", "env": "prod"}, true},
		{"unicode", map[string]string{"app": "wéb ✓", "note": "a b"}, true},
		{"NUL in value (the identity collision)", map[string]string{"app": "web\x00env\x00prod"}, false},
		{"NUL in key", map[string]string{"app\x00x": "web"}, false},
		{"newline", map[string]string{"app": "web\n"}, false},
		{"unit separator", map[string]string{"app": "a\x1fb"}, false},
		{"DEL", map[string]string{"app": "a\x7f"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := resource.CheckTags(tc.tags)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckTags(%q) = %v, want ok %v", tc.tags, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "control character") {
				t.Fatalf("error %q does not name the control character", err)
			}
		})
	}
}
