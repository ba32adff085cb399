package index

import (
	"cmp"

	"github.com/verdictpdp/verdict/engine/resource"
)

// Phases of the order (docs/order.md, key 1).
const (
	PhaseAbsolute uint8 = iota
	PhaseDefault
	PhaseCatchAll
)

var PhaseNames = []string{"Absolute", "Default", "CatchAll"}

// Sides of a flow. A rule is a candidate on the sides in its mask.
const (
	SideOut  uint8 = 1 << iota // outbound: decided at the source workload
	SideIn                     // inbound: decided at the destination workload
	SideBoth = SideOut | SideIn
)

// OrderKey is a rule's place in the one ordered rule list of its mesh and type
// (docs/order.md). Smaller keys come first; keys are unique within a type.
type OrderKey struct {
	Phase    uint8
	Scope    int32 // Absolute: the scope's position; Default and catch-all: minus it
	Priority int32
	Total    int16 // specificity, greater first
	Exact    int16
	Tb1, Tb2 int64 // tie-break, smaller first (newest first is stored negated)
	Name     string
	Item     int32 // item position (FirstWins) or minus it (LastWins); S&D pair index
}

func (a *OrderKey) Less(b *OrderKey) bool {
	if a.Phase != b.Phase {
		return a.Phase < b.Phase
	}
	if a.Scope != b.Scope {
		return a.Scope < b.Scope
	}
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	if c := RankCmp(a.Total, a.Exact, a.Tb1, a.Tb2, b.Total, b.Exact, b.Tb1, b.Tb2); c != 0 {
		return c < 0
	}
	if a.Name != b.Name {
		return a.Name < b.Name
	}
	return a.Item < b.Item
}

