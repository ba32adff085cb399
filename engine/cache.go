package engine

import (
	"github.com/verdictpdp/verdict/engine/internal/memo"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The decision cache (the memo) is engine/internal/memo's, keyed and
// verified by the whole flow; these are its instances for Decision answers.
type (
	decisionCache = memo.Cache[Decision]
	memoKey       = memo.Key[Decision]
	memoEpoch     = memo.Epoch[Decision]
	memoHolder    = memo.Holder[Decision]
	cacheEntry    = memo.Entry[Decision]
	pairMemo      = memo.Pairs[Decision]
)

// flowHashOf is the hash a flow is remembered by, from its tag sets' hashes.
func flowHashOf(mesh, typ string, src, dst uint64, proto resource.Protocol, port uint32) uint64 {
	return memo.FlowHashOf(mesh, typ, src, dst, proto, port)
}

// cache returns the memo of the snapshot's lineage, creating it on first use.
func (s *Snapshot) cache() *decisionCache { return s.memo.Get() }

// Memo is a decision memo that a lineage of snapshots may share instead of
// the one it was built with (WithMemo). The zero value is ready.
type Memo struct{ h memoHolder }

// PastMemo returns a memo for snapshots read at past revisions, which a
// caller asks in any order of revisions: its entries are keyed by their
// partition's epoch as well as by flow, so one flow's answers at several
// revisions stay side by side instead of each evicting the other
// (engine/internal/memo, "keyed by epoch").
func PastMemo() *Memo {
	m := &Memo{}
	m.h.KeyByEpoch()
	return m
}

// WithMemo returns s answering from m's memo: the snapshots Apply derives
// from it share m too. Snapshots read at past revisions take one memo of
// their own, so that their answers never evict the current lineage's;
// entries stay verified by their partitions' epochs, so a shared memo never
// answers for another snapshot's policies.
func (s *Snapshot) WithMemo(m *Memo) *Snapshot {
	return &Snapshot{revision: s.revision, meshes: s.meshes, broken: s.broken, taints: s.taints, count: s.count, memo: &m.h,
		lineage: &lineage{}}
}
