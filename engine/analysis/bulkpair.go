package analysis

// One pair of classes on many classes of flows (Matrix, Impact's pairs): a
// decision reads the protocol and port only through the rules whose ports
// match, so the flows of one pair share everything else — the scopes each
// end is a member of, the rules both ends satisfy (the AND of their masks,
// taken once) — and two classes of flows whose rules that match both ends
// and the port are the same rules are decided alike: decided once, copied.

import (
	"slices"

	"github.com/verdictpdp/verdict/engine"
)

// pairScan is the state DecidePorts keeps between calls.
type pairScan struct {
	pair [2]mask // per rule list, the rules both ends satisfy
	// per class of the last classes given (by identity), per rule list,
	// the rules whose ports match
	classes []FlowClass
	ports   [][2][]uint64
	// per class decided in this call, the rules matching both ends and the
	// port, to find a class decided alike
	seen []seenClass
	buf  []uint64
}

// DecidePorts decides the flows from class src to class dst on each of
// classes into out (len(classes)): out[i] is Decide's answer for every flow
// between tag sets of those classes on a protocol and port of classes[i].
// It is Decide for each class, sharing what the pair's flows share.
func (b *Bulk) DecidePorts(src, dst ClassID, classes []FlowClass, out []engine.Decision) {
	b.decisions += len(classes)
	pair := b.p.Pair(b.tags[src], b.tags[dst])
	defer pair.Release()
	var scan *bulkScan
	if !b.closed {
		scan = b.preparePair(src, dst, classes)
	}
	var pre engine.Prefilter
	if scan != nil {
		pre = scan
	}
	// Without PerDestination, the port is read through the masks alone.
	share := !b.p.Settings().PerDestination && !b.closed
	ps := &b.pair
	ps.seen, ps.buf = ps.seen[:0], ps.buf[:0]
	for i, c := range classes {
		if scan != nil {
			for l := range scan.lists {
				scan.lists[l].port = ps.ports[i][l]
			}
		}
		if share {
			if j, ok := ps.alike(scan, i); ok {
				out[i] = out[j]
				continue
			}
		}
		pair.Decide(c.Protocol, c.Port, pre, &out[i])
	}
}

// preparePair sets b.scan to the pair's masks (both ends the AND of the
// two), and the port masks of classes; nil when the partition has no rule.
func (b *Bulk) preparePair(src, dst ClassID, classes []FlowClass) *bulkScan {
	if !b.buildBits() {
		return nil
	}
	ps := &b.pair
	if len(ps.classes) != len(classes) || len(classes) > 0 && &ps.classes[0] != &classes[0] {
		ps.classes = classes
		ps.ports = make([][2][]uint64, len(classes))
		for i, c := range classes {
			for l, rb := range b.bits {
				if rb != nil {
					ps.ports[i][l] = rb.portMask(c.Protocol, c.Port)
				}
			}
		}
	}
	for l, rb := range b.bits {
		sl := &b.scan.lists[l]
		sl.rb = rb
		if rb == nil {
			continue
		}
		s, d := rb.mask(0, src, b.tags[src], true), rb.mask(1, dst, b.tags[dst], true)
		pm := &ps.pair[l]
		if len(pm.bits) != rb.words {
			pm.bits = make([]uint64, rb.words)
		}
		for _, w := range pm.words {
			pm.bits[w] = 0
		}
		pm.words = pm.words[:0]
		words := s.words
		if len(d.words) < len(words) {
			words = d.words
		}
		for _, w := range words {
			if x := s.bits[w] & d.bits[w]; x != 0 {
				pm.bits[w] = x
				pm.words = append(pm.words, w)
			}
		}
		sl.ends = [2]*mask{pm, pm}
	}
	return &b.scan
}

// alike returns an earlier class of this call whose rules matching both
// ends and the port are class i's, in every list; else it records class
// i's: its non-zero words as (word, bits) pairs, per list, in buf.
func (ps *pairScan) alike(scan *bulkScan, i int) (int, bool) {
	from := len(ps.buf)
	var ends [2]int
	if scan != nil {
		for l := range scan.lists {
			if sl := &scan.lists[l]; sl.rb != nil {
				pm := sl.ends[0]
				for _, w := range pm.words {
					if x := pm.bits[w] & sl.port[w]; x != 0 {
						ps.buf = append(ps.buf, uint64(w), x)
					}
				}
			}
			ends[l] = len(ps.buf)
		}
	} else {
		ends = [2]int{from, from}
	}
	for _, s := range ps.seen {
		if slices.Equal(ps.buf[s.from:s.ends[0]], ps.buf[from:ends[0]]) && slices.Equal(ps.buf[s.ends[0]:s.ends[1]], ps.buf[ends[0]:ends[1]]) {
			ps.buf = ps.buf[:from]
			return s.class, true
		}
	}
	ps.seen = append(ps.seen, seenClass{class: i, from: from, ends: ends})
	return 0, false
}

// seenClass is a class decided in a DecidePorts call and where its rules
// are in pairScan.buf.
type seenClass struct {
	class, from int
	ends        [2]int
}
