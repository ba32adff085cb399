// Package engine is verdict's decision logic: resources in, an immutable
// indexed snapshot out, and answers read from the snapshot. It imports
// neither gRPC, etcd nor the API's protobuf types.
//
// Resources come decoded and validated from engine/resource. Build compiles a set of resources into a
// Snapshot; Snapshot.Apply derives the next snapshot from a change set in
// O(change), sharing structure with the previous one, so readers hold a
// snapshot without a lock while the update path swaps in the next.
//
// On a snapshot:
//   - Decide answers a flow on both sides — outbound at the source, inbound
//     at the destination — by the one first-match rule order that serves
//     Secure Workload's scopes, Kuma's most specific S&D policy, Kuma's
//     targetRef levels and Kuadrant's defaults and overrides (docs/order.md);
//     with Request.Explain it says why (docs/explain.md);
//   - Resolve folds the effective configuration (docs/resolve.md);
//   - RulesFor lists a workload's ordered rules (WatchRules);
//   - CheckApply validates a write against the current set (the API's and
//     the suites' dry run); Invalid lists what is stored but not in use, which
//     fails closed (docs/storage.md).
//
// engine/README.md describes the index, the bitmaps, the patching and the
// memos, with a worked example; BENCHMARKS.md has their costs.
package engine
