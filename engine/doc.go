// Package engine is verdict's decision logic: resources in, an immutable
// indexed snapshot out, and answers read from the snapshot. It imports
// neither gRPC, etcd nor the API's protobuf types.
//
// Resources come decoded and validated from engine/resource. Build compiles
// a set of resources into a Snapshot; Snapshot.Apply derives the next
// snapshot from a change set in O(change), sharing structure with the
// previous one, so readers hold a snapshot without a lock while the update
// path swaps in the next.
//
// On a snapshot:
//   - Decide answers a flow on both sides — outbound at the source, inbound
//     at the destination — by the one first-match rule order that serves
//     Secure Workload's scopes, Kuma's most specific S&D policy, Kuma's
//     targetRef levels and Kuadrant's defaults and overrides (docs/order.md);
//     with Request.Explain it says why (docs/explain.md);
//   - PairScope is the entry for one (mesh, type): a batch of flows between
//     identities resolves the partition once (the compact path);
//   - Resolve folds the effective configuration (docs/resolve.md);
//   - RulesFor lists a workload's ordered rules (WatchRules), and
//     RulesImpact which workloads' lists a change set may have altered;
//   - CheckApply validates a write against the current set (the API's and
//     the suites' dry run); Invalid lists what is stored but not in use, which
//     fails closed (docs/storage.md);
//   - Partition is the read-only view of one (mesh, type) that
//     engine/analysis stands on (partition.go): its rules in order, its
//     scopes and their membership, its settings and compiled policies, and a
//     decision entry a caller who knows which rules match a flow narrows
//     (Prefilter); Preview is CheckApply then Apply on a copy, Attached
//     keeps what a caller computed from one snapshot in it, and Carried
//     hands it to the next snapshots of the lineage to start from
//     (carry.go).
//
// The rooms beside and below it, each with a doc.go of its own:
//   - engine/analysis: Reach, Matrix, Impact and Lint, answered by bulk
//     evaluation over Partition (the server's AnalysisService,
//     engine/policytest, verdictctl's offline lint);
//   - engine/conditions: each policy's standing conditions, judged per
//     snapshot and carried to the next in O(change) (docs/lint.md);
//   - engine/resource: the resource model, its decoder and encoder, limits,
//     identities (the store, apiconv, writeplan and verdictctl read it alone);
//   - engine/inventory: workloads, the identity registry, endpoint forms and
//     peer address plans;
//   - engine/internal/index: compiled rules, posting lists, bitmaps, their
//     builds, updates and consistency checks;
//   - engine/internal/memo: the tag memo and the identity-pair memo;
//   - engine/internal/pmap: the persistent map snapshots share structure with;
//   - engine/internal/worldgen: the random worlds of the differential tests
//     (tests only).
//
// What stays exported here, and who uses it:
//   - Snapshot, Build, Empty, Change, Put, Delete, Entry, InvalidResource,
//     RenderPath: store/syncer and store/etcd (the update path), verdictctl's
//     offline plans, the server's reads;
//   - Request, ResolveRequest, SetRequest and the answers (Decision,
//     SideDecision, Audit, Reason, Explanation and its traces, Resolution,
//     PolicyStatus, RuleSet, SideRules, RuleView): the server through
//     internal/apiconv, engine/policytest (verdictctl test);
//   - PairScope, PairAnswer, PairEntry, PolicyNumbers: the server's compact
//     path; RulesImpact: internal/fanout's rules hub;
//   - Memo and Snapshot.WithMemo: store/history, whose snapshots at past
//     revisions share a memo apart from the current lineage's;
//   - Partition and its views (Settings, PolicyCounts, PolicyView,
//     ScopeView), Prefilter, Pick, Pair, Preview, Attached, Carried, Meshes,
//     KnownTypes, Inventory, EndpointTags: engine/analysis alone;
//   - PolicySet (Partition.PolicySet, Changed, Policy): engine/conditions
//     and engine/analysis, which find the policies a snapshot changed
//     without holding the previous one;
//   - CodeName, the Err* values and UnknownTypeError: server/errors.go's one
//     mapping and the suites' expected codes; BuiltinTypes, IsBuiltinType,
//     NearestNames: types and suggestions (server, verdictctl).
//
// engine/README.md describes the index, the bitmaps, the patching and the
// memos, with a worked example; BENCHMARKS.md has their costs.
package engine
