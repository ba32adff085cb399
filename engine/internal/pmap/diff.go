package pmap

// Diff calls f with every key whose entry differs between a and b: present
// in one only, or with values same does not call equal. It walks the two
// tries together and skips every node they share, so two versions one
// Builder apart cost O(change × depth), not O(size). A key may be reported
// more than once.
func Diff[K comparable, V any](a, b Map[K, V], same func(V, V) bool, f func(K)) {
	diffNodes(a.root, b.root, same, f)
}

func diffNodes[K comparable, V any](a, b *node[K, V], same func(V, V) bool, f func(K)) {
	if a == b {
		return
	}
	all := func(n *node[K, V]) {
		if n != nil {
			n.each(func(k K, _ V) bool { f(k); return true })
		}
	}
	if a == nil || b == nil || a.datamap|a.nodemap == 0 || b.datamap|b.nodemap == 0 {
		// an empty root, or colliding entries: few, or a whole change
		all(a)
		all(b)
		return
	}
	for bits := a.datamap | a.nodemap | b.datamap | b.nodemap; bits != 0; {
		bit := bits & -bits
		bits &^= bit
		ae, ac := a.datamap&bit != 0, a.nodemap&bit != 0
		be, bc := b.datamap&bit != 0, b.nodemap&bit != 0
		switch {
		case ac && bc:
			diffNodes(a.children[slot(a.nodemap, bit)], b.children[slot(b.nodemap, bit)], same, f)
		case ae && be:
			x, y := &a.entries[slot(a.datamap, bit)], &b.entries[slot(b.datamap, bit)]
			if x.key != y.key || !same(x.val, y.val) {
				f(x.key)
				f(y.key)
			}
		default:
			for _, side := range [2]*node[K, V]{a, b} {
				switch {
				case side.datamap&bit != 0:
					f(side.entries[slot(side.datamap, bit)].key)
				case side.nodemap&bit != 0:
					all(side.children[slot(side.nodemap, bit)])
				}
			}
		}
	}
}
