package resource_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
)

// TestKumaDefaultTypos: for the Kuma types whose schema verdict knows, a
// field of `default` Kuma does not have is refused with its path and the
// nearest known name, and a MeshTrafficPermission item needs its action — a
// typo never becomes an ALLOW carrying the typo as configuration.
func TestKumaDefaultTypos(t *testing.T) {
	t.Parallel()
	const mtp = `{type: MeshTrafficPermission, name: x, spec: {targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, default: `
	cases := []struct {
		name   string
		doc    string
		errors []string // field: a part of the reason
	}{
		{"a typo of action", mtp + `{actoin: Deny}}]}}`, []string{
			"spec.from[0].default.action: is required for a MeshTrafficPermission item",
			"spec.from[0].default.actoin: unknown field; did you mean action?"}},
		{"an empty default", mtp + `{}}]}}`, []string{
			"spec.from[0].default.action: is required"}},
		{"action beside an unknown field", mtp + `{action: Deny, audit: {sink: file}}}]}}`, []string{
			"spec.from[0].default.audit: unknown field"}},
		{"verdict's form: an item without action", `{kind: Policy, type: MeshTrafficPermission, name: x, targetRef: {kind: Mesh},
			from: [{targetRef: {kind: Mesh}}]}`, []string{
			"from[0].action: is required for a MeshTrafficPermission item"}},
		{"verdict's form: conf on a permission item", `{kind: Policy, type: MeshTrafficPermission, name: x, targetRef: {kind: Mesh},
			to: [{targetRef: {kind: Mesh}, action: DENY, conf: {actoin: ALLOW}}]}`, []string{
			"to[0].conf.actoin: unknown field; did you mean action?"}},
		{"a typo in a permission rule", `{type: MeshTrafficPermission, name: x, spec: {rules: [{default: {dny: [{spiffeID: {type: Exact, value: a}}]}}]}}`, []string{
			"spec.rules[0]: at least one of",
			"spec.rules[0].default.dny: unknown field; did you mean deny?"}},
		{"MeshTimeout to", `{type: MeshTimeout, name: t, spec: {to: [{targetRef: {kind: Mesh}, default: {idleTimout: 1s}}]}}`, []string{
			"spec.to[0].default.idleTimout: unknown field; did you mean idleTimeout?"}},
		{"MeshTimeout nested", `{type: MeshTimeout, name: t, spec: {to: [{targetRef: {kind: Mesh}, default: {http: {requestTimout: 1s}}}]}}`, []string{
			"spec.to[0].default.http.requestTimout: unknown field; did you mean requestTimeout?"}},
		{"MeshTimeout rules", `{type: MeshTimeout, name: t, spec: {rules: [{default: {conectionTimeout: 1s}}]}}`, []string{
			"spec.rules[0].default.conectionTimeout: unknown field; did you mean connectionTimeout?"}},
		{"MeshTimeout rules with matches", `{type: MeshTimeout, name: t, spec: {rules: [{matches: [{spiffeID: {type: Exact, value: a}}], default: {idleTimeut: 1s}}]}}`, []string{
			"spec.rules[0].default.idleTimeut: unknown field; did you mean idleTimeout?"}},
		{"MeshRetry", `{type: MeshRetry, name: r, spec: {to: [{targetRef: {kind: Mesh}, default: {http: {numRetry: 3}}}]}}`, []string{
			"spec.to[0].default.http.numRetry: unknown field; did you mean numRetries?"}},
		{"MeshRetry list items", `{type: MeshRetry, name: r, spec: {to: [{targetRef: {kind: Mesh}, default: {http: {retriableRequestHeaders: [{name: a, vaule: b}]}}}]}}`, []string{
			"spec.to[0].default.http.retriableRequestHeaders[0].vaule: unknown field; did you mean value?"}},
		{"MeshRateLimit", `{type: MeshRateLimit, name: r, spec: {rules: [{default: {local: {http: {requestRate: {num: 1, intervl: 1s}}}}}]}}`, []string{
			"spec.rules[0].default.local.http.requestRate.intervl: unknown field; did you mean interval?"}},
		{"MeshHealthCheck", `{type: MeshHealthCheck, name: h, spec: {to: [{targetRef: {kind: Mesh}, default: {intervall: 1s}}]}}`, []string{
			"spec.to[0].default.intervall: unknown field; did you mean interval?"}},
		{"MeshCircuitBreaker", `{type: MeshCircuitBreaker, name: c, spec: {from: [{targetRef: {kind: Mesh}, default: {outlierDetection: {detectors: {totalFailures: {consecutiv: 3}}}}}]}}`, []string{
			"spec.from[0].default.outlierDetection.detectors.totalFailures.consecutiv: unknown field; did you mean consecutive?"}},
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
			for _, want := range tc.errors {
				field, why, _ := strings.Cut(want, ": ")
				if !slices.ContainsFunc(ve.Errors, func(fe resource.FieldError) bool {
					return strings.HasSuffix(fe.Field, "."+field) && strings.Contains(fe.Reason, why)
				}) {
					t.Errorf("no error %q in %v", want, err)
				}
			}
		})
	}
}

