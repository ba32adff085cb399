package analysis

// Endpoints outside the inventory (docs/analysis.md, "Outside"): an address
// no workload holds resolves to {ip: ADDR}, a principal no workload holds to
// {principal: ID} or, in Kuma's spiffe://<mesh>/<service> form, to
// {kuma.io/service: <service>, principal: ID}. The selectors of a partition
// test those values through a finite set of conditions (keyConds), so the
// outside splits into finitely many classes decided alike: address ranges
// between the bounds of the CIDRs and addresses the selectors name, and
// principal patterns between the values and prefixes they name. Each class is
// decided once, on a representative.

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Outside names a class of endpoints outside the inventory. Exactly one of
// Any, CIDR and Principal is set.
type Outside struct {
	// Any: every address no workload of the mesh holds.
	Any bool
	// CIDR: the addresses of the block that no workload holds.
	CIDR string
	// Principal: a principal no workload holds, by pattern: an exact ID;
	// "P*", the principals starting with P (in Kuma's form
	// spiffe://<mesh>/<service> when P starts with spiffe://<mesh>/);
	// "P*/*", those starting with P with a further path segment (not
	// Kuma's form). A principal belongs to its most specific pattern: an
	// exact ID first, then the longest P. Except lists the more specific
	// patterns under this one that are answered otherwise.
	Principal string
	Except    []string
}

// String is the class as text: "any address", "10.0.0.0/16",
// "principal spiffe://shop/web*".
func (o Outside) String() string {
	switch {
	case o.Any:
		return "any address"
	case o.CIDR != "":
		return o.CIDR
	}
	s := "principal " + o.Principal
	if len(o.Except) > 0 {
		s += " except " + strings.Join(o.Except, ", ")
	}
	return s
}

// outsideClass is one class of outside endpoints and the endpoint it is
// decided on.
type outsideClass struct {
	lo, hi  netip.Addr // an address range (valid lo), or
	pattern string     // a principal pattern
	prefix  string     // the pattern's prefix (prefix patterns)
	rep     inventory.Endpoint
}

// OutsideClasses returns the classes of outside endpoints of a partition
// with a representative endpoint of each, for the tests that hold Reach to
// Decide: every address or principal the inventory does not hold is decided
// as the representative of ClassifyOutside's answer.
func (b *Bulk) OutsideClasses() ([]Outside, []inventory.Endpoint, []string) {
	classes, notes := b.outsideClasses()
	out := make([]Outside, len(classes))
	reps := make([]inventory.Endpoint, len(classes))
	for i, c := range classes {
		out[i] = c.outside()
		reps[i] = c.rep
	}
	return out, reps, notes
}

func (c *outsideClass) outside() Outside {
	if c.lo.IsValid() {
		return Outside{CIDR: fmt.Sprintf("%s-%s", c.lo, c.hi)}
	}
	return Outside{Principal: c.pattern}
}

// ClassifyOutside returns the index, among OutsideClasses, of the class an
// outside endpoint (an address or a principal) belongs to; -1 when none does
// (a held address or principal is inside).
func (b *Bulk) ClassifyOutside(ep inventory.Endpoint) int {
	classes, _ := b.outsideClasses()
	if ep.Address != "" {
		a, err := netip.ParseAddr(ep.Address)
		if err != nil {
			return -1
		}
		a = a.Unmap()
		for i, c := range classes {
			if c.lo.IsValid() && c.lo.Compare(a) <= 0 && a.Compare(c.hi) <= 0 {
				return i
			}
		}
		return -1
	}
	pat := b.principalPattern(ep.Principal)
	for i, c := range classes {
		if !c.lo.IsValid() && c.pattern == pat {
			return i
		}
	}
	return -1
}

// outsideClasses computes (once) the partition's outside classes.
func (b *Bulk) outsideClasses() ([]outsideClass, []string) {
	if b.outside != nil || b.outsideNotes != nil {
		return b.outside, b.outsideNotes
	}
	inv := b.p.Inventory()
	atoms, notes := addressAtoms(b.outConds[resource.IPTag], func(a netip.Addr) bool {
		_, held := inv.Owner(a.String())
		return held
	})
	pcs, pnotes := b.principalClasses(func(id string) bool {
		_, held := inv.Principal(id)
		return held
	})
	b.outside = append(atoms, pcs...)
	b.outsideNotes = append(append([]string{}, notes...), pnotes...)
	return b.outside, b.outsideNotes
}

