package inventory

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

// Inventory is the workloads of one mesh. It is immutable; apply returns a new
// one sharing what did not change.
type Inventory struct {
	ByName pmap.Map[string, *WorkloadEntry]
	// Claims lists, per address, every workload that names it, earliest
	// written first. The first claimant owns the address; the others are
	// invalid (a conflict).
	Claims     pmap.Map[string, []claim]
	principals pmap.Map[string, *principalSet] // valid holders only
	Ids        pmap.Map[uint64, *tagSet]       // own tag sets of valid workloads
	Invalid    int
	// Gen names what ids resolves: renewed (from inventoryGens, unique) when
	// an identity enters or leaves ids or changes its tags, kept when a
	// change only re-interns a set (a put that keeps a workload's tags). The
	// identity-pair memo's entries are valid while it stays (pairmemo.go).
	Gen uint64
}

// inventoryGens hands out inventory generations.
var inventoryGens atomic.Uint64

type claim struct {
	Name string
	rev  int64
}

// WorkloadEntry is a workload as the inventory holds it.
type WorkloadEntry struct {
	Workload *resource.Workload
	ID       uint64
	Err      string // why it is invalid; "" when valid
}

// tagSet is a tag set known by its identity, and how many valid workloads have
// it as their own.
type tagSet struct {
	Tags resource.Tags
	Set  *TagSet // tags interned (identity.go)
	refs int
}

// principalSet is the valid workloads holding one principal, and the tags they
// all share. A principal held by one workload (a SPIFFE ID per workload, the
// usual case) costs one small struct: its holder, whose tags are the shared
// ones (the same map, never modified); the holders' maps and pair counts are
// made only for two holders or more.
type principalSet struct {
	one    *WorkloadEntry // the only holder; nil when many is set
	many   *principalHolders
	Shared resource.Tags
}

// principalHolders is a principal's holders when there are two or more.
type principalHolders struct {
	holders pmap.Map[string, *WorkloadEntry]
	counts  pmap.Map[string, int] // "key\x00value" → holders that have the pair
}

// Len is the number of holders.
func (ps *principalSet) Len() int {
	if ps.many != nil {
		return ps.many.holders.Len()
	}
	return 1
}

func newInventory() *Inventory {
	return &Inventory{
		ByName:     pmap.New[string, *WorkloadEntry](pmap.StringHash),
		Claims:     pmap.New[string, []claim](pmap.StringHash),
		principals: pmap.New[string, *principalSet](pmap.StringHash),
		Ids:        pmap.New[uint64, *tagSet](func(x uint64) uint64 { return Mix64(x) }),
		Gen:        inventoryGens.Add(1),
	}
}

// Len is the number of workloads, valid or not.
func (inv *Inventory) Len() int {
	if inv == nil {
		return 0
	}
	return inv.ByName.Len()
}

// written orders claims: earlier mod revision first, then name (offline, with
// no revisions, by name).
func (c claim) before(d claim) bool {
	if c.rev != d.rev {
		return c.rev < d.rev
	}
	return c.Name < d.Name
}

// WorkloadChange is a put (w set) or a delete (w nil) of the workload name.
type WorkloadChange struct {
	Name     string
	Workload *resource.Workload
}

