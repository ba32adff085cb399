package index

import (
	"sort"

	"github.com/verdictpdp/verdict/engine/internal/pmap"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The destination index of a PerDestination type (the engine's select: PerDestination): the inbound
// side's choice — the policy most specific by its destination selector alone —
// as a single-end query, the k-index idea of the rule index on one end. Every valid
// policy of such a type has claims, one per destination selector (S&D) or one
// for its targetRef when it has from items. A claim is filed in one list,
// under one term its selector requires (an exact tag, else the presence of a
// key, else the always list; among several, the one whose list is shortest),
// and lists are sorted by the choice's own order (Claim.less: rank total
// desc, exact desc, the mesh's tie-break, the name). A probe reads the
// lists of the destination's tags and stops in each at the first claim that
// matches and is attached (the destination a member of the policy's scope),
// or as soon as the list's claims come after the best one found. Lists are
// immutable slices in a persistent map: an update copies the lists it touches
// and the map paths above them, O(change); readers take no lock. A claim is
// 40 bytes, held in its list; claims are computed from the compiled policy
// when it enters or leaves, so the policy stores nothing for them.

// Claim is a policy's claim on the inbounds its destination selector matches.
type Claim[P comparable] struct {
	Total, Exact int16 // the selector's rank (targetRef: the level, exact 0)
	Item         int32 // the claim's place among its policy's claims
	Tb1, Tb2     int64 // the mesh's tie-break
	Scope        int32 // the position of the policy's scope: the destination must be a member
	Name         string
	Policy       P // the policy the claim chooses
	Dst          *Matcher
}

// less is the choice's order: more specific first, then the tie-break, then
// the name; item keeps a policy's claims apart.
func (a *Claim[P]) less(b *Claim[P]) bool {
	if c := RankCmp(a.Total, a.Exact, a.Tb1, a.Tb2, b.Total, b.Exact, b.Tb1, b.Tb2); c != 0 {
		return c < 0
	}
	if a.Name != b.Name {
		return a.Name < b.Name
	}
	return a.Item < b.Item
}

func (a *Claim[P]) same(b *Claim[P]) bool { return a.Policy == b.Policy && a.Item == b.Item }

// claimTerm is a term a claim can be filed under: (key, value), or the
// presence of key; the zero term is the always list.
type claimTerm struct {
	key, value string
	presence   bool
}

func claimTermHash(t claimTerm) uint64 {
	h := pmap.StringHash(t.key) ^ pmap.StringHash(t.value)*0x9E3779B97F4A7C15
	if t.presence {
		h ^= 0xA5A5A5A5A5A5A5A5
	}
	return h
}

type claimList[P comparable] []Claim[P]

// claimIndex is one view's claims.
type claimIndex[P comparable] struct {
	lists  pmap.Map[claimTerm, claimList[P]]
	always claimList[P]
	size   int
}

// terms lists the terms a claim's selector requires: exact ones first, then
// presence ones (the '*' entries, then the expressions that require the key).
func (c *Claim[P]) terms(out []claimTerm) []claimTerm {
	m := c.Dst
	for _, kv := range m.Exact {
		out = append(out, claimTerm{key: kv.K, value: kv.V})
	}
	for _, k := range m.Present {
		out = append(out, claimTerm{key: k, presence: true})
	}
	for i := range m.Exprs {
		switch e := &m.Exprs[i]; e.Op {
		case resource.OpIn, resource.OpExists, resource.OpPrefix, resource.OpCIDR:
			out = append(out, claimTerm{key: e.Key, presence: true})
		}
	}
	return out
}

func (ix *claimIndex[P]) list(t claimTerm, lb *pmap.Builder[claimTerm, claimList[P]]) claimList[P] {
	if t == (claimTerm{}) {
		return ix.always
	}
	l, _ := lb.Get(t)
	return l
}

// locate finds the term a filed claim is under: each of its terms' lists is
// sorted, so a binary search per term finds it.
func (ix *claimIndex[P]) locate(c *Claim[P], lb *pmap.Builder[claimTerm, claimList[P]]) (claimTerm, bool) {
	var buf [8]claimTerm
	for _, t := range append(c.terms(buf[:0]), claimTerm{}) {
		l := ix.list(t, lb)
		if i := sort.Search(len(l), func(i int) bool { return !l[i].less(c) }); i < len(l) && l[i].same(c) {
			return t, true
		}
	}
	return claimTerm{}, false
}

// choose picks the term a new claim is filed under: an exact term if it has
// one, else a presence term, else the always list; among several, the one
// whose list (pending additions included) is shortest, so claims spread away
// from common terms (env, region) that most destinations probe.
func (ix *claimIndex[P]) choose(c *Claim[P], lb *pmap.Builder[claimTerm, claimList[P]], pending map[claimTerm]int) claimTerm {
	var buf [8]claimTerm
	best, bestN, bestExact := claimTerm{}, -1, false
	for _, t := range c.terms(buf[:0]) {
		if bestN >= 0 && bestExact && t.presence {
			break // exact terms come first
		}
		n := len(ix.list(t, lb)) + pending[t]
		if bestN < 0 || n < bestN {
			best, bestN, bestExact = t, n, !t.presence
		}
	}
	return best
}

// update returns the index without the removed claims and with the added
// ones; ix is not changed.
func (ix *claimIndex[P]) update(removed, added []Claim[P]) *claimIndex[P] {
	if len(removed) == 0 && len(added) == 0 {
		return ix
	}
	out := &claimIndex[P]{always: ix.always, size: ix.size}
	lb := ix.lists.Builder()
	type change struct{ del, add []Claim[P] }
	changes := map[claimTerm]*change{}
	get := func(t claimTerm) *change {
		ch := changes[t]
		if ch == nil {
			ch = &change{}
			changes[t] = ch
		}
		return ch
	}
	for i := range removed {
		if t, ok := ix.locate(&removed[i], lb); ok {
			get(t).del = append(get(t).del, removed[i])
			out.size--
		}
	}
	pending := map[claimTerm]int{}
	for i := range added {
		t := ix.choose(&added[i], lb, pending)
		pending[t]++
		get(t).add = append(get(t).add, added[i])
		out.size++
	}
	for t, ch := range changes {
		l := mergeClaims(ix.list(t, lb), ch.del, ch.add)
		switch {
		case t == claimTerm{}:
			out.always = l
		case len(l) == 0:
			lb.Delete(t)
		default:
			lb.Set(t, l)
		}
	}
	out.lists = lb.Map()
	return out
}

// mergeClaims returns a new sorted list: l without del, with add.
func mergeClaims[P comparable](l claimList[P], del, add []Claim[P]) claimList[P] {
	type id struct {
		p    P
		item int32
	}
	gone := make(map[id]struct{}, len(del))
	for _, c := range del {
		gone[id{c.Policy, c.Item}] = struct{}{}
	}
	sort.Slice(add, func(i, j int) bool { return add[i].less(&add[j]) })
	out := make(claimList[P], 0, len(l)+len(add)-len(del))
	i := 0
	for k := range l {
		if _, ok := gone[id{l[k].Policy, l[k].Item}]; ok {
			continue
		}
		for i < len(add) && add[i].less(&l[k]) {
			out = append(out, add[i])
			i++
		}
		out = append(out, l[k])
	}
	out = append(out, add[i:]...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// DestIndex is a partition's claims: views[0] of its enforced policies,
// views[1] of its audit ones. nil: no policy has a claim.
type DestIndex[P comparable] struct {
	views [2]*claimIndex[P]
}

// Update returns the index without the removed claims and with the added
// ones, per view (0 enforced, 1 audit); d is not changed, and may be nil.
func (d *DestIndex[P]) Update(removed, added [2][]Claim[P]) *DestIndex[P] {
	if d == nil {
		if len(added[0]) == 0 && len(added[1]) == 0 {
			return nil
		}
		d = &DestIndex[P]{views: [2]*claimIndex[P]{{}, {}}}
		for i := range d.views {
			d.views[i].lists = pmap.New[claimTerm, claimList[P]](claimTermHash)
		}
	}
	out := &DestIndex[P]{}
	for i := range out.views {
		out.views[i] = d.views[i].update(removed[i], added[i])
	}
	return out
}

// Best returns the policy of the first claim, in the choice's order, that
// the destination dst matches and is a member of the scope of (sc: the
// inbound side's memberships), among the enforced claims and in the shadow
// view the audit ones too; ok false when none.
func (d *DestIndex[P]) Best(dst resource.Tags, sc *Scratch, shadow bool) (p P, ok bool) {
	if d == nil {
		return p, false
	}
	var best *Claim[P]
	for i, ix := range d.views {
		if i == 1 && !shadow {
			break
		}
		if ix.size == 0 {
			continue
		}
		best = scanClaims(ix.always, dst, sc, best)
		if ix.lists.Len() == 0 {
			continue
		}
		for k, v := range dst {
			t := claimTerm{key: k, value: v}
			if l, ok := ix.lists.GetHashed(t, claimTermHash(t)); ok {
				best = scanClaims(l, dst, sc, best)
			}
			t = claimTerm{key: k, presence: true}
			if l, ok := ix.lists.GetHashed(t, claimTermHash(t)); ok {
				best = scanClaims(l, dst, sc, best)
			}
		}
	}
	if best == nil {
		return p, false
	}
	return best.Policy, true
}

// scanClaims returns the first claim of l before best that holds for the
// destination, else best.
func scanClaims[P comparable](l claimList[P], dst resource.Tags, sc *Scratch, best *Claim[P]) *Claim[P] {
	for i := range l {
		c := &l[i]
		if best != nil && !c.less(best) {
			break // this list's claims all come after the best one
		}
		if sc.IsMember(1, c.Scope) && c.Dst.Matches(dst) {
			return c
		}
	}
	return best
}
