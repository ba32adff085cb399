package engine

import (
	"reflect"

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
//
// A flow's entries of several epochs share one answer when their answers are
// equal (sameAnswer): a flow asked at a thousand revisions that all answer it
// alike reads a thousand small entries and one answer.
func PastMemo() *Memo {
	m := &Memo{}
	m.h.KeyByEpoch(sameAnswer)
	return m
}

// sameAnswer reports whether two memo answers are equal in everything a hit
// hands out but the revision, which the asking snapshot sets. Confs are equal
// when they are the same map: snapshots that share a rule share its conf, and
// two equal confs of distinct rules only miss a sharing. Memo answers carry
// no explanation and no resolutions; one that did is never shared.
func sameAnswer(a, b *Decision) bool {
	return a.Action == b.Action && a.Policy == b.Policy && sameConf(a.Conf, b.Conf) &&
		sameSide(&a.Outbound, &b.Outbound) && sameSide(&a.Inbound, &b.Inbound) &&
		a.Explain == nil && b.Explain == nil &&
		a.SourceResolution.Form == 0 && b.SourceResolution.Form == 0 &&
		a.DestinationResolution.Form == 0 && b.DestinationResolution.Form == 0 &&
		(a.Audit == b.Audit || a.Audit != nil && b.Audit != nil && *a.Audit == *b.Audit)
}

func sameSide(a, b *SideDecision) bool {
	return a.Action == b.Action && a.Policy == b.Policy && a.Scope == b.Scope && a.Rule == b.Rule &&
		a.Reason == b.Reason && sameConf(a.Conf, b.Conf)
}

// sameConf reports whether two confs are the same map (or both nil).
func sameConf(a, b resource.Object) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
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
