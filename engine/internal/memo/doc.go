// Package memo holds the engine's decision memos: the tag memo (Cache), keyed
// and verified by the whole flow, and the identity-pair memo (Pairs) in
// front of it for flows between interned tag sets. Both are bounded,
// lock-free arrays of atomic words; a hit is verified field by field (or by
// pointer for interned sets), so a hash collision is a miss, never another
// flow's answer. Entries belong to an Epoch of their (mesh, type) partition:
// the engine renews the epoch whenever the partition's answers may change,
// and an entry of another epoch never answers (engine/README.md, "Memos").
//
// The memo wraps the engine's computation without knowing it: answers are of
// any type D, computed by the caller on a miss. It imports engine/resource,
// engine/inventory and engine/internal/index's Flow; nothing of the engine
// itself.
package memo
