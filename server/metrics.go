package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store/syncer"
)

// metrics are the server's own instruments (gRPC's come from otelgrpc). With
// the Prometheus exporter they read verdict_decisions_total{action},
// verdict_decide_duration_seconds, verdict_snapshot_revision,
// verdict_store_revision, verdict_watch_lag_seconds, verdict_resources_invalid,
// verdict_resource_invalid{key} (1 per invalid key, the first
// MaxInvalidKeyLabels keys by key order), verdict_synced, verdict_stale,
// verdict_watch_dropped_total{rpc}, verdict_policy_conditions{mesh,condition}
// (conditions.go, with WatchConditions), and for an etcd store
// verdict_etcd_db_size_bytes, verdict_etcd_db_size_in_use_bytes,
// verdict_etcd_db_size_quota_bytes, verdict_etcd_oldest_revision,
// verdict_etcd_compactions_total, verdict_etcd_defrags_total,
// verdict_etcd_compactor and verdict_etcd_alarm{alarm}.
type metrics struct {
	// decided (allow, deny) and memo (hit, miss) are what
	// verdict_decisions_total and verdict_decision_memo_lookups_total report
	// when collected: an atomic add per call, where the SDK's Add looked its
	// attribute set up each time (2-3% of verdictd's CPU on the compact
	// stream).
	decided  [2]atomic.Int64
	memo     [2]atomic.Int64
	duration metric.Float64Histogram
	dropped  metric.Int64Counter
}

var (
	actionAllow = metric.WithAttributeSet(attribute.NewSet(attribute.String("action", "ALLOW")))
	actionDeny  = metric.WithAttributeSet(attribute.NewSet(attribute.String("action", "DENY")))
	memoHit     = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "hit")))
	memoMiss    = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "miss")))
)

func newMetrics(mp metric.MeterProvider, sy syncer.API, st Store) (*metrics, error) {
	meter := mp.Meter("github.com/verdictpdp/verdict/server")
	m := &metrics{}
	decisions, err := meter.Int64ObservableCounter("verdict.decisions",
		metric.WithDescription("Flows decided (Decide, DecideBatch, DecideStream, Check, DecideCompact, DecideCompactStream), by final action."))
	if err != nil {
		return nil, err
	}
	memo, err := meter.Int64ObservableCounter("verdict.decision_memo.lookups",
		metric.WithDescription("Compact-path flows (DecideCompact, DecideCompactStream) answered from the decision memo (result hit) "+
			"or by the decision procedure (miss); counted per batch."))
	if err != nil {
		return nil, err
	}
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, n := range [4]int64{m.decided[0].Load(), m.decided[1].Load(), m.memo[0].Load(), m.memo[1].Load()} {
			if n > 0 { // a counter nothing added to is not reported
				o.ObserveInt64([4]metric.Int64Observable{decisions, decisions, memo, memo}[i], n,
					[4]metric.ObserveOption{actionAllow, actionDeny, memoHit, memoMiss}[i])
			}
		}
		return nil
	}, decisions, memo); err != nil {
		return nil, err
	}
	if m.duration, err = meter.Float64Histogram("verdict.decide.duration", metric.WithUnit("s"),
		metric.WithDescription("Time the engine took to decide a flow (every path but the compact one, whose batches the RPC metrics time)."),
		metric.WithExplicitBucketBoundaries(1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2, 0.1)); err != nil {
		return nil, err
	}
	if m.dropped, err = meter.Int64Counter("verdict.watch.dropped",
		metric.WithDescription("Watch streams ended for falling behind (RESOURCE_EXHAUSTED), by RPC.")); err != nil {
		return nil, err
	}
	revision, err := meter.Int64ObservableGauge("verdict.snapshot.revision",
		metric.WithDescription("The store revision the serving snapshot reflects."))
	if err != nil {
		return nil, err
	}
	storeRev, err := meter.Int64ObservableGauge("verdict.store.revision",
		metric.WithDescription("The newest store revision seen."))
	if err != nil {
		return nil, err
	}
	lag, err := meter.Float64ObservableGauge("verdict.watch.lag", metric.WithUnit("s"),
		metric.WithDescription("Time since the store's watch last said anything (event or progress)."))
	if err != nil {
		return nil, err
	}
	invalid, err := meter.Int64ObservableGauge("verdict.resources.invalid",
		metric.WithDescription("Stored resources not in use: broken values and conflicts."))
	if err != nil {
		return nil, err
	}
	invalidKey, err := meter.Int64ObservableGauge("verdict.resource.invalid",
		metric.WithDescription(fmt.Sprintf("1 for each stored resource not in use, by key (at most %d keys, in key order; "+
			"verdict_resources_invalid counts them all).", MaxInvalidKeyLabels)))
	if err != nil {
		return nil, err
	}
	refused, err := meter.Int64ObservableGauge("verdict.stored.refused",
		metric.WithDescription("Stored documents an earlier release accepted that this one refuses, by the stricter check "+
			"they fail (reason); each fails closed as an invalid resource (docs/storage.md)."))
	if err != nil {
		return nil, err
	}
	synced, err := meter.Int64ObservableGauge("verdict.synced",
		metric.WithDescription("1 once the first full list of the store has been applied."))
	if err != nil {
		return nil, err
	}
	stale, err := meter.Int64ObservableGauge("verdict.stale",
		metric.WithDescription("1 while the watch is not known current (the last snapshot keeps serving)."))
	if err != nil {
		return nil, err
	}
	if sr, ok := st.(storageReporter); ok {
		if err := storageMetrics(meter, sr); err != nil {
			return nil, err
		}
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := sy.Status()
		o.ObserveInt64(revision, s.Revision)
		o.ObserveInt64(storeRev, st.Health().Revision)
		if !s.LastEventAt.IsZero() {
			o.ObserveFloat64(lag, time.Since(s.LastEventAt).Seconds())
		}
		o.ObserveInt64(invalid, int64(s.Invalid))
		if s.Invalid > 0 {
			snap := sy.Snapshot()
			for _, k := range invalidKeys(snap, MaxInvalidKeyLabels) {
				o.ObserveInt64(invalidKey, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("key", k))))
			}
			for reason, n := range newlyRefused(snap) {
				o.ObserveInt64(refused, n, metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason))))
			}
		}
		o.ObserveInt64(synced, b2i(s.Synced))
		o.ObserveInt64(stale, b2i(s.Stale))
		return nil
	}, revision, storeRev, lag, invalid, invalidKey, refused, synced, stale)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// MaxInvalidKeyLabels bounds the keys verdict_resource_invalid names, so a
