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