// Apply returns the inventory after workload changes. inv may be nil.
func (inv *Inventory) Apply(changes []WorkloadChange) *Inventory {
	if inv == nil {
		inv = newInventory()
	}
	out := *inv
	names := inv.ByName.Builder()
	claims := inv.Claims.Builder()
	principals := inv.principals.Builder()
	ids := inv.Ids.Builder()

	// Who may change validity: the changed workloads and every workload that
	// claims an address one of them had or has.
	affected := map[string]bool{}
	for _, c := range changes {
		affected[c.Name] = true
		if old, ok := names.Get(c.Name); ok {
			for _, a := range old.Workload.Addresses {
				for _, cl := range ClaimsOf(inv.Claims.Get, a) {
					affected[cl.Name] = true
				}
			}
		}
		if w := c.Workload; w != nil {
			for _, a := range w.Addresses {
				for _, cl := range ClaimsOf(inv.Claims.Get, a) {
					affected[cl.Name] = true
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
			touched = append(touched, e.ID)
			if e.Err == "" {
				removeContribution(principals, ids, e)
			} else {
				out.Invalid--
			}
		}
	}
	// Replace the changed workloads and their claims.
	for _, c := range changes {
		if old, ok := names.Get(c.Name); ok {
			for _, a := range old.Workload.Addresses {
				if l := withoutClaim(ClaimsOf(claims.Get, a), old.Workload.Name); len(l) > 0 {
					claims.Set(a, l)
				} else {
					claims.Delete(a)
				}
			}
			names.Delete(c.Name)
		}
		w := c.Workload
		if w == nil {
			continue
		}
		names.Set(w.Name, &WorkloadEntry{Workload: w, ID: w.Identity()})
		cl := claim{Name: w.Name, rev: w.Meta.ModRevision}
		for _, a := range w.Addresses {
			claims.Set(a, withClaim(ClaimsOf(claims.Get, a), cl))
		}
	}
	// Decide validity again, and put back what the valid ones contribute.
	for _, n := range order {
		e, ok := names.Get(n)
		if !ok {
			continue
		}
		why := ""
		for _, a := range e.Workload.Addresses {
			if first := ClaimsOf(claims.Get, a)[0]; first.Name != e.Workload.Name {
				why = fmt.Sprintf("address %s belongs to workload %q, written earlier: an address belongs to at most one workload of a mesh", a, first.Name)
				break
			}
		}
		var interned resource.Tags // the tag set's map, held already by another workload
		if why == "" {
			if ts, ok := ids.Get(e.ID); ok {
				if !resource.SameTagSet(ts.Tags, e.Workload.Tags) {
					why = fmt.Sprintf("its tags have identity %d, as do other tags (%v) of another workload: an identity collision", e.ID, ts.Tags)
				} else if !sameMap(ts.Tags, e.Workload.Tags) {
					interned = ts.Tags
				}
			}
		}
		if why != e.Err || interned != nil {
			ne := *e
			ne.Err = why
			if interned != nil {
				// Workloads with one tag set share one map: the entry holds
				// a copy of the workload with the interned map, and the
				// decoded one's map goes (100k workloads over a few thousand
				// tag sets keep a few thousand maps).
				w := *e.Workload
				w.Tags = interned
				ne.Workload = &w
			}
			e = &ne
			names.Set(n, e)
		}
		touched = append(touched, e.ID)
		if why != "" {
			out.Invalid++
			continue
		}
		addContribution(principals, ids, e)
	}
	out.ByName = names.Map()
	out.Claims = claims.Map()
	out.principals = principals.Map()
	out.Ids = ids.Map()
	for _, id := range touched {
		was, before := inv.Ids.Get(id)
		is, after := out.Ids.Get(id)
		if before != after || (before && !resource.SameTagSet(was.Tags, is.Tags)) {
			out.Gen = inventoryGens.Add(1)
			break
		}
	}
	return &out
}

// sameMap reports whether a and b are the same map (not only equal ones).
func sameMap(a, b resource.Tags) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func ClaimsOf(get func(string) ([]claim, bool), addr string) []claim {
	l, _ := get(addr)
	return l
}

func withoutClaim(l []claim, name string) []claim {
	out := make([]claim, 0, len(l))
	for _, c := range l {
		if c.Name != name {
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

func removeContribution(principals *pmap.Builder[string, *principalSet], ids *pmap.Builder[uint64, *tagSet], e *WorkloadEntry) {
	if ts, ok := ids.Get(e.ID); ok {
		if ts.refs <= 1 {
			ids.Delete(e.ID)
		} else {
			ids.Set(e.ID, &tagSet{Tags: ts.Tags, Set: ts.Set, refs: ts.refs - 1})
		}
	}
	if e.Workload.Principal == "" {
		return
	}
	ps, ok := principals.Get(e.Workload.Principal)
	if !ok {
		return
	}
	if ps.many == nil {
		principals.Delete(e.Workload.Principal)
		return
	}
	holders := ps.many.holders.Delete(e.Workload.Name)
	if holders.Len() == 1 {
		var rest *WorkloadEntry
		holders.Range(func(_ string, h *WorkloadEntry) bool { rest = h; return false })
		principals.Set(e.Workload.Principal, &principalSet{one: rest, Shared: rest.Workload.Tags})
		return
	}
	cb := ps.many.counts.Builder()
	for k, v := range e.Workload.Tags {
		pair := k + "\x00" + v
		if n, _ := cb.Get(pair); n <= 1 {
			cb.Delete(pair)
		} else {
			cb.Set(pair, n-1)
		}
	}
	many := &principalHolders{holders: holders, counts: cb.Map()}
	principals.Set(e.Workload.Principal, &principalSet{many: many, Shared: many.sharedTags()})
}

func addContribution(principals *pmap.Builder[string, *principalSet], ids *pmap.Builder[uint64, *tagSet], e *WorkloadEntry) {
	if ts, ok := ids.Get(e.ID); ok {
		ids.Set(e.ID, &tagSet{Tags: ts.Tags, Set: ts.Set, refs: ts.refs + 1})
	} else {
		ids.Set(e.ID, &tagSet{Tags: e.Workload.Tags, Set: NewTagSet(e.ID, e.Workload.Tags), refs: 1})
	}
	if e.Workload.Principal == "" {
		return
	}
	ps, ok := principals.Get(e.Workload.Principal)
	if !ok {
		principals.Set(e.Workload.Principal, &principalSet{one: e, Shared: e.Workload.Tags})
		return
	}
	var many principalHolders
	if ps.many != nil {
		many = *ps.many
	} else {
		many.holders = pmap.New[string, *WorkloadEntry](pmap.StringHash).Set(ps.one.Workload.Name, ps.one)
		many.counts = pmap.New[string, int](pmap.StringHash)
		many.counts = countPairs(many.counts, ps.one.Workload.Tags)
	}
	many.holders = many.holders.Set(e.Workload.Name, e)
	many.counts = countPairs(many.counts, e.Workload.Tags)
	principals.Set(e.Workload.Principal, &principalSet{many: &many, Shared: many.sharedTags()})
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
	var any *WorkloadEntry
	ph.holders.Range(func(_ string, e *WorkloadEntry) bool { any = e; return false })
	out := resource.Tags{}
	if any == nil {
		return out
	}
	for k, v := range any.Workload.Tags {
		if c, _ := ph.counts.Get(k + "\x00" + v); c == n {
			out[k] = v
		}
	}
	return out
}
