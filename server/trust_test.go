package server

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// TestControlCharactersRefused: {app: "web\0env\0prod"} hashes like {app:
// web, env: prod} under the identity's encoding; control characters are
// refused in tags at Identify, Decide and Apply, so the two never meet.
func TestControlCharactersRefused(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	honest, forged := tags("app", "web", "env", "prod"), tags("app", "web\x00env\x00prod")

	ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{honest, forged}})
	if err != nil {
		t.Fatal(err)
	}
	if r := ids.GetResults()[0]; r.GetError() != nil || r.GetIdentity() == 0 {
		t.Fatalf("the honest set: %v", r)
	}
	if e := ids.GetResults()[1].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) == 0 ||
		!strings.Contains(e.GetFieldViolations()[0].GetDescription(), "control character") {
		t.Fatalf("the forged set was not refused: %v", ids.GetResults()[1])
	}

	batch, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{
		{Source: forged, Destination: tags("app", "db")}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := batch.GetResults()[0].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) == 0 ||
		!strings.Contains(e.GetFieldViolations()[0].GetDescription(), "control character") {
		t.Errorf("DecideBatch answered the forged set: %v", batch.GetResults()[0])
	}

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Decide source", func() error {
			_, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: forged, Destination: tags("app", "db")})
			return err
		}},
		{"Decide destination key", func() error {
			_, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: honest, Destination: tags("app\x7f", "db")})
			return err
		}},
		{"Apply workload", func() error {
			_, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{{Resource: &verdictv1.Resource_Workload{
				Workload: &verdictv1.Workload{Name: "w", Tags: forged.GetTags()}}}}})
			return err
		}},
		{"Apply policy selector", func() error {
			_, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web\x00env", "db", "ALLOW")}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := wantCode(t, tc.call(), codes.InvalidArgument)
			found := false
			for _, why := range violations(st) {
				found = found || strings.Contains(why, "control character")
			}
			if !found {
				t.Errorf("no violation names the control character: %v", st.Details())
			}
		})
	}
}

const floodPolicies = `
kind: Policy
name: deny-victim
rank: Absolute
sources: [{match: {app: victim}}]
destinations: [{match: {app: db}}]
action: DENY
---
kind: Policy
name: allow-all
sources: [{}]
destinations: [{}]
---
kind: Workload
name: db-1
tags: {app: db}
---
kind: Policy
mesh: other
name: allow-all
sources: [{}]
destinations: [{}]
`

// TestIdentityFloodNeverAllows is the identity flood through the API: the
// victim's registered set is evicted by a flood of Identify calls, a set
// colliding with it is offered, and the victim's Decide by identity and
// DecideCompact answer NOT_FOUND (UNKNOWN_SOURCE), never the colliding set's
// ALLOW where the victim's DENY applies; the victim's Identify again works.
func TestIdentityFloodNeverAllows(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, floodPolicies)...), func(c *Config) {
		c.IdentityMaxSets, c.IdentityMeshMaxSets = 64, 8
	})
	ctx := ctxT(t)
	victim := map[string]string{"app": "victim", "env": "prod"}
	forged := map[string]string{"app": "forged"}
	victimID := resource.Identity("default", victim)
	dbID := resource.Identity("default", map[string]string{"app": "db"})
	h.srv.identities.Identity = func(mesh string, tags resource.Tags) uint64 {
		if resource.SameTagSet(tags, forged) {
			return victimID // SHA-256 prefixes cannot be made to collide: the hook does it
		}
		return resource.Identity(mesh, tags)
	}
	identify := func(eps ...*verdictv1.Endpoint) []*verdictv1.Identified {
		t.Helper()
		resp, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: eps})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetResults()
	}
	compact := func() compactAnswer {
		t.Helper()
		resp, err := h.dec.DecideCompact(ctx, &verdictv1.DecideCompactRequest{
			SourceIds: []uint64{victimID}, DestinationIds: []uint64{dbID}, PortProtocols: []uint32{packPP(resource.TCP, 5432)}})
		if err != nil {
			t.Fatal(err)
		}
		return unpack(t, resp)[0]
	}
	byIdentity := func() (*verdictv1.DecideResponse, error) {
		return h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Identity: victimID},
			Destination: &verdictv1.Endpoint{Identity: dbID}, Protocol: "TCP", Port: 5432})
	}

	if r := identify(&verdictv1.Endpoint{Tags: victim})[0]; r.GetError() != nil || r.GetIdentity() != victimID {
		t.Fatalf("the victim's Identify: %v", r)
	}
	for i := 0; i < 3; i++ {
		if a := compact(); a.action != verdictv1.Action_ACTION_DENY {
			t.Fatalf("the victim before the flood: %+v, want DENY", a)
		}
	}
	if d, err := byIdentity(); err != nil || d.GetAction() != verdictv1.Action_ACTION_DENY {
		t.Fatalf("the victim by identity before the flood: %v %v", d.GetAction(), err)
	}
	var flood []*verdictv1.Endpoint
	for i := 0; i < 100; i++ {
		flood = append(flood, tags("app", fmt.Sprint("flood-", i)))
	}
	identify(flood...)
	if r := identify(&verdictv1.Endpoint{Tags: forged})[0]; r.GetError().GetCode() != "FailedPrecondition" {
		t.Fatalf("the colliding set: %v, want FailedPrecondition", r)
	}
	if a := compact(); a.code != verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE || a.action == verdictv1.Action_ACTION_ALLOW {
		t.Errorf("DecideCompact of the evicted identity: %+v, want UNKNOWN_SOURCE", a)
	}
	if d, err := byIdentity(); status.Code(err) != codes.NotFound {
		t.Errorf("Decide by the evicted identity: %v %v, want NOT_FOUND", d.GetAction(), err)
	}
	if r := identify(&verdictv1.Endpoint{Tags: victim})[0]; r.GetError() != nil || r.GetIdentity() != victimID {
		t.Fatalf("the victim's Identify again: %v", r)
	}
	if a := compact(); a.action != verdictv1.Action_ACTION_DENY {
		t.Errorf("the victim registered again: %+v, want DENY", a)
	}
}