// addressAtoms splits both address families at every bound the conditions
// on ip name, and returns each range with its first address no workload
// holds (ranges held whole are left out).
func addressAtoms(c *keyConds, held func(netip.Addr) bool) ([]outsideClass, []string) {
	type span struct{ lo, hi netip.Addr }
	var spans []span
	var notes []string
	v4lo, v4hi := netip.AddrFrom4([4]byte{}), netip.AddrFrom4([4]byte{255, 255, 255, 255})
	v6lo, v6hi := netip.IPv6Unspecified(), netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	// IPv4-mapped IPv6 addresses are unmapped by every resolution: that
	// block holds no outside endpoint.
	mapped := netip.MustParsePrefix("::ffff:0:0/96")
	spans = append(spans, span{mapped.Addr(), lastAddr(mapped)})
	if c != nil {
		for v := range c.named {
			if a, err := netip.ParseAddr(v); err == nil && a.String() == v {
				spans = append(spans, span{a, a})
			}
		}
		for _, p := range c.cidrs {
			spans = append(spans, span{p.Masked().Addr(), lastAddr(p)})
		}
		for _, p := range c.prefixes {
			for _, r := range v4TextPrefix(p) {
				spans = append(spans, span{r[0], r[1]})
			}
			r6, ok := v6TextPrefix(p)
			if !ok {
				notes = append(notes, fmt.Sprintf("the prefix %q on ip can match IPv6 addresses in ways not split here: IPv6 addresses are left out", p))
				v6lo = netip.Addr{}
			}
			for _, r := range r6 {
				spans = append(spans, span{r[0], r[1]})
			}
		}
	}
	var out []outsideClass
	for _, fam := range [][2]netip.Addr{{v4lo, v4hi}, {v6lo, v6hi}} {
		if !fam[0].IsValid() {
			continue
		}
		cuts := []netip.Addr{fam[0]}
		for _, s := range spans {
			if s.lo.Is4() != fam[0].Is4() {
				continue
			}
			cuts = append(cuts, s.lo)
			if s.hi != fam[1] {
				cuts = append(cuts, s.hi.Next())
			}
		}
		slices.SortFunc(cuts, netip.Addr.Compare)
		cuts = slices.Compact(cuts)
		for i, lo := range cuts {
			hi := fam[1]
			if i+1 < len(cuts) {
				hi = cuts[i+1].Prev()
			}
			if mapped.Contains(lo) && mapped.Contains(hi) {
				continue
			}
			rep, ok := lo, false
			for n := 0; n < 4096 && rep.IsValid() && rep.Compare(hi) <= 0; n++ {
				if !held(rep) {
					ok = true
					break
				}
				rep = rep.Next()
			}
			if !ok {
				continue // held whole (or nearly: a range of more than 4096 held addresses is not searched)
			}
			out = append(out, outsideClass{lo: lo, hi: hi, rep: inventory.Endpoint{Address: rep.String()}})
		}
	}
	return out, notes
}

// lastAddr is the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// v4TextPrefix returns the IPv4 ranges whose dotted text starts with p.
func v4TextPrefix(p string) [][2]netip.Addr {
	var out [][2]netip.Addr
	var walk func(octets []byte, rest string)
	walk = func(octets []byte, rest string) {
		level := len(octets)
		for o := 0; o < 256; o++ {
			s := strconv.Itoa(o)
			next := append(append([]byte{}, octets...), byte(o))
			switch {
			case len(rest) <= len(s) && strings.HasPrefix(s, rest):
				lo, hi := [4]byte{}, [4]byte{255, 255, 255, 255}
				copy(lo[:], next)
				copy(hi[:], next)
				out = append(out, [2]netip.Addr{netip.AddrFrom4(lo), netip.AddrFrom4(hi)})
			case level < 3 && strings.HasPrefix(rest, s+"."):
				walk(next, rest[len(s)+1:])
			}
		}
	}
	walk(nil, p)
	return out
}