// store full of broken values cannot grow the metrics without bound.
const MaxInvalidKeyLabels = 100

// invalidKeys is the first limit keys of the snapshot's invalid resources, in
// key order.
func invalidKeys(snap *engine.Snapshot, limit int) []string {
	if snap == nil {
		return nil
	}
	inv := snap.Invalid()
	keys := make([]string, 0, len(inv))
	for _, r := range inv {
		keys = append(keys, engine.RenderPath(r.Path))
	}
	sort.Strings(keys)
	if len(keys) > limit {
		keys = keys[:limit]
	}
	return keys
}

// newlyRefused counts the snapshot's invalid resources that only this
// release's stricter checks refuse, by check (resource.StricterError).
func newlyRefused(snap *engine.Snapshot) map[string]int64 {
	var out map[string]int64
	if snap == nil {
		return nil
	}
	for _, r := range snap.Invalid() {
		var se *resource.StricterError
		if r.Err == nil || !errors.As(r.Err, &se) {
			continue
		}
		if out == nil {
			out = map[string]int64{}
		}
		for _, c := range se.Checks {
			out[c]++
		}
	}
	return out
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// decidedN counts a call's decisions by final action (their durations are
// recorded one by one, by the recorder).
func (m *metrics) decidedN(allow, deny int64) {
	m.decided[0].Add(allow)
	m.decided[1].Add(deny)
}

// memoN counts a batch's memo hits and misses (the compact path: a batch's
// counts are added once, not per flow).
func (m *metrics) memoN(hits, misses int64) {
	m.memo[0].Add(hits)
	m.memo[1].Add(misses)
}

var watchResourcesRPC = metric.WithAttributeSet(attribute.NewSet(attribute.String("rpc", "WatchResources")))

// watchDropped counts a WatchResources stream ended for falling behind.
func (m *metrics) watchDropped(ctx context.Context) {
	m.dropped.Add(ctx, 1, watchResourcesRPC)
}

var watchRulesRPC = metric.WithAttributeSet(attribute.NewSet(attribute.String("rpc", "WatchRules")))

// rulesDropped counts a WatchRules stream dropped for not reading.
func (m *metrics) rulesDropped(ctx context.Context) {
	m.dropped.Add(ctx, 1, watchRulesRPC)
}

// storageMetrics observes an etcd store's storage (docs/storage.md,
// "Retention"): database sizes, the oldest revision held, this replica's
// compactions and defragmentations, whether it is the compactor, and etcd's
// alarms (1 per raised alarm).
func storageMetrics(meter metric.Meter, sr storageReporter) error {
	gauge := func(name, unit, desc string) (metric.Int64ObservableGauge, error) {
		return meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	}
	counter := func(name, desc string) (metric.Int64ObservableCounter, error) {
		return meter.Int64ObservableCounter(name, metric.WithDescription(desc))
	}
	size, err := gauge("verdict.etcd.db_size", "By", "Size of etcd's database file (the largest member's).")
	if err != nil {
		return err
	}
	inUse, err := gauge("verdict.etcd.db_size_in_use", "By", "Part of etcd's database file holding data; the rest is free pages a defragmentation gives back.")
	if err != nil {
		return err
	}
	quota, err := gauge("verdict.etcd.db_size_quota", "By", "etcd's database quota: beyond it etcd raises NOSPACE and refuses every write.")
	if err != nil {
		return err
	}
	oldest, err := gauge("verdict.etcd.oldest_revision", "", "The revision etcd is compacted to: revisions from it on are held.")
	if err != nil {
		return err
	}
	compactor, err := gauge("verdict.etcd.compactor", "", "1 on the replica that compacts etcd.")
	if err != nil {
		return err
	}
	alarm, err := gauge("verdict.etcd.alarm", "", "1 per alarm etcd raised (NOSPACE: every write refused), by alarm and member.")
	if err != nil {
		return err
	}
	compactions, err := counter("verdict.etcd.compactions", "Compactions of etcd this replica made.")
	if err != nil {
		return err
	}
	defrags, err := counter("verdict.etcd.defrags", "Defragmentations of etcd members this replica made.")
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := sr.Storage()
		if s.DBSize > 0 {
			o.ObserveInt64(size, s.DBSize)
			o.ObserveInt64(inUse, s.DBSizeInUse)
		}
		if s.DBSizeQuota > 0 {
			o.ObserveInt64(quota, s.DBSizeQuota)
		}
		o.ObserveInt64(oldest, s.OldestRevision)
		o.ObserveInt64(compactor, b2i(s.Compactor))
		for _, a := range s.Alarms {
			o.ObserveInt64(alarm, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("alarm", a))))
		}
		o.ObserveInt64(compactions, s.Compactions)
		o.ObserveInt64(defrags, s.Defrags)
		return nil
	}, size, inUse, quota, oldest, compactor, alarm, compactions, defrags)
	return err
}
