package analysis

// The space lint reasons over (docs/lint.md, "Exact over every tag set"):
// every flow of a partition, not only the inventory's. A decision reads a
// tag set only through the conditions of the partition's selectors, key by
// key, so per key the values fall into finitely many value classes that
// every condition treats alike: the key absent, each value a selector names,
// and the values no selector names split by which prefixes and CIDRs they
// fall under (each CIDR cut into disjoint address ranges). The ports fall
// into port classes the same way. A selector is then a conjunction of
// per-key sets of classes, a rule's match region a product of such sets (a
// box), and whether a rule can decide a flow is a formula over boxes that a
// small splitting search settles exactly: it evaluates the formula on a box
// with three values (holds everywhere, nowhere, or not yet known), and
// splits the box on a condition it could not settle, until every part is
// settled or the search's budget is spent ("not proven").

import (
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// classSet is a set of value classes (or port classes), one bit each.
type classSet []uint64

func fullSet(n int) classSet {
	s := make(classSet, (n+63)/64)
	for i := 0; i < n; i++ {
		s[i/64] |= 1 << (i % 64)
	}
	return s
}

func (s classSet) set(i int) { s[i/64] |= 1 << (i % 64) }

func (s classSet) empty() bool {
	for _, w := range s {
		if w != 0 {
			return false
		}
	}
	return true
}

// subsetOf reports whether s ⊆ t.
func (s classSet) subsetOf(t classSet) bool {
	for i, w := range s {
		if w&^t[i] != 0 {
			return false
		}
	}
	return true
}

func (s classSet) disjoint(t classSet) bool {
	for i, w := range s {
		if w&t[i] != 0 {
			return false
		}
	}
	return true
}

func (s classSet) and(t classSet) classSet {
	out := make(classSet, len(s))
	for i := range s {
		out[i] = s[i] & t[i]
	}
	return out
}

func (s classSet) andNot(t classSet) classSet {
	out := make(classSet, len(s))
	for i := range s {
		out[i] = s[i] &^ t[i]
	}
	return out
}

// first is the smallest class of s; -1 when empty.
func (s classSet) first() int {
	for i, w := range s {
		if w != 0 {
			return i*64 + bits.TrailingZeros64(w)
		}
	}
	return -1
}

// keySpace is the value classes of one tag key: class 0 is the key absent,
// then each named value, then one representative of each other class.
type keySpace struct {
	key    string
	reps   []string       // per class, a value of it ("" for class 0)
	named  map[string]int // named value → its class
	approx bool           // the classes may not split the key exactly (docs/lint.md)
	full   classSet
}

// newKeySpace computes the classes of a key from its conditions.
func newKeySpace(k string, c *keyConds) *keySpace {
	ks := &keySpace{key: k, reps: []string{""}, named: map[string]int{}}
	names := make([]string, 0, len(c.named))
	for v := range c.named {
		names = append(names, v)
	}
	slices.Sort(names)
	for _, v := range names {
		ks.named[v] = len(ks.reps)
		ks.reps = append(ks.reps, v)
	}
	seen := map[string]bool{}
	add := func(v string) {
		if _, ok := ks.named[v]; ok || v == "" || resource.CheckTagValue(v, false) != nil {
			return
		}
		sig := c.signature(v)
		if seen[sig] {
			return
		}
		seen[sig] = true
		ks.reps = append(ks.reps, v)
	}
	// Values that are not addresses: a class per longest prefix a value can
	// start with (the prefixes a value starts with are the prefixes of its
	// longest one), "" for none.
	prefixes := append([]string{""}, c.prefixes...)
	slices.Sort(prefixes)
	prefixes = slices.Compact(prefixes)
	for _, p := range prefixes {
		next := map[byte]bool{}
		for _, q := range prefixes {
			if len(q) > len(p) && strings.HasPrefix(q, p) {
				next[q[len(p)]] = true
			}
		}
		for _, ch := range []byte("~x_z!#") {
			if next[ch] {
				continue
			}
			base := p + string(ch)
			v := base
			for n := 0; ks.named[v] != 0 && n < 64; n++ {
				v = base + strconv.Itoa(n)
			}
			add(v)
			break
		}
	}
	// Addresses: a class per range between the bounds of the CIDRs and the
	// addresses named, represented by an address of it no selector names.
	if len(c.cidrs) > 0 {
		atoms, _ := addressAtoms(c, func(netip.Addr) bool { return false })
		for _, a := range atoms {
			rep := a.lo
			for n := 0; n < 4 && rep.IsValid() && rep.Compare(a.hi) <= 0; n++ {
				if _, ok := ks.named[rep.String()]; !ok {
					break
				}
				rep = rep.Next()
			}
			switch {
			case rep.IsValid() && rep.Compare(a.hi) <= 0 && ks.named[rep.String()] == 0:
				add(rep.String())
			case a.lo.Is4():
				add("::ffff:" + a.lo.String()) // the same address, written otherwise
			}
		}
		// Prefixes test the text and CIDRs the address: an address has
		// several texts (IPv6 case, zeros, the IPv4-mapped form), which the
		// classes above do not all tell apart.
		ks.approx = len(c.prefixes) > 0
	}
	ks.full = fullSet(len(ks.reps))
	return ks
}

// setOf returns the classes of the key that satisfy one expression.
func (ks *keySpace) setOf(e *resource.Expression) classSet {
	s := make(classSet, len(ks.full))
	if (e.Operator == resource.OpIn) && len(e.Values) <= 8 {
		for _, v := range e.Values {
			if i, ok := ks.named[v]; ok {
				s.set(i)
			}
		}
		return s
	}
	m := index.CompileSelector(&resource.Selector{Expressions: []resource.Expression{*e}})
	for i, v := range ks.reps {
		t := resource.Tags{}
		if i > 0 {
			t[ks.key] = v
		}
		if m.Matches(t) {
			s.set(i)
		}
	}
	return s
}

// portSpace is the port classes of a partition: per protocol (TCP, UDP and
// none), no port, then each range between the bounds the policies name;
// ICMP, which ignores ports, is one class.
type portSpace struct {
	reps []portKey
	full classSet
}

func newPortSpace(p *engine.Partition, policies bool) *portSpace {
	cuts := map[uint32]bool{1: true}
	if policies {
		for pv := range p.Policies() {
			for _, e := range pv.Doc.Ports {
				ranges := e.Ranges
				if ranges == nil && e.Ports != "" {
					ranges, _ = resource.ParsePortRanges(e.Ports)
				}
				for _, r := range ranges {
					cuts[uint32(r.Lo)] = true
					if r.Hi < 65535 {
						cuts[uint32(r.Hi)+1] = true
					}
				}
			}
		}
	}
	points := make([]uint32, 0, len(cuts))
	for p := range cuts {
		points = append(points, p)
	}
	slices.Sort(points)
	ps := &portSpace{}
	for _, proto := range []resource.Protocol{resource.TCP, resource.UDP, resource.ProtocolAny} {
		ps.reps = append(ps.reps, portKey{proto, 0})
		for _, p := range points {
			ps.reps = append(ps.reps, portKey{proto, p})
		}
	}
	ps.reps = append(ps.reps, portKey{resource.ICMP, 0})
	ps.full = fullSet(len(ps.reps))
	return ps
}

func (ps *portSpace) setOf(entries []resource.PortEntry) classSet {
	if len(entries) == 0 {
		return ps.full
	}
	s := make(classSet, len(ps.full))
	for i, r := range ps.reps {
		if index.MatchesPorts(entries, r.proto, r.port) {
			s.set(i)
		}
	}
	return s
}

// space is the flows of one partition: a key space per key any selector of
// it names (on either end), and the port classes.
type space struct {
	keys  []*keySpace
	byKey map[string]int
	ports *portSpace
}

// dims is the number of dimensions of a box: each key on each end, and the
// ports.
func (sp *space) dims() int { return 2*len(sp.keys) + 1 }

func (sp *space) portDim() int { return 2 * len(sp.keys) }

// newSpace is the space of a partition's flows: those its scopes' and, with
// policies, its policies' selectors and ports tell apart.
func newSpace(p *engine.Partition, policies bool) *space {
	conds := conditionsOf(p, policies)
	keys := make([]string, 0, len(conds))
	for k := range conds {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	sp := &space{byKey: map[string]int{}, ports: newPortSpace(p, policies)}
	for _, k := range keys {
		sp.byKey[k] = len(sp.keys)
		sp.keys = append(sp.keys, newKeySpace(k, conds[k]))
	}
	return sp
}

// atom is one condition: the flow's class on one dimension is in set.
type atom struct {
	dim int
	set classSet
}

// conj is a conjunction of atoms, at most one per dimension; nil holds
// everywhere.
type conj []atom

// selectorConj compiles a selector on an end (0 source, 1 destination) into
// a conjunction; ok false when it can never hold.
func (sp *space) selectorConj(s *resource.Selector, end int) (conj, bool) {
	if s == nil {
		return nil, true
	}
	sets := map[int]classSet{}
	put := func(k string, set classSet) {
		i := sp.byKey[k]
		if old, ok := sets[i]; ok {
			set = old.and(set)
		}
		sets[i] = set
	}
	for k, v := range s.Match {
		ks := sp.keys[sp.byKey[k]]
		if v == "*" {
			put(k, ks.full.andNot(single(len(ks.reps), 0)))
			continue
		}
		put(k, single(len(ks.reps), ks.named[v]))
	}
	for i := range s.Expressions {
		e := &s.Expressions[i]
		put(e.Key, sp.keys[sp.byKey[e.Key]].setOf(e))
	}
	out := make(conj, 0, len(sets))
	for i, set := range sets {
		if set.empty() {
			return nil, false
		}
		if set.subsetOf(sp.keys[i].full) && sp.keys[i].full.subsetOf(set) {
			continue // holds for every class
		}
		out = append(out, atom{dim: end*len(sp.keys) + i, set: set})
	}
	slices.SortFunc(out, func(a, b atom) int { return a.dim - b.dim })
	return out, true
}

func single(n, i int) classSet {
	s := make(classSet, (n+63)/64)
	s.set(i)
	return s
}

// and is the conjunction of two conjunctions; ok false when it is empty.
func (c conj) and(d conj) (conj, bool) {
	out := make(conj, 0, len(c)+len(d))
	i, j := 0, 0
	for i < len(c) || j < len(d) {
		switch {
		case j == len(d) || i < len(c) && c[i].dim < d[j].dim:
			out = append(out, c[i])
			i++
		case i == len(c) || d[j].dim < c[i].dim:
			out = append(out, d[j])
			j++
		default:
			s := c[i].set.and(d[j].set)
			if s.empty() {
				return nil, false
			}
			out = append(out, atom{dim: c[i].dim, set: s})
			i++
			j++
		}
	}
	return out, true
}

// box is a product of class sets, one per dimension (nil: every class).
type box []classSet

func (sp *space) fullBox() box { return make(box, sp.dims()) }

func (sp *space) dimFull(d int) classSet {
	if d == sp.portDim() {
		return sp.ports.full
	}
	return sp.keys[d%len(sp.keys)].full
}

func (b box) get(sp *space, d int) classSet {
	if b[d] == nil {
		return sp.dimFull(d)
	}
	return b[d]
}

// with returns a copy of b with dimension d set to s.
func (b box) with(d int, s classSet) box {
	out := slices.Clone(b)
	out[d] = s
	return out
}

// restrict returns b within c; ok false when that is empty.
func (b box) restrict(sp *space, c conj) (box, bool) {
	out := slices.Clone(b)
	for _, a := range c {
		s := out.get(sp, a.dim).and(a.set)
		if s.empty() {
			return nil, false
		}
		out[a.dim] = s
	}
	return out, true
}

// tri is a three-valued truth: a formula on a box holds everywhere,
// nowhere, or in part.
type tri uint8

const (
	triNo tri = iota
	triYes
	triPart
)

// evalConj evaluates a conjunction on a box; on triPart, split is an atom
// the box straddles.
func (sp *space) evalConj(c conj, b box) (tri, *atom) {
	out := triYes
	var split *atom
	for i := range c {
		a := &c[i]
		s := b.get(sp, a.dim)
		switch {
		case s.subsetOf(a.set):
		case s.disjoint(a.set):
			return triNo, nil
		default:
			if split == nil {
				split = a
			}
			out = triPart
		}
	}
	return out, split
}

// pred is a formula over flows: a conjunction, or the and, or, not of
// formulas. Lint's formulas are small: a rule's match, a scope's
// membership, whether a side is examined at all.
type pred struct {
	op   uint8
	c    conj
	kids []*pred
}

const (
	opConj uint8 = iota
	opAnd
	opOr
	opNot
)

var predTrue = &pred{op: opConj}

var predFalse = &pred{op: opOr}

func conjPred(c conj) *pred { return &pred{op: opConj, c: c} }

func andPred(kids ...*pred) *pred {
	var out []*pred
	for _, k := range kids {
		switch {
		case k == predTrue:
		case k == predFalse:
			return predFalse
		default:
			out = append(out, k)
		}
	}
	switch len(out) {
	case 0:
		return predTrue
	case 1:
		return out[0]
	}
	return &pred{op: opAnd, kids: out}
}

func orPred(kids ...*pred) *pred {
	var out []*pred
	for _, k := range kids {
		switch {
		case k == predFalse:
		case k == predTrue:
			return predTrue
		default:
			out = append(out, k)
		}
	}
	switch len(out) {
	case 0:
		return predFalse
	case 1:
		return out[0]
	}
	return &pred{op: opOr, kids: out}
}

func notPred(k *pred) *pred {
	switch k {
	case predTrue:
		return predFalse
	case predFalse:
		return predTrue
	}
	if k.op == opNot {
		return k.kids[0]
	}
	return &pred{op: opNot, kids: []*pred{k}}
}

// eval evaluates p on a box; on triPart, split is an atom the box straddles.
func (sp *space) eval(p *pred, b box) (tri, *atom) {
	switch p.op {
	case opConj:
		return sp.evalConj(p.c, b)
	case opNot:
		v, a := sp.eval(p.kids[0], b)
		switch v {
		case triYes:
			return triNo, nil
		case triNo:
			return triYes, nil
		}
		return v, a
	}
	and := p.op == opAnd
	out := triNo
	if and {
		out = triYes
	}
	var split *atom
	for _, k := range p.kids {
		v, a := sp.eval(k, b)
		switch {
		case v == triPart:
			out = triPart
			if split == nil {
				split = a
			}
		case and && v == triNo:
			return triNo, nil
		case !and && v == triYes:
			return triYes, nil
		}
	}
	return out, split
}

// split divides b on an atom it straddles: the part inside, the part outside.
func (sp *space) split(b box, a *atom) (box, box) {
	s := b.get(sp, a.dim)
	return b.with(a.dim, s.and(a.set)), b.with(a.dim, s.andNot(a.set))
}

// point picks one flow of a non-empty box: per key the smallest class (the
// key absent when it may be, else a named value before the others), the
// first port class.
func (sp *space) point(b box) (src, dst resource.Tags, proto resource.Protocol, port uint32) {
	src, dst = resource.Tags{}, resource.Tags{}
	for end, t := range [2]resource.Tags{src, dst} {
		for i, ks := range sp.keys {
			c := b.get(sp, end*len(sp.keys)+i).first()
			if c > 0 {
				t[ks.key] = ks.reps[c]
			}
		}
	}
	r := sp.ports.reps[b.get(sp, sp.portDim()).first()]
	return src, dst, r.proto, r.port
}

// pointBox narrows a box to the point that point picks.
func (sp *space) pointBox(b box) box {
	n := 0
	for d := range b {
		n += len(sp.dimFull(d))
	}
	return sp.pointInto(make(box, len(b)), make(classSet, n), b)
}

// pointInto is pointBox written into out, its sets cut from words (as
// many words as every dimension's full set together).
func (sp *space) pointInto(out box, words classSet, b box) box {
	clear(words)
	for d := range out {
		s := b.get(sp, d)
		out[d], words = words[:len(s):len(s)], words[len(s):]
		out[d].set(s.first())
	}
	return out
}
