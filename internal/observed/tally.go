package observed

import (
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The compact path's flows answered by the pair memo are counted where the
// decision already reads: in the memo's entry (Counter), one atomic add per
// decision and no line of the table touched. A batch registers an entry with
// its stripe only on the entry's first count since it was last taken (the
// entry's Seen says so); every flush takes the registered entries' counts
// into the table. An entry is registered again after each take, so no count
// is lost to a take that raced an add, and the list holds each entry once.
//
// What is given up: such a flow is timed at the first decision of each flush
// interval (its first and last sight, and the revision of its answer, are
// those of that decision), not at each decision (docs/analysis.md).

// Counter is a decision memo's entry that counts its flow's decisions
// (engine.PairEntry): Take returns the count since the last Take and zeroes it.
type Counter interface{ Take() uint32 }

// TallyFlow is a flow of a batch whose entry c has just counted its first
// decision since the last take: its tag sets, protocol and port (the compact
// path's packing) and answer (the index of its deciding policy in the
// batch's, and whether it is a DENY).
type TallyFlow struct {
	C        Counter
	Src, Dst *inventory.TagSet
	PP       uint32
	Policy   uint32
	Deny     bool
}

// tallied is a registered entry with what its counts are added as.
type tallied struct {
	c          Counter
	src, dst   *inventory.TagSet
	mt, pp     uint32
	action     resource.Action
	policy     string
	first, rev int64
}

// maxTallied bounds a stripe's registered entries: a batch that finds its
// stripe's list full takes it into the table first.
const maxTallied = 1 << 15

// TallyN registers the flows fs, decided at revision rev by policies.
func (b *Batch) TallyN(fs []TallyFlow, policies []string, rev int64) {
	for i := range fs {
		if len(b.s.tallied) == maxTallied {
			b.t.take(b.s.tallied)
			clear(b.s.tallied)
			b.s.tallied = b.s.tallied[:0]
		}
		f := &fs[i]
		b.s.tallied = append(b.s.tallied, tallied{c: f.C, src: f.Src, dst: f.Dst, mt: b.mt, pp: f.PP, action: finalAction(f.Deny),
			policy: policies[f.Policy], first: b.now, rev: rev})
	}
}

// takeTallied takes every stripe's registered entries into the table.
func (t *Table) takeTallied() {
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		list := s.tallied
		s.tallied, s.spare = s.spare[:0], nil
		s.mu.Unlock()
		t.take(list)
		clear(list)
		s.mu.Lock()
		if s.spare == nil {
			s.spare = list[:0]
		}
		s.mu.Unlock()
	}
}

// take adds the counts of the entries of list to the table.
func (t *Table) take(list []tallied) {
	for i := range list {
		e := &list[i]
		n := e.c.Take()
		if n == 0 {
			continue
		}
		src, dst := identityEnd(e.src), identityEnd(e.dst)
		t.add(e.mt, &src, &dst, e.pp, uint64(n), e.first, e.first, e.action, e.policy, e.rev)
	}
}
