package server

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The metrics name the keys of invalid resources (docs/storage.md), at most
// MaxInvalidKeyLabels of them, in key order, while the count covers them all.
func TestMetricsNameInvalidKeys(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	b := newBackend(decodeYAML(t, "kind: Mesh\nname: default\n")...)
	h := start(t, b, func(c *Config) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	defer h.stop()

	collect := func() (count int64, keys []string) {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				g, ok := m.Data.(metricdata.Gauge[int64])
				if !ok {
					continue
				}
				for _, dp := range g.DataPoints {
					switch m.Name {
					case "verdict.resources.invalid":
						count = dp.Value
					case "verdict.resource.invalid":
						v, _ := dp.Attributes.Value(attribute.Key("key"))
						keys = append(keys, v.AsString())
					}
				}
			}
		}
		slices.Sort(keys)
		return count, keys
	}

	if n, keys := collect(); n != 0 || len(keys) != 0 {
		t.Fatalf("before any invalid value: count %d, keys %v", n, keys)
	}
	b.putBroken("default/policies/TrafficPermission/broken")
	if n, keys := collect(); n != 1 || !slices.Equal(keys, []string{"default/policies/TrafficPermission/broken"}) {
		t.Fatalf("one invalid value: count %d, keys %v", n, keys)
	}
	for i := range MaxInvalidKeyLabels + 5 {
		b.putBroken(fmt.Sprintf("default/policies/TrafficPermission/x%03d", i))
	}
	n, keys := collect()
	if n != MaxInvalidKeyLabels+6 || len(keys) != MaxInvalidKeyLabels {
		t.Fatalf("over the label bound: count %d, %d keys", n, len(keys))
	}
	if keys[0] != "default/policies/TrafficPermission/broken" || keys[len(keys)-1] != fmt.Sprintf("default/policies/TrafficPermission/x%03d", MaxInvalidKeyLabels-2) {
		t.Errorf("keys are not the first %d in key order: %s … %s", MaxInvalidKeyLabels, keys[0], keys[len(keys)-1])
	}
}

// collectInt64Sums returns every int64 sum data point of the named metric,
// by the value of attribute key.
func collectInt64Sums(t *testing.T, reader sdkmetric.Reader, name, key string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			s, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is a %T, not an int64 sum", name, m.Data)
			}
			for _, dp := range s.DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key(key))
				out[v.AsString()] += dp.Value
			}
		}
	}
	return out
}

// The compact path counts its memo hits and misses (issue 13: the memo
// survives workload churn): a batch's first sight is all misses, a warm
// batch all hits, and a workload put changes nothing of that.
func TestCompactMemoCounter(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	set := policygen.Generate(policygen.Config{Seed: 5, Policies: 200})
	be := newBackend()
	applyAll(t, be, set.Resources)
	h := start(t, be, func(c *Config) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	defer h.stop()
	ctx := ctxT(t)

	req := &verdictv1.DecideCompactRequest{}
	seen := map[[3]uint64]bool{}
	for _, f := range set.Flows(5, 300) {
		src, dst := resource.Identity("default", f.Source), resource.Identity("default", f.Destination)
		pp := f.Port | uint32(f.Protocol)<<16
		if seen[[3]uint64{src, dst, uint64(pp)}] {
			continue // distinct flows: each batch's counts are exact
		}
		seen[[3]uint64{src, dst, uint64(pp)}] = true
		if _, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{{Tags: f.Source}, {Tags: f.Destination}}}); err != nil {
			t.Fatal(err)
		}
		req.SourceIds = append(req.SourceIds, src)
		req.DestinationIds = append(req.DestinationIds, dst)
		req.PortProtocols = append(req.PortProtocols, pp)
	}
	n := int64(len(req.SourceIds))
	var last map[string]int64
	batch := func(what string, hits, misses int64) {
		t.Helper()
		resp, err := h.dec.DecideCompact(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range unpack(t, resp) {
			if a.code != 0 {
				t.Fatalf("%s: flow %d answered %v", what, i, a.code)
			}
		}
		got := collectInt64Sums(t, reader, "verdict.decision_memo.lookups", "result")
		if d := (map[string]int64{"hit": got["hit"] - last["hit"], "miss": got["miss"] - last["miss"]}); d["hit"] != hits || d["miss"] != misses {
			t.Fatalf("%s: %d hits and %d misses counted, want %d and %d", what, d["hit"], d["miss"], hits, misses)
		}
		last = got
	}
	batch("first sight", 0, n)
	batch("second sight (stored now)", 0, n)
	batch("warm", n, 0)
	resp0rev := be.Snapshot().Revision()
	applyAll(t, be, []resource.Resource{&resource.Workload{Mesh: "default", Name: "churn", Tags: resource.Tags{"app": "churn"},
		Addresses: []string{"10.9.9.9"}}})
	if rev := be.Snapshot().Revision(); rev <= resp0rev {
		t.Fatalf("the workload put is not in the snapshot (revision %d)", rev)
	}
	batch("after a workload put", n, 0)
	if got := collectInt64Sums(t, reader, "verdict.decisions", "action"); got["ALLOW"]+got["DENY"] != 4*n {
		t.Fatalf("verdict.decisions %v, want %d in all", got, 4*n)
	}
}

// The counts by deciding policy add up to the flows decided, name the first
// maxPolicyLabels policies and count the rest as "other".
func TestPolicyCountsBoundLabels(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	p, err := newPolicyCounts(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range maxPolicyLabels + 10 {
		p.addN(ctx, fmt.Sprintf("p%03d", i), false, 2)
		p.addN(ctx, fmt.Sprintf("p%03d", i), true, 1)
	}
	p.addN(ctx, "p000", true, 1)
	got := collectInt64Sums(t, reader, "verdict.decisions.by_policy", "policy")
	if len(got) != maxPolicyLabels+1 {
		t.Errorf("%d policy labels, want %d and other", len(got), maxPolicyLabels)
	}
	if got["p000"] != 4 || got["p255"] != 3 || got["other"] != 30 {
		t.Errorf("p000 %d (want 4), p255 %d (want 3), other %d (want 30)", got["p000"], got["p255"], got["other"])
	}
	deny := 0
	for a, v := range collectInt64Sums(t, reader, "verdict.decisions.by_policy", "action") {
		if a == "DENY" {
			deny = int(v)
		}
	}
	if deny != maxPolicyLabels+10+1 {
		t.Errorf("%d DENY counted, want %d", deny, maxPolicyLabels+11)
	}
}