// TestKumaDefaultsAccepted: what Kuma's schemas have is accepted, and the
// default of a type verdict knows no schema of stays opaque configuration.
func TestKumaDefaultsAccepted(t *testing.T) {
	t.Parallel()
	docs := []string{
		`{type: MeshTrafficPermission, name: p, spec: {targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, default: {action: AllowWithShadowDeny}}]}}`,
		`{kind: Policy, type: MeshTrafficPermission, name: p, targetRef: {kind: Mesh}, from: [{targetRef: {kind: Mesh}, action: DENY}]}`,
		`{type: MeshTimeout, name: t, spec: {to: [{targetRef: {kind: Mesh}, default: {connectionTimeout: 1s, idleTimeout: 2s,
		   http: {requestTimeout: 1s, streamIdleTimeout: 1s, maxStreamDuration: 1s, maxConnectionDuration: 1s, requestHeadersTimeout: 1s}}}]}}`,
		`{type: MeshRetry, name: r, spec: {to: [{targetRef: {kind: Mesh}, default: {tcp: {maxConnectAttempt: 2},
		   http: {numRetries: 3, perTryTimeout: 1s, backOff: {baseInterval: 1s, maxInterval: 2s}, retryOn: [5xx],
		     rateLimitedBackOff: {resetHeaders: [{name: retry-after, format: Seconds}], maxInterval: 1s},
		     retriableResponseHeaders: [{type: Exact, name: x, value: y}], hostSelection: [{predicate: OmitHostsWithTags, tags: {a: b}}],
		     hostSelectionMaxAttempts: 3},
		   grpc: {numRetries: 1, retryOn: [Canceled]}}}]}}`,
		`{type: MeshRateLimit, name: r, spec: {rules: [{default: {local: {http: {disabled: false, requestRate: {num: 1, interval: 1s},
		   onRateLimit: {status: 429, headers: {set: [{name: a, value: b}], add: [{name: c, value: d}]}}}, tcp: {connectionRate: {num: 1, interval: 1s}}}}}]}}`,
		`{type: MeshHealthCheck, name: h, spec: {to: [{targetRef: {kind: Mesh}, default: {interval: 1s, timeout: 1s, unhealthyThreshold: 3,
		   healthyThreshold: 1, healthyPanicThreshold: 50, tcp: {send: ping, receive: [pong]}, http: {path: /h, expectedStatuses: [200],
		   requestHeadersToAdd: {add: [{name: a, value: b}]}}, grpc: {serviceName: s}}}]}}`,
		`{type: MeshCircuitBreaker, name: c, spec: {to: [{targetRef: {kind: Mesh}, default: {connectionLimits: {maxConnections: 2},
		   outlierDetection: {disabled: false, detectors: {successRate: {minimumHosts: 1, standardDeviationFactor: "1.9"}, failurePercentage: {threshold: 85}}}}}]}}`,
		`{type: MeshAccessLog, name: l, spec: {from: [{targetRef: {kind: Mesh}, default: {backends: [{file: {path: /dev/stdout}}], anything: 1}}]}}`,
	}
	for _, doc := range docs {
		if _, err := resource.DecodeYAML([]byte(doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
}
