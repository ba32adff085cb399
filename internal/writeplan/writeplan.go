// Package writeplan splits a write too large for one etcd transaction into
// several, each small enough for one (store.MaxOps operations, and a margin
// under store.MaxTxnBytes): meshes first, then scopes, then policies, so that
// every write refers only to what earlier ones wrote. verdictctl apply and
// verdictd --bootstrap use it; each part is atomic, the whole is not.
package writeplan

import (
	"sort"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// MaxBytes bounds the encoded resources of one part: etcd's request limit
// less room for keys and the transaction's framing.
const MaxBytes = store.MaxTxnBytes * 3 / 4

// Split returns resources in parts of at most maxOps resources and MaxBytes
// encoded bytes, meshes first, then scopes, then policies, each kind in its
// original order. One part when everything fits.
func Split(resources []engine.Resource, maxOps int) [][]engine.Resource {
	if maxOps <= 0 || maxOps > store.MaxOps {
		maxOps = store.MaxOps
	}
	ordered := append([]engine.Resource(nil), resources...)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].Key().Kind < ordered[j].Key().Kind })
	var parts [][]engine.Resource
	var cur []engine.Resource
	size := 0
	for _, r := range ordered {
		n := 512 // key and framing
		if b, err := engine.EncodeJSON(r); err == nil {
			n += len(b)
		}
		if len(cur) > 0 && (len(cur) == maxOps || size+n > MaxBytes) {
			parts = append(parts, cur)
			cur, size = nil, 0
		}
		cur = append(cur, r)
		size += n
	}
	if len(cur) > 0 {
		parts = append(parts, cur)
	}
	return parts
}
