package engine

import (
	"fmt"

	"github.com/verdictpdp/verdict/engine/internal/index"
)

// CheckBulkIndexes holds the bulk build of every index of s (Build) to
// update on an empty index, which files rules one change at a time: the same
// rules in the same lists in the same order, the same df, entries and bitmap
// blocks, each rule filed at the same end. Ids are compared by the terms
// they stand for (their numbering may differ). It returns the rules compared
// and the first difference.
func CheckBulkIndexes(s *Snapshot) (int, error) {
	n := 0
	var err error
	s.meshes.Range(func(mesh string, ms *meshState) bool {
		indexes := []*index.Index{ms.scopes.index}
		ms.types.Range(func(_ string, ts *typeState) bool {
			indexes = append(indexes, ts.rules, ts.attachIn, ts.attachOut,
				ts.audit.rules, ts.audit.attachIn, ts.audit.attachOut)
			return true
		})
		for _, ix := range indexes {
			if err = index.CheckBulk(ix); err != nil {
				err = fmt.Errorf("mesh %s: %w", mesh, err)
				return false
			}
			n += ix.Size
		}
		return true
	})
	return n, err
}
