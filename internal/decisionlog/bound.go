package decisionlog

import (
	"slices"
	"unicode/utf8"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// MaxValueBytes is the longest a tag key or value, or an endpoint's
// workload, address or principal, stays in a record that is over its size
// cap; a longer one is cut (on a rune boundary) and ends with "…".
const MaxValueBytes = 256

// recordOverhead bounds the JSON of a record's field names, punctuation,
// numbers and time: a record's line is at most this plus its strings as JSON
// (TestBoundHoldsTheCap checks it).
const recordOverhead = 768

// ellipsis ends a cut string.
const ellipsis = "…"

// bound cuts r so that its JSON line is at most max bytes: first the long
// strings of its endpoints, then the tags that do not fit (in key order),
// and marks it truncated; it reports whether it cut anything. The tag maps
// it cuts are replaced, never modified: they may be shared.
func bound(r *Record, max int) bool {
	if r.Dropped != nil {
		return false
	}
	// Escaping makes a string's JSON at most 6 times its length: most
	// records are far enough below the cap to need no closer look.
	if recordOverhead+6*rawLen(r) <= max {
		return false
	}
	fixed := recordOverhead + otherLen(r)
	src, dst := r.Source, r.Destination
	cut := false
	for _, ep := range []*verdictv1.RecordEndpoint{src, dst} {
		if ep == nil {
			continue
		}
		for _, s := range []*string{&ep.Workload, &ep.Address, &ep.Principal} {
			if len(*s) > MaxValueBytes {
				*s, cut = shorten(*s), true
			}
			fixed += jsonLen(*s)
		}
	}
	// A side's tags are measured exactly (escapes: a scan of every byte)
	// only where the decision needs it: their lengths alone are a lower
	// bound, which tells at once that tags far over the cap are cut.
	budget := max - fixed
	ls, ld := tagsMinLen(src.GetTags()), tagsMinLen(dst.GetTags())
	ts, td := ls, ld
	exact := false
	if ls+ld <= budget {
		ts, td, exact = tagsLen(src.GetTags()), tagsLen(dst.GetTags()), true
		if ts+td <= budget {
			r.Truncated = r.Truncated || cut
			return cut
		}
	}
	// Each side gets half the budget, and what the other leaves of its half.
	bs, bd := budget/2, budget-budget/2
	if !exact && ls <= bs {
		ts = tagsLen(src.GetTags())
	}
	if ts < bs {
		bd = budget - ts
	} else {
		if !exact && ld <= bd {
			td = tagsLen(dst.GetTags())
		}
		if td < bd {
			bs = budget - td
		}
	}
	// A side left at its lower bound is over its budget (ls+ld > budget:
	// the other side's budget is at most budget minus its own lower bound),
	// so it is cut, as its exact length would say.
	if ts > bs {
		src.Tags = cutTags(src.Tags, bs)
	}
	if td > bd {
		dst.Tags = cutTags(dst.Tags, bd)
	}
	r.Truncated = true
	return true
}

// cutTags is a new map of tags' pairs, in key order, each shortened, as far
// as they fit in budget bytes of JSON.
func cutTags(tags map[string]string, budget int) map[string]string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(map[string]string)
	for _, k := range keys {
		v := tags[k]
		if len(k) > MaxValueBytes {
			k = shorten(k)
		}
		if len(v) > MaxValueBytes {
			v = shorten(v)
		}
		n := jsonLen(k) + jsonLen(v) + 2
		if n > budget {
			continue // a shorter pair further on may fit
		}
		budget -= n
		out[k] = v
	}
	return out
}

// shorten cuts s to at most MaxValueBytes, on a rune boundary, ending it
// with an ellipsis; the result shares no memory with s.
func shorten(s string) string {
	i := MaxValueBytes - len(ellipsis)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + ellipsis // a new string
}

// jsonLen is the length of s as a JSON string: quotes, escapes (protojson
// escapes '"', '\\' and the control characters) included. It runs on the
// decision path, over every tag of a record near its cap (64 tags of 1 KiB
// a side): eight bytes at a time, byte by byte only for a string that holds
// a byte to escape.
func jsonLen(s string) int {
	if !mayEscape(s) {
		return len(s) + 2
	}
	return jsonLenSlow(s)
}

// Bytes of eight lanes, for mayEscape.
const (
	lanes01 = 0x0101010101010101
	lanes80 = 0x8080808080808080
)

// mayEscape reports whether s holds a byte JSON escapes: '"', '\\' or one
// below 0x20. Eight bytes at a time: a lane below n shows in
// (x - n·lanes01) &^ x & lanes80 (borrows can add lanes only above a lane
// that shows, so the word is zero exactly when no lane is below n).
func mayEscape(s string) bool {
	below := func(x, n uint64) bool { return (x-n*lanes01)&^x&lanes80 != 0 }
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if below(x, 0x20) || below(x^('"'*lanes01), 1) || below(x^('\\'*lanes01), 1) {
			return true
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return true
		}
	}
	return false
}

// jsonLenSlow is jsonLen byte by byte.
func jsonLenSlow(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			n++
		case c < 0x20:
			n += 5
		}
	}
	return n
}

// tagsMinLen is at most tagsLen(tags): each pair's JSON without escapes.
func tagsMinLen(tags map[string]string) int {
	n := 0
	for k, v := range tags {
		n += len(k) + len(v) + 6
	}
	return n
}

func tagsLen(tags map[string]string) int {
	n := 0
	for k, v := range tags {
		n += jsonLen(k) + jsonLen(v) + 2
	}
	return n
}

// rawLen is the length of every string of r.
func rawLen(r *Record) int {
	n := len(r.Rpc) + len(r.Mesh) + len(r.Type) + len(r.Protocol) + len(r.Action) + len(r.Policy)
	for _, ep := range []*verdictv1.RecordEndpoint{r.Source, r.Destination} {
		n += len(ep.GetWorkload()) + len(ep.GetAddress()) + len(ep.GetPrincipal())
		for k, v := range ep.GetTags() {
			n += len(k) + len(v)
		}
	}
	for _, s := range []*verdictv1.RecordSide{r.Outbound, r.Inbound} {
		n += len(s.GetAction()) + len(s.GetPolicy()) + len(s.GetScope()) + len(s.GetRule()) + len(s.GetReason())
	}
	a := r.Audit
	n += len(a.GetAction()) + len(a.GetPolicy()) + len(a.GetScope()) + len(a.GetRule()) + len(a.GetSide())
	return n + len(r.Caller.GetAddress()) + len(r.Caller.GetIdentity())
}

// otherLen is the JSON length of r's strings outside its endpoints.
func otherLen(r *Record) int {
	n := 0
	for _, s := range []string{r.Rpc, r.Mesh, r.Type, r.Protocol, r.Action, r.Policy,
		r.Outbound.GetAction(), r.Outbound.GetPolicy(), r.Outbound.GetScope(), r.Outbound.GetRule(), r.Outbound.GetReason(),
		r.Inbound.GetAction(), r.Inbound.GetPolicy(), r.Inbound.GetScope(), r.Inbound.GetRule(), r.Inbound.GetReason(),
		r.Audit.GetAction(), r.Audit.GetPolicy(), r.Audit.GetScope(), r.Audit.GetRule(), r.Audit.GetSide(),
		r.Caller.GetAddress(), r.Caller.GetIdentity()} {
		n += jsonLen(s)
	}
	return n
}
