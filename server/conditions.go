package server

// The standing conditions of policies (docs/lint.md, "Standing
// conditions") in Get, List and Status, and their metric. The tracker that
// judges them is the server's one (Server.conds), shared with the watch
// feed; judging runs on the first ask for a snapshot, never on the decision
// path.

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/syncer"
)

// MaxConditionMeshLabels bounds the meshes verdict_policy_conditions names
// (the first by name); the conditions are a fixed set, so the metric has
// at most this many times eight series.
const MaxConditionMeshLabels = 100

// withConditions writes the conditions of the policies of a page read from
// snap; none for a read of the past (past: at_revision or at_time).
func withConditions(tr *conditions.Tracker, snap *engine.Snapshot, past bool, page []*verdictv1.StoredResource) {
	if tr == nil || past {
		return
	}
	for _, sr := range page {
		k, err := parseKey(sr.GetKey())
		if err != nil {
			continue
		}
		if e, ok := snap.Get(k); ok {
			apiconv.PolicyConditions(tr, snap, sr, e.Resource)
		}
	}
}

// registerConditionMetrics observes verdict_policy_conditions{mesh,
// condition}: how many policies of the serving snapshot hold each
// condition (with Config.WatchConditions, whose feed keeps the judgements
// current, so a scrape mostly reads them).
func registerConditionMetrics(meter metric.Meter, sy syncer.API, tr *conditions.Tracker) error {
	g, err := meter.Int64ObservableGauge("verdict.policy.conditions",
		metric.WithDescription("Policies of the serving snapshot holding each standing condition (docs/lint.md), per mesh "+
			"(the first 100 meshes by name); a condition no policy of a mesh holds is not observed."))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		snap := sy.Snapshot()
		if snap == nil {
			return nil
		}
		meshes := map[string]bool{}
		for _, c := range tr.Counts(snap) {
			if !meshes[c.Mesh] && len(meshes) >= MaxConditionMeshLabels {
				continue
			}
			meshes[c.Mesh] = true
			o.ObserveInt64(g, int64(c.Policies), metric.WithAttributeSet(attribute.NewSet(
				attribute.String("mesh", c.Mesh), attribute.String("condition", c.Kind.String()))))
		}
		return nil
	}, g)
	return err
}
