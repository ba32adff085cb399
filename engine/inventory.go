package engine

// The inventory of a mesh: its workloads and the indexes endpoints are resolved
// through — by address, by principal, by identity. It lives in the mesh's state
// beside the policies but is independent of them: a workload change rebuilds
// neither scopes nor rule indexes, and costs O(change) (persistent maps; only
// the workloads that share an address with a changed one are re-checked).

import (
	"fmt"
	"reflect"
	"sort"
	"sync/atomic"

	"github.com/verdictpdp/verdict/engine/internal/pmap"
	"github.com/verdictpdp/verdict/engine/resource"
)

// inventory is the workloads of one mesh. It is immutable; apply returns a new
// one sharing what did not change.
type inventory struct {
	byName pmap.Map[string, *workloadEntry]
	// claims lists, per address, every workload that names it, earliest
	// written first. The first claimant owns the address; the others are
	// invalid (a conflict).
	claims     pmap.Map[string, []claim]
	principals pmap.Map[string, *principalSet] // valid holders only
	ids        pmap.Map[uint64, *tagSet]       // own tag sets of valid workloads
	invalid    int
	// gen names what ids resolves: renewed (from inventoryGens, unique) when
	// an identity enters or leaves ids or changes its tags, kept when a
	// change only re-interns a set (a put that keeps a workload's tags). The
	// identity-pair memo's entries are valid while it stays (pairmemo.go).
	gen uint64
}

// inventoryGens hands out inventory generations.
var inventoryGens atomic.Uint64

type claim struct {
	name string
	rev  int64
}

// workloadEntry is a workload as the inventory holds it.
type workloadEntry struct {
	w   *resource.Workload
	id  uint64
	err string // why it is invalid; "" when valid
}

// tagSet is a tag set known by its identity, and how many valid workloads have
// it as their own.
type tagSet struct {
	tags resource.Tags
	set  *TagSet // tags interned (identity.go)
	refs int
}

// principalSet is the valid workloads holding one principal, and the tags they
// all share. A principal held by one workload (a SPIFFE ID per workload, the
// usual case) costs one small struct: its holder, whose tags are the shared
// ones (the same map, never modified); the holders' maps and pair counts are
// made only for two holders or more.
type principalSet struct {
	one    *workloadEntry // the only holder; nil when many is set
	many   *principalHolders
	shared resource.Tags
}

// principalHolders is a principal's holders when there are two or more.
type principalHolders struct {
	holders pmap.Map[string, *workloadEntry]
	counts  pmap.Map[string, int] // "key\x00value" → holders that have the pair
}

// len is the number of holders.
func (ps *principalSet) len() int {
	if ps.many != nil {
		return ps.many.holders.Len()
	}
	return 1
}

func newInventory() *inventory {
	return &inventory{
		byName:     pmap.New[string, *workloadEntry](pmap.StringHash),
		claims:     pmap.New[string, []claim](pmap.StringHash),
		principals: pmap.New[string, *principalSet](pmap.StringHash),
		ids:        pmap.New[uint64, *tagSet](func(x uint64) uint64 { return mix64(x) }),
		gen:        inventoryGens.Add(1),
	}
}

// len is the number of workloads, valid or not.
func (inv *inventory) len() int {
	if inv == nil {
		return 0
	}
	return inv.byName.Len()
}

// written orders claims: earlier mod revision first, then name (offline, with
// no revisions, by name).
func (c claim) before(d claim) bool {
	if c.rev != d.rev {
		return c.rev < d.rev
	}
	return c.name < d.name
}

// workloadChange is a put (w set) or a delete (w nil) of the workload name.
type workloadChange struct {
	name string
	w    *resource.Workload
}

