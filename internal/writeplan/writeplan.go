// Package writeplan splits a write too large for one etcd transaction into
// several, each small enough for one (store.MaxOps operations, and a margin
// under store.MaxTxnBytes), in dependency order (Order): meshes, then scopes
// parents first, then workloads, then policies, so that every write refers
// only to what earlier ones wrote. verdictctl apply and verdictd --bootstrap
// use it; each part is atomic, the whole is not. Same tells a document that
// would change nothing, which verdictd does not write.
package writeplan

import (
	"bytes"
	"sort"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// MaxBytes bounds the encoded resources of one part: etcd's request limit
// less room for keys and the transaction's framing.
const MaxBytes = store.MaxTxnBytes * 3 / 4

// Split returns resources in parts of at most maxOps resources and MaxBytes
// encoded bytes, in dependency order (Order). One part when everything fits.
func Split(resources []resource.Resource, maxOps int) [][]resource.Resource {
	if maxOps <= 0 || maxOps > store.MaxOps {
		maxOps = store.MaxOps
	}
	ordered := Order(resources)
	var parts [][]resource.Resource
	var cur []resource.Resource
	size := 0
	for _, r := range ordered {
		n := 512 // key and framing
		if b, err := resource.EncodeJSON(r); err == nil {
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

// Rank is a resource's place in dependency order: meshes 0, scopes 1 + their
// depth under other scopes of the same write (a parent before its children),
// workloads next, policies last. parents maps a scope's key
// ("default/scopes/Apps") to its parent's key, for the scopes of the write.
func Rank(k resource.Key, parents map[string]string) int {
	const maxDepth = 1 << 16
	switch k.Kind {
	case resource.KindMesh:
		return 0
	case resource.KindScope:
		depth := 0
		for p, ok := parents[k.String()]; ok && depth < len(parents); p, ok = parents[p] {
			depth++
		}
		return 1 + depth
	case resource.KindWorkload:
		return 2 + maxDepth
	}
	return 3 + maxDepth
}

// ScopeParents maps the key of each scope among resources to its parent's key.
func ScopeParents(resources []resource.Resource) map[string]string {
	parents := map[string]string{}
	for _, r := range resources {
		if s, ok := r.(*resource.Scope); ok && s.Parent != "" {
			parents[r.Key().String()] = resource.Key{Kind: resource.KindScope, Mesh: s.Mesh, Name: s.Parent}.String()
		}
	}
	return parents
}

// Order returns resources in dependency order: meshes, scopes parents first,
// workloads, policies; otherwise in their original order.
func Order(resources []resource.Resource) []resource.Resource {
	parents := ScopeParents(resources)
	ordered := append([]resource.Resource(nil), resources...)
	sort.SliceStable(ordered, func(i, j int) bool {
		return Rank(ordered[i].Key(), parents) < Rank(ordered[j].Key(), parents)
	})
	return ordered
}

// Same reports whether writing next over stored changes nothing a reader
// sees: both encode to the same canonical document once the times and
// revisions the store stamps (creationTime, modificationTime, create and mod
// revisions) are set aside. An unchanged document is not written
// (docs/cli.md, "Unchanged documents").
func Same(stored, next resource.Resource) bool {
	if stored == nil || next == nil {
		return false
	}
	a, err := resource.EncodeJSON(stored.WithMeta(resource.Meta{}))
	if err != nil {
		return false
	}
	b, err := resource.EncodeJSON(next.WithMeta(resource.Meta{}))
	return err == nil && bytes.Equal(a, b)
}
