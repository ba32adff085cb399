package analysis

import (
	"context"

	"github.com/verdictpdp/verdict/engine"
)

// Warm prepares, for every mesh and type of s whose lineage carries no base
// yet, what Reach, Matrix and Impact start from: the partition's selector
// conditions and its workloads' tag classes (docs/analysis.md, "How it is
// computed"). The snapshots Apply derives from s carry it, so the first
// question after a start or a rebuild from the store does not pay for
// interning every workload. It returns how many partitions it prepared;
// it stops between partitions once ctx ends.
func Warm(ctx context.Context, s *engine.Snapshot) int {
	n := 0
	for _, mesh := range s.Meshes() {
		for _, typ := range s.KnownTypes(mesh) {
			if ctx.Err() != nil {
				return n
			}
			p, err := s.Partition(mesh, typ)
			if err != nil || s.Carries(baseKey{p.Mesh(), p.Type()}) {
				continue // a closed partition answers no question
			}
			baseOf(p)
			n++
		}
	}
	return n
}