// v6TextPrefix returns the IPv6 ranges whose canonical text starts with p;
// false when p could match in ways this does not split (a colon, a leading
// zero).
func v6TextPrefix(p string) ([][2]netip.Addr, bool) {
	if p == "" {
		return [][2]netip.Addr{{netip.IPv6Unspecified(), lastAddr(netip.MustParsePrefix("::/0"))}}, true
	}
	for _, r := range p {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return nil, !strings.ContainsRune(p, ':') // a dot or another character: no IPv6 text
		}
	}
	if p[0] == '0' {
		return nil, false
	}
	// The first group, printed without leading zeros (a zero first group
	// prints "0" or "::", which p does not start with).
	var out [][2]netip.Addr
	for g := 1; g < 1<<16; g++ {
		if !strings.HasPrefix(strconv.FormatUint(uint64(g), 16), p) {
			continue
		}
		var lo, hi [16]byte
		lo[0], lo[1] = byte(g>>8), byte(g)
		hi = [16]byte{byte(g >> 8), byte(g), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		out = append(out, [2]netip.Addr{netip.AddrFrom16(lo), netip.AddrFrom16(hi)})
	}
	return out, true
}

// rangeCIDRs returns the fewest CIDR blocks covering lo..hi exactly.
func rangeCIDRs(lo, hi netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for lo.IsValid() && lo.Compare(hi) <= 0 {
		for bits := 0; bits <= lo.BitLen(); bits++ {
			p := netip.PrefixFrom(lo, bits)
			if p.Masked().Addr() != lo || lastAddr(p).Compare(hi) > 0 {
				continue
			}
			out = append(out, p)
			last := lastAddr(p)
			if last.Compare(hi) == 0 {
				return out
			}
			lo = last.Next()
			break
		}
	}
	return out
}

// principalSets are the values and prefixes principal patterns split at:
// the principals the selectors name, Kuma's form for the services they
// name, and the prefixes of both.
func (b *Bulk) principalSets() (exact map[string]bool, prefixes []string, kuma string) {
	kuma = "spiffe://" + b.mesh + "/"
	exact = map[string]bool{}
	prefixes = []string{"", kuma}
	if c := b.outConds[resource.PrincipalTag]; c != nil {
		for v := range c.named {
			exact[v] = true
		}
		prefixes = append(prefixes, c.prefixes...)
	}
	if c := b.outConds[resource.ServiceTag]; c != nil {
		for v := range c.named {
			exact[kuma+v] = true
		}
		for _, q := range c.prefixes {
			prefixes = append(prefixes, kuma+q)
		}
	}
	for _, p := range prefixes {
		if p != "" {
			exact[p] = true
		}
	}
	slices.Sort(prefixes)
	prefixes = slices.Compact(prefixes)
	return exact, prefixes, kuma
}

// principalPattern is the pattern a principal belongs to.
func (b *Bulk) principalPattern(id string) string {
	exact, prefixes, kuma := b.principalSets()
	if exact[id] {
		return id
	}
	longest := ""
	for _, p := range prefixes {
		if strings.HasPrefix(id, p) && len(p) > len(longest) {
			longest = p
		}
	}
	if strings.HasPrefix(longest, kuma) {
		if _, ok := inventory.KumaSpiffeService(b.mesh, id); !ok {
			return longest + "*/*"
		}
	}
	return longest + "*"
}

// principalClasses returns a class per principal pattern that some
// principal no workload holds belongs to.
func (b *Bulk) principalClasses(held func(string) bool) ([]outsideClass, []string) {
	var notes []string
	for _, k := range []string{resource.PrincipalTag, resource.ServiceTag} {
		if c := b.outConds[k]; c != nil && len(c.cidrs) > 0 {
			notes = append(notes, fmt.Sprintf("a CIDR test on %s is not split by principal patterns: a pattern may hold principals answered otherwise", k))
		}
	}
	exact, prefixes, kuma := b.principalSets()
	var out []outsideClass
	ids := make([]string, 0, len(exact))
	for id := range exact {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if id == "" || held(id) || resource.CheckTagValue(id, false) != nil {
			continue
		}
		out = append(out, outsideClass{pattern: id, rep: inventory.Endpoint{Principal: id}})
	}
	stems := []string{"zz", "q-", "x_", "Z", "~", "9", "-"}
	for _, p := range prefixes {
		variants := []string{""}
		if strings.HasPrefix(p, kuma) {
			variants = append(variants, "/x")
		}
		for _, tail := range variants {
			want := p + "*"
			if tail != "" {
				want = p + "*/*"
			}
			found := false
			for n := 0; n < 64 && !found; n++ {
				rep := p + stems[n%len(stems)] + strconv.Itoa(n) + tail
				if exact[rep] || held(rep) || b.principalPattern(rep) != want || resource.CheckTagValue(rep, false) != nil {
					continue
				}
				out = append(out, outsideClass{pattern: want, prefix: p, rep: inventory.Endpoint{Principal: rep}})
				found = true
			}
		}
	}
	return out, notes
}
