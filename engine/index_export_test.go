package engine

import "github.com/verdictpdp/verdict/engine/internal/index"

// CheckLists holds the posting lists of every rule index of s of both ends to
// the rules they file: each list sorted, of its class, each rule filed once
// (the index's size), and each entry's ids its rule's term ids without the
// term of its list. It returns the first difference.
func CheckLists(s *Snapshot) error {
	return checkRuleIndexes(s, func(ix *index.Index) bool { return ix.Ends == index.EndSrc|index.EndDst }, index.CheckLists)
}
