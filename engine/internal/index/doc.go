// Package index holds the engine's compiled rules and the indexes that find
// a flow's first matching rule without a scan of every rule: posting lists
// keyed by each rule's rarest term (index.go), bit-vector blocks for dense
// flows (bitindex.go), their bulk build (bulk.go) and their O(change) update,
// and the consistency checks the tests hold both to (indexcheck.go).
//
// A Rule is one entry of the one first-match order of its mesh and type
// (docs/order.md); OrderKey is its place. ScanFirstMatch and
// ScanDenyOverrides answer a flow per side. What a rule means — policies,
// scopes, attachments, the final answer — is the engine's; this package sees
// only rules, their keys and a scope position per rule, and the scratch
// memory's membership stamps that say which scope positions a side's
// workload belongs to.
//
// It imports engine/resource and engine/internal/pmap, nothing of the engine
// itself, gRPC or etcd.
package index