// apply returns the inventory after workload changes. inv may be nil.
func (inv *inventory) apply(changes []workloadChange) *inventory {
	if inv == nil {
		inv = newInventory()
	}
	out := *inv
	names := inv.byName.Builder()
	claims := inv.claims.Builder()
	principals := inv.principals.Builder()
	ids := inv.ids.Builder()

	// Who may change validity: the changed workloads and every workload that
	// claims an address one of them had or has.
	affected := map[string]bool{}
	for _, c := range changes {
		affected[c.name] = true
		if old, ok := names.Get(c.name); ok {
			for _, a := range old.w.Addresses {
				for _, cl := range claimsOf(inv.claims.Get, a) {
					affected[cl.name] = true
				}
			}
		}
		if w := c.w; w != nil {
			for _, a := range w.Addresses {
				for _, cl := range claimsOf(inv.claims.Get, a) {
					affected[cl.name] = true
				}
			}
		}
	}
	order := make([]string, 0, len(affected))
	for n := range affected {
		order = append(order, n)
	}
	sort.Strings(order)

	// Take out what the affected workloads contributed while valid.
	var touched []uint64 // the identities whose holders may change
	for _, n := range order {
		if e, ok := names.Get(n); ok {
			touched = append(touched, e.id)
			if e.err == "" {
				removeContribution(principals, ids, e)
			} else {
				out.invalid--
			}
		}
	}
	// Replace the changed workloads and their claims.
	for _, c := range changes {
		if old, ok := names.Get(c.name); ok {
			for _, a := range old.w.Addresses {
				if l := withoutClaim(claimsOf(claims.Get, a), old.w.Name); len(l) > 0 {
					claims.Set(a, l)
				} else {
					claims.Delete(a)
				}
			}
			names.Delete(c.name)
		}
		w := c.w
		if w == nil {
			continue
		}
		names.Set(w.Name, &workloadEntry{w: w, id: w.Identity()})
		cl := claim{name: w.Name, rev: w.Meta.ModRevision}
		for _, a := range w.Addresses {
			claims.Set(a, withClaim(claimsOf(claims.Get, a), cl))
		}
	}
	// Decide validity again, and put back what the valid ones contribute.
	for _, n := range order {
		e, ok := names.Get(n)
		if !ok {
			continue
		}
		why := ""
		for _, a := range e.w.Addresses {
			if first := claimsOf(claims.Get, a)[0]; first.name != e.w.Name {
				why = fmt.Sprintf("address %s belongs to workload %q, written earlier: an address belongs to at most one workload of a mesh", a, first.name)
				break
			}
		}
		var interned resource.Tags // the tag set's map, held already by another workload
		if why == "" {
			if ts, ok := ids.Get(e.id); ok {
				if !resource.SameTagSet(ts.tags, e.w.Tags) {
					why = fmt.Sprintf("its tags have identity %d, as do other tags (%v) of another workload: an identity collision", e.id, ts.tags)
				} else if !sameMap(ts.tags, e.w.Tags) {
					interned = ts.tags
				}
			}
		}
		if why != e.err || interned != nil {
			ne := *e
			ne.err = why
			if interned != nil {
				// Workloads with one tag set share one map: the entry holds
				// a copy of the workload with the interned map, and the
				// decoded one's map goes (100k workloads over a few thousand
				// tag sets keep a few thousand maps).
				w := *e.w
				w.Tags = interned
				ne.w = &w
			}
			e = &ne
			names.Set(n, e)
		}
		touched = append(touched, e.id)
		if why != "" {
			out.invalid++
			continue
		}
		addContribution(principals, ids, e)
	}
	out.byName = names.Map()
	out.claims = claims.Map()
	out.principals = principals.Map()
	out.ids = ids.Map()
	for _, id := range touched {
		was, before := inv.ids.Get(id)
		is, after := out.ids.Get(id)
		if before != after || (before && !resource.SameTagSet(was.tags, is.tags)) {
			out.gen = inventoryGens.Add(1)
			break
		}
	}
	return &out
}

// sameMap reports whether a and b are the same map (not only equal ones).
func sameMap(a, b resource.Tags) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func claimsOf(get func(string) ([]claim, bool), addr string) []claim {
	l, _ := get(addr)
	return l
}

