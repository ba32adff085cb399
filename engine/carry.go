package engine

// Values carried along a lineage of snapshots: what a caller computes from
// one snapshot (Attached) that the next snapshots may start from instead of
// computing it whole — engine/analysis's tag classes, which one policy change
// rarely moves. The engine keeps, per key, the newest value built by a
// snapshot of the lineage; it never judges a value: the caller's build
// checks what changed between the snapshot the value came from and its own.

import "sync"

// lineage holds the newest carried value per key of the snapshots Apply
// derives from one another. A preview's lineage reads its parent's and
// writes its own, so a change never applied does not become the base of
// the snapshots that are.
type lineage struct {
	parent *lineage
	mu     sync.Mutex
	vals   map[any]carried
}

type carried struct {
	revision int64
	v        any
}

func (l *lineage) get(key any) any {
	for ; l != nil; l = l.parent {
		l.mu.Lock()
		c, ok := l.vals[key]
		l.mu.Unlock()
		if ok {
			return c.v
		}
	}
	return nil
}

func (l *lineage) put(key any, revision int64, v any) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.vals[key]; ok && c.revision > revision {
		return
	}
	if l.vals == nil {
		l.vals = map[any]carried{}
	}
	l.vals[key] = carried{revision: revision, v: v}
}

// Carried is Attached for a value the snapshot's lineage carries: build
// receives the newest value built under key by a snapshot of the lineage
// (those Apply derived this one from, or derived from it; nil when none
// did), from which it may start, and returns this snapshot's. The value
// handed over is another revision's: build must check what changed since
// (Partition.PolicySet, the inventory, the scopes). A lineage keeps one
// value per key; a snapshot built by Build, Empty or WithMemo starts a
// lineage, and a Preview reads its parent's without writing to it.
func (s *Snapshot) Carried(key any, build func(prev any) any) any {
	return s.Attached(key, func() any {
		v := build(s.lineage.get(key))
		s.lineage.put(key, s.revision, v)
		return v
	})
}

// Carries reports whether the snapshot's lineage holds a value under key
// (one Carried built, here or in a snapshot of the lineage).
func (s *Snapshot) Carries(key any) bool { return s.lineage.get(key) != nil }
