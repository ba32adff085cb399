package fanout

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Address sets of WatchRules (docs/api.md): one per distinct (mesh, peer
// selector) named by the rules of some stream that asked for address sets,
// shared by every rule and stream naming it (Calico's IP-set model). A set
// holds each workload's part (engine.Snapshot.PeerMember); a snapshot that
// changes workloads re-evaluates only the workloads it touched, so one
// workload put costs one member evaluation per set, not per stream, and
// yields a delta per set that changed. Everything here is guarded by the
// hub's mutex.

// errSetNameCollision: two distinct selectors whose set names collide (55
// bits of SHA-256: refused loudly, never merged — a merged set could allow
// what one selector does not).
var errSetNameCollision = errors.New("address set name collision")

// setNameEncoding is lowercase base32 without padding: [a-z2-7].
var setNameEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// peerSet is one address set.
type peerSet struct {
	name string
	mesh string
	key  string
	plan *inventory.PeerPlan
	refs int // groups whose current rules name it

	rev     int64 // the revision its members reflect
	members map[string]inventory.PeerMember
	addrs   map[string]int // static sets: address → members holding it
	outs    map[string]int // other sets: carved-out address → members
	ids     map[uint64]int // identity → members with a matching address
	list    []string       // other sets: the addresses, sorted
	// full is the set's contents as sent, built on demand, and encoded its
	// part of a RULES message; both nil after a change.
	full    *verdictv1.AddressSet
	encoded []byte
	// delta is the change made at deltaRev; nil when none.
	delta    *verdictv1.AddressSetDelta
	deltaRev int64
}

// setRegistry holds the sets in use.
type setRegistry struct {
	byKey  map[string]*peerSet
	byName map[string]string // name → key
}

func newSetRegistry() *setRegistry {
	return &setRegistry{byKey: map[string]*peerSet{}, byName: map[string]string{}}
}

// selectorKey is an unambiguous canonical text of (mesh, selector): match
// pairs sorted, expressions sorted with their values sorted.
func selectorKey(mesh string, sel resource.Selector) string {
	var b strings.Builder
	write := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	write(mesh)
	keys := make([]string, 0, len(sel.Match))
	for k := range sel.Match {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("m")
	for _, k := range keys {
		write(k)
		write(sel.Match[k])
	}
	exprs := make([]string, 0, len(sel.Expressions))
	for _, e := range sel.Expressions {
		var eb strings.Builder
		vals := slices.Clone(e.Values)
		sort.Strings(vals)
		for _, s := range append([]string{e.Key, e.Operator.String()}, vals...) {
			eb.WriteString(strconv.Itoa(len(s)))
			eb.WriteByte(':')
			eb.WriteString(s)
		}
		exprs = append(exprs, eb.String())
	}
	sort.Strings(exprs)
	for _, e := range exprs {
		b.WriteString("e")
		write(e)
	}
	return b.String()
}

// setName is the stable name of a selector's set: "a" and 11 characters of
// lowercase base32 of SHA-256 over its key — 12 characters, so that an
// agent's "p_<name>_4" fits 16.
func setName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "a" + setNameEncoding.EncodeToString(sum[:8])[:11]
}

// peer resolves one peer selector for the rules of a group at snap: CIDRs, or
// a set (made and computed when new) whose reference the caller takes.
func (r *setRegistry) peer(snap *engine.Snapshot, mesh string, sel resource.Selector) (cidrs []string, set *peerSet, err error) {
	key := selectorKey(mesh, sel)
	if ps, ok := r.byKey[key]; ok {
		return nil, ps, nil
	}
	plan, err := inventory.PlanPeer(sel)
	if err != nil {
		return nil, nil, err
	}
	if plan.Kind == inventory.PeerCIDRs {
		return plan.CIDRs, nil, nil
	}
	name := setName(key)
	if other, ok := r.byName[name]; ok && other != key {
		return nil, nil, fmt.Errorf("%w: %q for two selectors of mesh %q", errSetNameCollision, name, mesh)
	}
	ps := &peerSet{name: name, mesh: mesh, key: key, plan: plan, rev: snap.Revision(),
		members: map[string]inventory.PeerMember{}, addrs: map[string]int{}, outs: map[string]int{}, ids: map[uint64]int{}}
	for n, m := range snap.PeerMembers(plan, mesh) {
		ps.members[n] = m
		ps.count(m, 1, nil)
	}
	if !plan.Static() {
		ps.list = plan.Addresses(keysOf(ps.outs))
	}
	r.byKey[key] = ps
	r.byName[name] = key
	return nil, ps, nil
}

// refs0 removes a set no group took.
func (r *setRegistry) refs0(ps *peerSet) {
	if ps.refs == 0 && r.byKey[ps.key] == ps {
		delete(r.byKey, ps.key)
		delete(r.byName, ps.name)
	}
}

// release drops a group's reference; the last one removes the set.
func (r *setRegistry) release(ps *peerSet) {
	ps.refs--
	if ps.refs <= 0 && r.byKey[ps.key] == ps {
		delete(r.byKey, ps.key)
		delete(r.byName, ps.name)
	}
}

// count adds (n = 1) or removes (n = -1) a member's part; tr, when not nil,
// records the addresses and identities that enter (+1) or leave (-1) the set.
func (ps *peerSet) count(m inventory.PeerMember, n int, tr *transitions) {
	bump := func(c map[string]int, k string, track bool) {
		before := c[k]
		if c[k] += n; c[k] <= 0 {
			delete(c, k)
		}
		if track && tr != nil && (before == 0) != (c[k] == 0) {
			tr.addrs[k] += n
		}
	}
	for _, a := range m.In {
		if ps.plan.Static() {
			bump(ps.addrs, a, true)
		}
	}
	for _, a := range m.Out {
		bump(ps.outs, a, false)
	}
	if len(m.In) > 0 {
		before := ps.ids[m.Identity]
		if ps.ids[m.Identity] += n; ps.ids[m.Identity] <= 0 {
			delete(ps.ids, m.Identity)
		}
		if tr != nil && (before == 0) != (ps.ids[m.Identity] == 0) {
			tr.ids[m.Identity] += n
		}
	}
}

// transitions are the net entries (+1) and exits (-1) of one update.
type transitions struct {
	addrs map[string]int
	ids   map[uint64]int
}

// split returns the entries and the exits, sorted.
func split[K interface{ ~string | ~uint64 }](m map[K]int) (in, out []K) {
	for k, n := range m {
		switch {
		case n > 0:
			in = append(in, k)
		case n < 0:
			out = append(out, k)
		}
	}
	slices.Sort(in)
	slices.Sort(out)
	return in, out
}

// update brings the set to snap: only the named workloads are re-evaluated
// (all of them when names is nil, after a gap in the updates). It records the
// delta, if any, at snap's revision.
func (ps *peerSet) update(snap *engine.Snapshot, names []string, all bool) {
	rev := snap.Revision()
	if rev <= ps.rev {
		return
	}
	tr := &transitions{addrs: map[string]int{}, ids: map[uint64]int{}}
	changed := false
	set := func(n string, m inventory.PeerMember, ok bool) {
		old, had := ps.members[n]
		if had == ok && (!ok || samePart(old, m)) {
			return
		}
		changed = true
		if had {
			ps.count(old, -1, tr)
			delete(ps.members, n)
		}
		if ok {
			ps.count(m, 1, tr)
			ps.members[n] = m
		}
	}
	if all {
		fresh := snap.PeerMembers(ps.plan, ps.mesh)
		for n := range ps.members {
			if _, ok := fresh[n]; !ok {
				set(n, inventory.PeerMember{}, false)
			}
		}
		for n, m := range fresh {
			set(n, m, true)
		}
	} else {
		for _, n := range names {
			m, ok := snap.PeerMember(ps.plan, ps.mesh, n)
			set(n, m, ok)
		}
	}
	ps.rev = rev
	if !changed {
		return
	}
	d := &verdictv1.AddressSetDelta{Name: ps.name}
	if ps.plan.Static() {
		d.Added, d.Removed = split(tr.addrs)
	} else {
		old := ps.list
		ps.list = ps.plan.Addresses(keysOf(ps.outs))
		d.Added, d.Removed = diffSorted(old, ps.list)
	}
	d.IdentitiesAdded, d.IdentitiesRemoved = split(tr.ids)
	ps.full, ps.encoded = nil, nil
	if len(d.Added)+len(d.Removed)+len(d.IdentitiesAdded)+len(d.IdentitiesRemoved) > 0 {
		ps.delta, ps.deltaRev = d, rev
	}
}

// deltaAt is the set's delta made at rev, or nil.
func (ps *peerSet) deltaAt(rev int64) *verdictv1.AddressSetDelta {
	if ps.deltaRev == rev {
		return ps.delta
	}
	return nil
}

// message is the set's contents, built once per change and shared.
func (ps *peerSet) message() *verdictv1.AddressSet {
	if ps.full == nil {
		ps.full = &verdictv1.AddressSet{Name: ps.name, Addresses: ps.addressList(), Identities: keysOf(ps.ids)}
	}
	return ps.full
}

// part is the set's part of a RULES message (its sets field), encoded once
// per change and shared by every group naming it; a new change makes a new
// part, never modifies one sent.
func (ps *peerSet) part() []byte {
	if ps.encoded == nil {
		ps.encoded = mustMarshal(&verdictv1.WatchRulesResponse{Sets: []*verdictv1.AddressSet{ps.message()}})
	}
	return ps.encoded
}

// addressList is the set's addresses, sorted.
func (ps *peerSet) addressList() []string {
	if !ps.plan.Static() {
		return ps.list
	}
	return keysOf(ps.addrs)
}

func samePart(a, b inventory.PeerMember) bool {
	return a.Identity == b.Identity && slices.Equal(a.In, b.In) && slices.Equal(a.Out, b.Out)
}

func keysOf[K interface{ ~string | ~uint64 }](m map[K]int) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// diffSorted returns what b adds to a and what it removes from it (both sorted).
func diffSorted[K interface{ ~string | ~uint64 }](a, b []K) (added, removed []K) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i] < b[j]:
			removed = append(removed, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			added = append(added, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}
