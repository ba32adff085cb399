package history_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/history"
)

// loaded is a store holding a generated set of n policies, then 1,000
// single-policy changes; it returns the store, the revision of the full set
// and the snapshot at the end.
func loaded(b *testing.B, n int) (st store.History, base int64, current *engine.Snapshot, set *policygen.Set) {
	b.Helper()
	s := newStore(b)
	set = policygen.Generate(policygen.Config{Seed: 1, Policies: n, Scopes: 50})
	ctx := context.Background()
	for i := 0; i < len(set.Resources); i += store.MaxOps {
		var ops []store.Op
		for _, r := range set.Resources[i:min(i+store.MaxOps, len(set.Resources))] {
			ops = append(ops, store.Op{Resource: r})
		}
		rev, err := s.Apply(ctx, ops)
		if err != nil {
			b.Fatal(err)
		}
		base = rev
	}
	pols := set.Policies()
	var last int64
	for i := range 1000 {
		p := *pols[i%len(pols)]
		p.Priority = int32(i % 7)
		rev, err := s.Apply(ctx, []store.Op{{Resource: &p}})
		if err != nil {
			b.Fatal(err)
		}
		last = rev
	}
	changes, err := s.StateAt(ctx, last, "")
	if err != nil {
		b.Fatal(err)
	}
	return s, base, engine.Empty().Apply(last, changes), set
}

// BenchmarkPastSnapshot: an uncached snapshot of 10k policies (50 scopes)
// ready: built whole from a read at its revision, and built from the
// current one and the changes between (100 and 1,000 revisions back).
// Target: ≤ 1 s.
func BenchmarkPastSnapshot(b *testing.B) {
	st, base, current, _ := loaded(b, 10_000)
	for _, back := range []int64{100, 1000} {
		b.Run(fmt.Sprintf("delta/revisions-back=%d", back), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				snaps, err := history.New(history.Config{Store: st, Current: func() *engine.Snapshot { return current }})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := snaps.At(context.Background(), current.Revision()-back); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			snaps, err := history.New(history.Config{Store: st, Current: func() *engine.Snapshot { return current }, MaxDelta: 1})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := snaps.At(context.Background(), base); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecideCachedPast: a decision at any of the last 1,000 revisions
// with its snapshot cached, against a decision on the current snapshot, on
// 10k policies: the lookup of the cached snapshot plus the decision. Target:
// ≤ 2× the current one.
func BenchmarkDecideCachedPast(b *testing.B) {
	st, _, current, set := loaded(b, 10_000)
	snaps, err := history.New(history.Config{Store: st, Current: func() *engine.Snapshot { return current }})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := range int64(1000) {
		if _, err := snaps.At(ctx, current.Revision()-i); err != nil {
			b.Fatal(err)
		}
	}
	pols := set.Policies()
	flows := make([]engine.Request, 64)
	for i := range flows {
		p := pols[(i*37)%len(pols)]
		flows[i] = engine.Request{Source: resource.Tags(p.Sources[0].Match), Destination: resource.Tags(p.Destinations[0].Match)}
	}
	b.Run("current", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := current.Decide(&flows[i%len(flows)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	// A client asking about one past revision: each call looks its
	// snapshot up in the cache and decides there.
	for _, back := range []int64{1, 500, 999} {
		b.Run(fmt.Sprintf("past/cached/revisions-back=%d", back), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				snap, err := snaps.At(ctx, current.Revision()-back)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := snap.Decide(&flows[i%len(flows)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
	// The worst case: every call at another of the 1,000 revisions, whose
	// snapshots share the memo and not the CPU caches.
	b.Run("past/cached/every-call-another", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			snap, err := snaps.At(ctx, current.Revision()-int64(i%1000))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := snap.Decide(&flows[i%len(flows)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
