package server

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// lockdownDB denies everything to db, absolutely: it shadows deny-db.
func lockdownDB() *verdictv1.Resource {
	return policyRes(&verdictv1.Policy{Name: "lockdown-db", Rank: "Absolute", Action: "DENY",
		Sources:      []*verdictv1.Selector{{}},
		Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "db"}}}})
}

func condNames(sr *verdictv1.StoredResource) string { return strings.Join(sr.GetConditions(), ",") }

// Get, List and Status show each policy's standing conditions, and a write
// moves them.
func TestPolicyConditions(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	const denyDB = "default/policies/TrafficPermission/deny-db"
	get := func(rev int64) *verdictv1.StoredResource {
		t.Helper()
		r, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: denyDB, MinRevision: rev, Conditions: true})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetResource()
	}
	if got := condNames(get(0)); got != "Accepted,Enforced" {
		t.Fatalf("before: %s", got)
	}
	w, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{lockdownDB()}})
	if err != nil {
		t.Fatal(err)
	}
	sr := get(w.GetRevision())
	if got := condNames(sr); got != "Accepted,Shadowed" || !strings.Contains(sr.GetConditionMessages()["Shadowed"], "lockdown-db") {
		t.Fatalf("after the lockdown: %s %v", got, sr.GetConditionMessages())
	}
	l, err := h.pol.List(ctx, &verdictv1.ListRequest{Prefix: "default/policies/TrafficPermission/", MinRevision: w.GetRevision(), Conditions: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{denyDB: "Accepted,Shadowed", "default/policies/TrafficPermission/lockdown-db": "Accepted,Enforced",
		"default/policies/TrafficPermission/web-to-backend": "Accepted,Enforced"}
	for _, r := range l.GetResources() {
		if got := condNames(r); got != want[r.GetKey()] {
			t.Errorf("list %s: %s, want %s", r.GetKey(), got, want[r.GetKey()])
		}
	}
	st, err := h.pol.Status(ctx, &verdictv1.StatusRequest{MinRevision: w.GetRevision(), Conditions: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(st.GetConditions(), func(c *verdictv1.ConditionCount) bool {
		return c.GetMesh() == "default" && c.GetCondition() == "Shadowed" && c.GetPolicies() == 1
	}) {
		t.Fatalf("status counts: %v", st.GetConditions())
	}
	// A mesh is not a policy: no conditions; a read that does not ask gets
	// none, nor does the status.
	if r, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/mesh", Conditions: true}); err != nil || len(r.GetResource().GetConditions()) != 0 {
		t.Fatalf("mesh: %v %v", r, err)
	}
	if r, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: denyDB}); err != nil || len(r.GetResource().GetConditions()) != 0 {
		t.Fatalf("a get that does not ask: %v %v", r, err)
	}
	if st, err := h.pol.Status(ctx, &verdictv1.StatusRequest{}); err != nil || len(st.GetConditions()) != 0 {
		t.Fatalf("a status that does not ask: %v %v", st, err)
	}
}

// WatchResources shows the conditions at each event's revision, and lists
// a policy whose conditions another's change moved as conditions_only.
func TestWatchConditions(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.WatchConditions = true })
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	s, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{Prefix: "default/policies/TrafficPermission/"})
	if err != nil {
		t.Fatal(err)
	}
	first := recvN(t, s, 2)
	for _, c := range first[0].GetChanges() {
		if got := condNames(c.GetResource()); got != "Accepted,Enforced" {
			t.Fatalf("snapshot %s: %s", c.GetKey(), got)
		}
	}
	if _, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{lockdownDB()}}); err != nil {
		t.Fatal(err)
	}
	ch := recvN(t, s, 1)[0]
	got := map[string]string{}
	for _, c := range ch.GetChanges() {
		got[c.GetKey()] = condNames(c.GetResource())
		if c.GetConditionsOnly() {
			got[c.GetKey()] += " (conditions only)"
		}
	}
	want := map[string]string{"default/policies/TrafficPermission/lockdown-db": "Accepted,Enforced",
		"default/policies/TrafficPermission/deny-db": "Accepted,Shadowed (conditions only)"}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("changes %v, want %v", got, want)
		}
	}
}

// verdict_policy_conditions counts the policies per mesh and condition
// (with WatchConditions), and follows a write.
func TestConditionMetric(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) {
		c.WatchConditions = true
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	ctx := ctxT(t)
	collect := func() map[string]int64 {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				g, ok := m.Data.(metricdata.Gauge[int64])
				if !ok || m.Name != "verdict.policy.conditions" {
					continue
				}
				for _, dp := range g.DataPoints {
					mesh, _ := dp.Attributes.Value(attribute.Key("mesh"))
					cond, _ := dp.Attributes.Value(attribute.Key("condition"))
					out[mesh.AsString()+"/"+cond.AsString()] = dp.Value
				}
			}
		}
		return out
	}
	if got := collect(); got["default/Enforced"] != 3 || got["default/Shadowed"] != 0 || got["prod/Accepted"] != 1 {
		t.Fatalf("before: %v", got)
	}
	w, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{lockdownDB()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.pol.Status(ctx, &verdictv1.StatusRequest{MinRevision: w.GetRevision()}); err != nil {
		t.Fatal(err)
	}
	if got := collect(); got["default/Shadowed"] != 1 || got["default/Accepted"] != 4 {
		t.Fatalf("after the lockdown: %v", got)
	}
}
