package engine

import (
	"cmp"

	"github.com/verdictpdp/verdict/engine/resource"
)

// Phases of the order (docs/order.md, key 1).
const (
	phaseAbsolute uint8 = iota
	phaseDefault
	phaseCatchAll
)

var phaseNames = []string{"Absolute", "Default", "CatchAll"}

// Sides of a flow. A rule is a candidate on the sides in its mask.
const (
	sideOut  uint8 = 1 << iota // outbound: decided at the source workload
	sideIn                     // inbound: decided at the destination workload
	sideBoth = sideOut | sideIn
)

// orderKey is a rule's place in the one ordered rule list of its mesh and type
// (docs/order.md). Smaller keys come first; keys are unique within a type.
type orderKey struct {
	phase    uint8
	scope    int32 // Absolute: the scope's position; Default and catch-all: minus it
	priority int32
	total    int16 // specificity, greater first
	exact    int16
	tb1, tb2 int64 // tie-break, smaller first (newest first is stored negated)
	name     string
	item     int32 // item position (FirstWins) or minus it (LastWins); S&D pair index
}

func (a *orderKey) less(b *orderKey) bool {
	if a.phase != b.phase {
		return a.phase < b.phase
	}
	if a.scope != b.scope {
		return a.scope < b.scope
	}
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if c := rankCmp(a.total, a.exact, a.tb1, a.tb2, b.total, b.exact, b.tb1, b.tb2); c != 0 {
		return c < 0
	}
	if a.name != b.name {
		return a.name < b.name
	}
	return a.item < b.item
}

// rankCmp compares two places of the order from the specificity on (docs/order.md):
// the greater total, then the more exact entries, then the smaller tie-break
// values come first. It returns -1 when a comes first, 1 when b does, 0 on a tie
// (the name and the item decide then). PerDestination's choice (destindex.go)
// orders its claims by the same rule.
func rankCmp(aTotal, aExact int16, aTb1, aTb2 int64, bTotal, bExact int16, bTb1, bTb2 int64) int {
	if c := cmp.Compare(bTotal, aTotal); c != 0 {
		return c
	}
	if c := cmp.Compare(bExact, aExact); c != 0 {
		return c
	}
	if c := cmp.Compare(aTb1, bTb1); c != 0 {
		return c
	}
	return cmp.Compare(aTb2, bTb2)
}

// rule is one compiled entry of the order: a (source, destination) selector pair
// of an S&D policy, a from or to item of a targetRef policy, or a scope's catch-all.
type rule struct {
	key    orderKey
	policy *resource.Policy // nil for a catch-all
	src    *matcher
	dst    *matcher
	ports  []resource.PortEntry
	// The small fields together (136 bytes, the 144-byte size class; 160
	// when they were scattered), beside what a scan reads with them.
	action resource.Action
	sides  uint8
	filed  uint8 // the end of the term the rule is filed under (endSrc, endDst; 0: the always list)
	audit  bool  // decides the shadow decision only (docs/audit.md)
	scope  int32 // position of the rule's scope in the mesh's scope order; 0 = the mesh root
	conf   resource.Object
	id     string // "sources[0]/destinations[1]", "from[2]", "to[0]", "catchAll"
}

// matchesFlow reports whether the rule matches the flow, attachment aside. The
// end the rule was found through mostly matches already, so the other end is
// checked first.
func (r *rule) matchesFlow(f *flow) bool {
	if !matchesPorts(r.ports, f.proto, f.port) {
		return false
	}
	if r.filed == endSrc {
		return r.dst.matches(f.dst) && r.src.matches(f.src)
	}
	return r.src.matches(f.src) && r.dst.matches(f.dst)
}

func (r *rule) policyName() string {
	if r.policy == nil {
		return ""
	}
	return r.policy.Name
}

// Decision procedures (scanClass).
const (
	procLists uint8 = 1 + iota
	procBits
)

// flow is a request's flow as the matchers see it.
type flow struct {
	src, dst resource.Tags
	proto    resource.Protocol
	port     uint32
}

// sideBits maps a side index (0 outbound, 1 inbound) to its bit.
var sideBits = [2]uint8{sideOut, sideIn}

// The decision procedure. A flow's tags are resolved once to ids (the posting
// lists of its terms and a (key id → value id) table). Then each action class
// is scanned by one of two procedures, whichever the flow's lists say is
// cheaper: when the posting lists the flow reaches hold few entries (sparse
// sets, small sets), they are walked (scanLists); when they hold many (dense
// sets, where many rules match a flow), the class's bitmaps are (scanBits,
// bitindex.go), whose cost follows the position of the answer in the order,
// not the number of rules the lists hold. Both stop at the first match.

// bitsAbove is the number of posting-list entries a flow must reach in a
// class for the bitmaps to scan it: a walk costs at most one entry each; the
// bitmaps cost a block's setup and a chunk of 512 rules per dimension at least.
const bitsAbove = 128

// scanFirstMatch improves best, per side, with the first rule in order that
// matches the flow and is a candidate on that side.
func scanFirstMatch(ix *ruleIndex, f *flow, sc *scanScratch, need [2]bool, best *[2]*rule) {
	sc.vals.reset(ix.nextID)
	ix.lists(f.src, f.dst, &sc.lists, &sc.vals)
	scanClass(ix, classAllow, f, sc, need, best)
	scanClass(ix, classDeny, f, sc, need, best)
}

