package index

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
)

// Matcher is a compiled selector. Entries are kept in slices (not maps): they are
// few, and a slice is smaller and faster to walk than a map.
type Matcher struct {
	Sel   *resource.Selector // as written
	Exact []TagKV            // match entries with a concrete value, and In with one value
	// The '*' entries and other expressions, which most selectors lack,
	// apart (noRest for those): 80 bytes, the 80-byte size class, where the
	// slices inline made 152 (160). Never nil; written only by compileSelector.
	*matcherRest
	Rank rank
	buf  [1]TagKV // backing store of exact for the common case (one entry), in the same allocation
}

type matcherRest struct {
	Present []string // match entries with '*'
	Exprs   []cexpr  // every other expression
}

// noRest is the matcherRest of the selectors with neither '*' entries nor
// expressions besides In of one value: shared, never written.
var noRest = &matcherRest{}

type TagKV struct{ K, V string }

type cexpr struct {
	Key      string
	Op       resource.Operator
	values   []string
	set      map[string]struct{} // In / NotIn with many values
	prefixes []netip.Prefix
}

// rank is a selector's specificity (docs/selectors.md): exact entries, other entries.
type rank struct{ Exact, wildcard int16 }

func (r rank) Total() int16 { return r.Exact + r.wildcard }

func (r rank) Add(o rank) rank { return rank{r.Exact + o.Exact, r.wildcard + o.wildcard} }

func CompileSelector(s *resource.Selector) *Matcher {
	m := &Matcher{}
	m.Compile(s)
	return m
}

// Compile fills m, a zero matcher, from s (compileSelector; a policy's
// matchers are compiled in one allocation).
func (m *Matcher) Compile(s *resource.Selector) {
	m.Sel, m.matcherRest = s, noRest
	var kb [8]string
	keys := kb[:0]
	n := 0 // exact entries
	for k, v := range s.Match {
		keys = append(keys, k)
		if v != "*" {
			n++
		}
	}
	slices.Sort(keys)
	for _, e := range s.Expressions {
		if e.Operator == resource.OpIn && len(e.Values) == 1 {
			n++
		}
	}
	if n <= len(m.buf) {
		m.Exact = m.buf[:0]
	} else {
		m.Exact = make([]TagKV, 0, n)
	}
	var present []string
	var exprs []cexpr
	for _, k := range keys {
		v := s.Match[k]
		if v == "*" {
			present = append(present, k)
			m.Rank.wildcard++
		} else {
			m.Exact = append(m.Exact, TagKV{k, v})
			m.Rank.Exact++
		}
	}
	for _, e := range s.Expressions {
		if e.Operator == resource.OpIn && len(e.Values) == 1 {
			m.Exact = append(m.Exact, TagKV{e.Key, e.Values[0]})
			m.Rank.Exact++
			continue
		}
		m.Rank.wildcard++
		ce := cexpr{Key: e.Key, Op: e.Operator, values: e.Values}
		if (e.Operator == resource.OpIn || e.Operator == resource.OpNotIn) && len(e.Values) > 8 {
			ce.set = make(map[string]struct{}, len(e.Values))
			for _, v := range e.Values {
				ce.set[v] = struct{}{}
			}
		}
		if e.Operator == resource.OpCIDR {
			for _, v := range e.Values {
				if p, err := resource.ParseCIDR(v); err == nil {
					ce.prefixes = append(ce.prefixes, p)
				}
			}
		}
		exprs = append(exprs, ce)
	}
	if len(present) > 0 || len(exprs) > 0 {
		m.matcherRest = &matcherRest{Present: present, Exprs: exprs}
	}
}

// Matches reports whether the workload's tags satisfy every part of the selector.
func (m *Matcher) Matches(tags resource.Tags) bool {
	for i := range m.Exact {
		if v, ok := tags[m.Exact[i].K]; !ok || v != m.Exact[i].V {
			return false
		}
	}
	for _, k := range m.Present {
		if _, ok := tags[k]; !ok {
			return false
		}
	}
	for i := range m.Exprs {
		if !m.Exprs[i].holds(tags) {
			return false
		}
	}
	return true
}

func (e *cexpr) holds(tags resource.Tags) bool {
	v, ok := tags[e.Key]
	switch e.Op {
	case resource.OpExists:
		return ok
	case resource.OpDoesNotExist:
		return !ok
	case resource.OpNotIn:
		return !ok || !e.contains(v)
	}
	if !ok {
		return false
	}
	switch e.Op {
	case resource.OpIn:
		return e.contains(v)
	case resource.OpPrefix:
		for _, p := range e.values {
			if strings.HasPrefix(v, p) {
				return true
			}
		}
		return false
	case resource.OpCIDR:
		a, err := netip.ParseAddr(v)
		if err != nil {
			return false
		}
		a = a.Unmap()
		for _, p := range e.prefixes {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}

func (e *cexpr) contains(v string) bool {
	if e.set != nil {
		_, ok := e.set[v]
		return ok
	}
	for _, x := range e.values {
		if x == v {
			return true
		}
	}
	return false
}

// WhyNot explains the first part of the selector the workload fails; "" when it
// matches.
func (m *Matcher) WhyNot(tags resource.Tags) string {
	for _, kv := range m.Exact {
		v, ok := tags[kv.K]
		if !ok {
			return fmt.Sprintf("tag %s is missing (want %q)", kv.K, kv.V)
		}
		if v != kv.V {
			return fmt.Sprintf("tag %s is %q, want %q", kv.K, v, kv.V)
		}
	}
	for _, k := range m.Present {
		if _, ok := tags[k]; !ok {
			return fmt.Sprintf("tag %s is missing (want any value)", k)
		}
	}
	for i := range m.Exprs {
		e := &m.Exprs[i]
		if e.holds(tags) {
			continue
		}
		v, ok := tags[e.Key]
		switch {
		case e.Op == resource.OpDoesNotExist:
			return fmt.Sprintf("tag %s is present (%q), want it absent", e.Key, v)
		case !ok:
			return fmt.Sprintf("tag %s is missing (%s %v)", e.Key, e.Op, e.values)
		default:
			return fmt.Sprintf("tag %s is %q, not %s %v", e.Key, v, e.Op, e.values)
		}
	}
	return ""
}

// MatchesPorts reports whether a flow's protocol and port fall under the entries
// (docs/selectors.md). No entries: all traffic.
func MatchesPorts(entries []resource.PortEntry, proto resource.Protocol, port uint32) bool {
	if len(entries) == 0 {
		return true
	}
	for i := range entries {
		if entryMatches(&entries[i], proto, port) {
			return true
		}
	}
	return false
}

func entryMatches(e *resource.PortEntry, proto resource.Protocol, port uint32) bool {
	if e.Protocol != resource.ProtocolAny && e.Protocol != proto {
		return false
	}
	if len(e.Ranges) == 0 || proto == resource.ICMP {
		return true
	}
	if port == 0 || port > 65535 {
		return false
	}
	for _, r := range e.Ranges {
		if uint16(port) >= r.Lo && uint16(port) <= r.Hi {
			return true
		}
	}
	return false
}