func withoutClaim(l []claim, name string) []claim {
	out := make([]claim, 0, len(l))
	for _, c := range l {
		if c.name != name {
			out = append(out, c)
		}
	}
	return out
}

func withClaim(l []claim, c claim) []claim {
	out := make([]claim, 0, len(l)+1)
	i := 0
	for i < len(l) && l[i].before(c) {
		i++
	}
	out = append(out, l[:i]...)
	out = append(out, c)
	return append(out, l[i:]...)
}

func removeContribution(principals *pmap.Builder[string, *principalSet], ids *pmap.Builder[uint64, *tagSet], e *workloadEntry) {
	if ts, ok := ids.Get(e.id); ok {
		if ts.refs <= 1 {
			ids.Delete(e.id)
		} else {
			ids.Set(e.id, &tagSet{tags: ts.tags, set: ts.set, refs: ts.refs - 1})
		}
	}
	if e.w.Principal == "" {
		return
	}
	ps, ok := principals.Get(e.w.Principal)
	if !ok {
		return
	}
	if ps.many == nil {
		principals.Delete(e.w.Principal)
		return
	}
	holders := ps.many.holders.Delete(e.w.Name)
	if holders.Len() == 1 {
		var rest *workloadEntry
		holders.Range(func(_ string, h *workloadEntry) bool { rest = h; return false })
		principals.Set(e.w.Principal, &principalSet{one: rest, shared: rest.w.Tags})
		return
	}
	cb := ps.many.counts.Builder()
	for k, v := range e.w.Tags {
		pair := k + "\x00" + v
		if n, _ := cb.Get(pair); n <= 1 {
			cb.Delete(pair)
		} else {
			cb.Set(pair, n-1)
		}
	}
	many := &principalHolders{holders: holders, counts: cb.Map()}
	principals.Set(e.w.Principal, &principalSet{many: many, shared: many.sharedTags()})
}

func addContribution(principals *pmap.Builder[string, *principalSet], ids *pmap.Builder[uint64, *tagSet], e *workloadEntry) {
	if ts, ok := ids.Get(e.id); ok {
		ids.Set(e.id, &tagSet{tags: ts.tags, set: ts.set, refs: ts.refs + 1})
	} else {
		ids.Set(e.id, &tagSet{tags: e.w.Tags, set: newTagSet(e.id, e.w.Tags), refs: 1})
	}
	if e.w.Principal == "" {
		return
	}
	ps, ok := principals.Get(e.w.Principal)
	if !ok {
		principals.Set(e.w.Principal, &principalSet{one: e, shared: e.w.Tags})
		return
	}
	var many principalHolders
	if ps.many != nil {
		many = *ps.many
	} else {
		many.holders = pmap.New[string, *workloadEntry](pmap.StringHash).Set(ps.one.w.Name, ps.one)
		many.counts = pmap.New[string, int](pmap.StringHash)
		many.counts = countPairs(many.counts, ps.one.w.Tags)
	}
	many.holders = many.holders.Set(e.w.Name, e)
	many.counts = countPairs(many.counts, e.w.Tags)
	principals.Set(e.w.Principal, &principalSet{many: &many, shared: many.sharedTags()})
}

// countPairs adds one holder's pairs to counts.
func countPairs(counts pmap.Map[string, int], tags resource.Tags) pmap.Map[string, int] {
	cb := counts.Builder()
	for k, v := range tags {
		pair := k + "\x00" + v
		n, _ := cb.Get(pair)
		cb.Set(pair, n+1)
	}
	return cb.Map()
}

// sharedTags is the pairs every holder has: those of any one holder whose
// count is the number of holders. O(tags of one holder).
func (ph *principalHolders) sharedTags() resource.Tags {
	n := ph.holders.Len()
	var any *workloadEntry
	ph.holders.Range(func(_ string, e *workloadEntry) bool { any = e; return false })
	out := resource.Tags{}
	if any == nil {
		return out
	}
	for k, v := range any.w.Tags {
		if c, _ := ph.counts.Get(k + "\x00" + v); c == n {
			out[k] = v
		}
	}
	return out
}