// TestIdentifyLimits: a mesh's flood evicts only its own sets, and one
// caller's new registrations are limited (RESOURCE_EXHAUSTED per endpoint)
// while sets registered already stay free.
func TestIdentifyLimits(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, floodPolicies)...), func(c *Config) {
		c.IdentityMeshMaxSets = 4
		c.IdentifyCallerBurst, c.IdentifyCallerRate = 20, 1e-9 // no refill within the test
	})
	ctx := ctxT(t)
	otherSet, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Mesh: "other", Endpoints: []*verdictv1.Endpoint{tags("app", "kept")}})
	if err != nil || otherSet.GetResults()[0].GetError() != nil {
		t.Fatal(err, otherSet)
	}
	var eps []*verdictv1.Endpoint
	for i := 0; i < 25; i++ {
		eps = append(eps, tags("app", fmt.Sprint(i)))
	}
	resp, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetResults() {
		want := ""
		if i >= 19 { // the bucket held 20: one went to mesh other's set
			want = "ResourceExhausted"
		}
		if got := r.GetError().GetCode(); got != want {
			t.Errorf("endpoint %d: %q, want %q", i, got, want)
		}
	}
	if sets, _ := h.srv.identities.MeshStats("default"); sets != 4 {
		t.Errorf("mesh default holds %d sets, over its quota of 4", sets)
	}
	if _, ok := h.srv.identities.Lookup("other", otherSet.GetResults()[0].GetIdentity()); !ok {
		t.Error("mesh default's registrations evicted mesh other's set")
	}
	again, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Mesh: "other", Endpoints: []*verdictv1.Endpoint{tags("app", "kept")}})
	if err != nil || again.GetResults()[0].GetError() != nil {
		t.Errorf("a set registered already, past the caller's limit: %v %v", again, err)
	}
}

// putStored stores value at path as the store would read it (store.DecodeItem).
func (b *backend) putStored(path, value string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rev++
	it := store.DecodeItem(path, []byte(value), b.rev, b.rev)
	b.items[path] = it
	c := it.Change()
	b.history = append(b.history, store.Event{Revision: b.rev, Changes: []engine.Change{c}})
	b.pending = append(b.pending, c)
	b.publishLocked()
}

// TestStoredNewlyRefusedReported: stored documents an earlier release
// accepted and the stricter checks refuse are reported as such, by Status
// (the invalid resource's error) and by verdict_stored_refused per check.
func TestStoredNewlyRefusedReported(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	b := newBackend(decodeYAML(t, floodPolicies)...)
	h := start(t, b, func(c *Config) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	ctx := ctxT(t)
	b.putStored("default/workloads/forged", `{"kind":"Workload","mesh":"default","name":"forged","tags":{"app":"web\u0000env\u0000prod"}}`)
	b.putStored("default/policies/MeshTrafficPermission/typo", `{"kind":"Policy","mesh":"default","name":"typo",`+
		`"type":"MeshTrafficPermission","targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"conf":{"actoin":"Deny"}}]}`)
	b.putBroken("default/policies/TrafficLog/broken")

	st, err := h.pol.Status(ctx, &verdictv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, inv := range st.GetInvalid() {
		got[inv.GetKey()] = inv.GetError()
	}
	for key, check := range map[string]string{
		"default/workloads/forged":                    resource.StricterControl,
		"default/policies/MeshTrafficPermission/typo": resource.StricterKumaSchema,
	} {
		if why := got[key]; !strings.Contains(why, "newly refused by a stricter check") || !strings.Contains(why, check) {
			t.Errorf("Status: %s: %q, want it newly refused by %q", key, why, check)
		}
	}
	if why := got["default/policies/TrafficLog/broken"]; why == "" || strings.Contains(why, "newly refused") {
		t.Errorf("Status: a value broken before: %q", why)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	refused := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "verdict.stored.refused" {
				for _, dp := range g.DataPoints {
					v, _ := dp.Attributes.Value(attribute.Key("reason"))
					refused[v.AsString()] = dp.Value
				}
			}
		}
	}
	if want := map[string]int64{resource.StricterControl: 1, resource.StricterKumaSchema: 1}; !maps.Equal(refused, want) {
		t.Errorf("verdict_stored_refused %v, want %v", refused, want)
	}
}