// RankCmp compares two places of the order from the specificity on (docs/order.md):
// the greater total, then the more exact entries, then the smaller tie-break
// values come first. It returns -1 when a comes first, 1 when b does, 0 on a tie
// (the name and the item decide then). PerDestination's choice (destindex.go)
// orders its claims by the same rule.
func RankCmp(aTotal, aExact int16, aTb1, aTb2 int64, bTotal, bExact int16, bTb1, bTb2 int64) int {
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

// Rule is one compiled entry of the order: a (source, destination) selector pair
// of an S&D policy, a from or to item of a targetRef policy, or a scope's catch-all.
type Rule struct {
	Key    OrderKey
	Policy *resource.Policy // nil for a catch-all
	Src    *Matcher
	Dst    *Matcher
	Ports  []resource.PortEntry
	// The small fields together (136 bytes, the 144-byte size class; 160
	// when they were scattered), beside what a scan reads with them.
	Action resource.Action
	Sides  uint8
	filed  uint8 // the end of the term the rule is filed under (endSrc, endDst; 0: the always list), | plainRule
	Audit  bool  // decides the shadow decision only (docs/audit.md)
	Scope  int32 // position of the rule's scope in the mesh's scope order; 0 = the mesh root
	Conf   resource.Object
	ID     string // "sources[0]/destinations[1]", "from[2]", "to[0]", "catchAll"
}

// isPlain reports whether the rule has no ports and no expressions.
func (r *Rule) isPlain() bool {
	return len(r.Ports) == 0 && (r.Src == nil || len(r.Src.Exprs) == 0) && (r.Dst == nil || len(r.Dst.Exprs) == 0)
}

// plainRule is the bit of Rule.filed that says the rule has no ports and no
// expressions: its terms decide its match (a scan reads no more of it).
const plainRule = 0x80

// file records where a fresh rule is filed (its end), and whether it is plain.
func (r *Rule) file(end uint8) {
	r.filed = end
	if r.isPlain() {
		r.filed |= plainRule
	}
}

// MatchesFlow reports whether the rule matches the flow, attachment aside. The
// end the rule was found through mostly matches already, so the other end is
// checked first.
func (r *Rule) MatchesFlow(f *Flow) bool {
	if !MatchesPorts(r.Ports, f.Proto, f.Port) {
		return false
	}
	if r.filed&^plainRule == EndSrc {
		return r.Dst.Matches(f.Dst) && r.Src.Matches(f.Src)
	}
	return r.Src.Matches(f.Src) && r.Dst.Matches(f.Dst)
}

func (r *Rule) PolicyName() string {
	if r.Policy == nil {
		return ""
	}
	return r.Policy.Name
}

// Decision procedures (scanClass).
const (
	ProcLists uint8 = 1 + iota
	ProcBits
)

// Flow is a request's flow as the matchers see it.
type Flow struct {
	Src, Dst resource.Tags
	Proto    resource.Protocol
	Port     uint32
}

// sideBits maps a side index (0 outbound, 1 inbound) to its bit.
var SideBits = [2]uint8{SideOut, SideIn}

// The decision procedure. A flow's tags are resolved once to ids (the posting
// lists of its terms and a (key id → value id) table). Then each action class
// is scanned by one of two procedures, whichever the flow's lists say is
// cheaper: when the posting lists the flow reaches hold few entries (sparse
// sets, small sets), they are walked (scanLists); when they hold many (dense
// sets, where many rules match a flow), the class's bitmaps are (scanBits,
// bitindex.go), whose cost follows the position of the answer in the order,
// not the number of rules the lists hold. Both stop at the first match. An
// index built for FirstMatch (BuildMerged) scans both classes' bitmaps at once.

// bitsAbove is the number of posting-list entries a flow must reach in a
// class for the bitmaps to scan it: a walk costs at most one entry each; the
// bitmaps cost a block's setup and a chunk of 512 rules per dimension at least.
const bitsAbove = 128

// ScanFirstMatch improves best, per side, with the first rule in order that
// matches the flow and is a candidate on that side.
func ScanFirstMatch(ix *Index, f *Flow, sc *Scratch, need [2]bool, best *[2]*Rule) {
	sc.vals.reset(ix.nextID)
	ix.reach(f.Src, f.Dst, &sc.reached, &sc.vals)
	sc.listed = false
	// Both classes in one sequence of bitmaps: one scan, when the flow's
	// lists are long enough for the bitmaps to be the cheaper procedure.
	if n := sc.reached.n; ix.Bits != nil && ix.Bits.merged && sc.Procedure != ProcLists &&
		(sc.Procedure == ProcBits || n[classAllow]+n[classDeny] > bitsAbove) {
		scanBits(ix.Bits, classAny, f, sc, need, best)
		return
	}
	scanClass(ix, classAllow, f, sc, need, best)
	scanClass(ix, classDeny, f, sc, need, best)
}

// scanClass improves best[side], for each side in need, with the first
// matching candidate of the class; sc.reached and sc.vals hold the flow's
// terms and ids.
func scanClass(ix *Index, class int, f *Flow, sc *Scratch, need [2]bool, best *[2]*Rule) {
	// A merged sequence of bitmaps answers both classes at once alone
	// (ScanFirstMatch): a class of it is walked by its lists.
	if ix.Bits != nil && !ix.Bits.merged && sc.Procedure != ProcLists {
		if sc.reached.n[class] > bitsAbove || sc.Procedure == ProcBits {
			scanBits(ix.Bits, class, f, sc, need, best)
			return
		}
	}
	if !sc.listed {
		sc.reached.lists(ix, &sc.Lists)
		sc.listed = true
	}
	scanLists(sc.Lists[class], f, sc, need, best)
}

// scanLists improves best[side], for each side in need, with the first matching
// candidate of each list. A candidate costs its entry: the order prefix and the
// ids; the rule itself is read only when those match. The lists are walked
// round-robin, a few entries of each per round, so the early rules of every
// list bound the walk of the others (walking one long list to its first match
// before looking at the others examines many rules a better match elsewhere
// would have cut off).
func scanLists(ls []List, f *Flow, sc *Scratch, need [2]bool, best *[2]*Rule) {
	var ord [2]uint64
	for side := range best {
		if best[side] != nil {
			ord[side] = orderPrefix(&best[side].Key)
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
				r := e.R
				if !e.plain && (e.n == overflowIDs && !r.MatchesFlow(f) || !r.matchesRest(f)) {
					continue
				}
				for side := 0; side < 2; side++ {
					if need[side] && r.Sides&SideBits[side] != 0 && (best[side] == nil || e.before(best[side], ord[side])) &&
						sc.IsMember(side, r.Scope) {
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
func (r *Rule) matchesRest(f *Flow) bool {
	if r.filed&plainRule != 0 {
		return true
	}
	return MatchesPorts(r.Ports, f.Proto, f.Port) &&
		(len(r.Src.Exprs) == 0 || r.Src.exprsHold(f.Src)) && (len(r.Dst.Exprs) == 0 || r.Dst.exprsHold(f.Dst))
}

// exprsHold reports whether the workload satisfies the selector's expressions.
func (m *Matcher) exprsHold(tags resource.Tags) bool {
	for i := range m.Exprs {
		if !m.Exprs[i].holds(tags) {
			return false
		}
	}
	return true
}

// ScanDenyOverrides finds, per side in need, the first matching DENY rule,
// else the first matching ALLOW rule (docs/order.md): the DENY lists first,
// then the ALLOW lists only for a side no DENY decided. first is the answer;
// deny and allow are what each class gave.
func ScanDenyOverrides(ix *Index, f *Flow, sc *Scratch, need [2]bool, first, deny, allow *[2]*Rule) {
	sc.vals.reset(ix.nextID)
	ix.reach(f.Src, f.Dst, &sc.reached, &sc.vals)
	sc.listed = false
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

// Scratch is the per-call working memory of a scan.
type Scratch struct {
	Lists   [2][]List   // per action class (index.go)
	reached reached     // the terms the flow reaches (index.go)
	listed  bool        // Lists holds reached's lists
	vals    flowVals    // the flow's tags as ids of the type's rule index
	pos     []int       // per list: where the scan resumes; -1 when done
	cursors []dimCursor // per dimension of a block (bitindex.go)
	// Procedure forces the decision procedure (Request.procedure); 0: chosen per flow
	Procedure uint8
	// Gen stamps the scopes' membership of this call; mem, per side, per
	// scope ord: == gen when the workload is a member. A rule is a candidate
	// on a side only if its scope is a member there (isMember).
	Gen uint32
	Mem [2][]uint32
}

func (sc *Scratch) IsMember(side int, ord int32) bool {
	return ord == 0 || sc.Mem[side][ord] == sc.Gen
}
