package server

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The metrics name the keys of invalid resources (SPEC section 10), at most
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