// scanClass improves best[side], for each side in need, with the first
// matching candidate of the class; sc.lists and sc.vals hold the flow's lists
// and ids.
func scanClass(ix *ruleIndex, class int, f *flow, sc *scanScratch, need [2]bool, best *[2]*rule) {
	if ix.bits != nil && sc.procedure != procLists {
		n := 0
		for _, l := range sc.lists[class] {
			n += len(l)
		}
		if n > bitsAbove || sc.procedure == procBits {
			scanBits(ix.bits, class, f, sc, need, best)
			return
		}
	}
	scanLists(sc.lists[class], f, sc, need, best)
}

// scanLists improves best[side], for each side in need, with the first matching
// candidate of each list. A candidate costs its entry: the order prefix and the
// ids; the rule itself is read only when those match. The lists are walked
// round-robin, a few entries of each per round, so the early rules of every
// list bound the walk of the others (walking one long list to its first match
// before looking at the others examines many rules a better match elsewhere
// would have cut off).
func scanLists(ls []plist, f *flow, sc *scanScratch, need [2]bool, best *[2]*rule) {
	var ord [2]uint64
	for side := range best {
		if best[side] != nil {
			ord[side] = orderPrefix(&best[side].key)
		}
	}
	vals := &sc.vals
	pos := sc.pos[:0]
	for range ls {
		pos = append(pos, 0)
	}
	sc.pos = pos
	for open, step := len(ls), scanStep; open > 0; step *= 2 {
		open = 0
		for li, l := range ls {
			i := pos[li]
			if i < 0 {
				continue
			}
			stop := min(i+step, len(l))
		entries:
			for ; i < stop; i++ {
				e := &l[i]
				// Past the best of every open side: stop. An entry whose prefix
				// ties with a best is examined (cheap) rather than compared by
				// its whole key (a read of the rule).
				if (!need[0] || best[0] != nil && e.ord > ord[0]) && (!need[1] || best[1] != nil && e.ord > ord[1]) {
					break
				}
				for _, t := range e.ids[:min(e.n, inlineIDs)] {
					if x := vals.vals[t.kid]; x>>32 != vals.gen || t.vid != 0 && uint32(x) != t.vid {
						continue entries
					}
				}
				r := e.r
				if !e.plain && (e.n == overflowIDs && !r.matchesFlow(f) || !r.matchesRest(f)) {
					continue
				}
				for side := 0; side < 2; side++ {
					if need[side] && r.sides&sideBits[side] != 0 && (best[side] == nil || e.before(best[side], ord[side])) &&
						sc.isMember(side, r.scope) {
						best[side], ord[side] = r, e.ord
					}
				}
			}
			if i < stop || i == len(l) {
				pos[li] = -1
				continue
			}
			pos[li] = i
			open++
		}
	}
}

// scanStep is how many entries of each list the first round examines.
const scanStep = 2

// matchesRest checks what ids do not cover: ports and expressions.
func (r *rule) matchesRest(f *flow) bool {
	return matchesPorts(r.ports, f.proto, f.port) &&
		(len(r.src.exprs) == 0 || r.src.exprsHold(f.src)) && (len(r.dst.exprs) == 0 || r.dst.exprsHold(f.dst))
}

// exprsHold reports whether the workload satisfies the selector's expressions.
func (m *matcher) exprsHold(tags resource.Tags) bool {
	for i := range m.exprs {
		if !m.exprs[i].holds(tags) {
			return false
		}
	}
	return true
}

// scanDenyOverrides finds, per side in need, the first matching DENY rule,
// else the first matching ALLOW rule (docs/order.md): the DENY lists first,
// then the ALLOW lists only for a side no DENY decided. first is the answer;
// deny and allow are what each class gave.
func scanDenyOverrides(ix *ruleIndex, f *flow, sc *scanScratch, need [2]bool, first, deny, allow *[2]*rule) {
	sc.vals.reset(ix.nextID)
	ix.lists(f.src, f.dst, &sc.lists, &sc.vals)
	scanClass(ix, classDeny, f, sc, need, deny)
	for side := 0; side < 2; side++ {
		need[side] = need[side] && deny[side] == nil
	}
	if need[0] || need[1] {
		scanClass(ix, classAllow, f, sc, need, allow)
	}
	for side := 0; side < 2; side++ {
		first[side] = deny[side]
		if first[side] == nil {
			first[side] = allow[side]
		}
	}
}

// scanScratch is the per-call working memory of a scan.
type scanScratch struct {
	lists   [2][]plist  // per action class (index.go)
	vals    flowVals    // the flow's tags as ids of the type's rule index
	pos     []int       // per list: where the scan resumes; -1 when done
	cursors []dimCursor // per dimension of a block (bitindex.go)
	// procedure forces the decision procedure (Request.procedure); 0: chosen per flow
	procedure uint8
	// gen stamps the scopes' membership of this call; mem, per side, per
	// scope ord: == gen when the workload is a member. A rule is a candidate
	// on a side only if its scope is a member there (isMember).
	gen uint32
	mem [2][]uint32
}

func (sc *scanScratch) isMember(side int, ord int32) bool {
	return ord == 0 || sc.mem[side][ord] == sc.gen
}
