package engine

import "github.com/verdictpdp/verdict/engine/internal/pmap"

// PolicySet is the compiled policies of one partition, held apart from its
// snapshot: a caller that keeps what it computed from one version of a
// partition keeps this to find, on the next version, the policies that
// changed (Changed), without keeping the snapshot alive.
type PolicySet struct {
	m  pmap.Map[string, *compiledPolicy]
	ok bool
}

// PolicySet returns the partition's compiled policies.
func (p *Partition) PolicySet() PolicySet {
	if p.ts == nil {
		return PolicySet{}
	}
	return PolicySet{m: p.ts.policies, ok: true}
}

// Changed reports the names of the policies that differ between prev and
// ps (two versions of one partition): added, removed, or compiled anew.
// Versions Apply derives from one another share every untouched policy, so
// the answer costs O(change), not O(policies). ok is false when either
// holds no policy: the caller compares them whole. A name may be reported
// more than once, or when only a neighbour of it in the map changed; a
// changed one is never left out.
func (ps PolicySet) Changed(prev PolicySet) (names []string, ok bool) {
	if !ps.ok || !prev.ok {
		return nil, false
	}
	pmap.Diff(prev.m, ps.m, func(a, b *compiledPolicy) bool { return a == b },
		func(name string) { names = append(names, name) })
	return names, true
}

// Policy returns the policy of the set named name, valid or not, as
// Partition.Policy does on the partition the set was taken from.
func (ps PolicySet) Policy(name string) (PolicyView, bool) {
	if !ps.ok {
		return PolicyView{}, false
	}
	cp, ok := ps.m.Get(name)
	if !ok {
		return PolicyView{}, false
	}
	return viewOf(cp), true
}
