// Package conditions keeps every policy's standing conditions
// (docs/lint.md, "Standing conditions"): Accepted or Invalid; Enforced,
// PartiallyEnforced, Overridden or Shadowed; Audit; NoWorkloads. They are
// judged per (mesh, type) of a snapshot, on the first ask, and kept in the
// snapshot (engine.Snapshot.Attached), so they die with it and never answer
// for another revision. A Tracker carries what it judged from one snapshot
// to the next: a partition whose policies, scopes, settings and inventory
// are unchanged keeps its conditions; one that changed by a few policies
// re-judges only the rules those policies' rules can overlap (an earlier
// rule shadows only later rules it overlaps), keeps what the last
// judgement found of them where the change cannot move it (shadow.go),
// tries the rest on their simplest flow (witness.go), and lints only what
// is left, in the smallest set of policies that holds every rule that
// could cover them. A change of the inventory re-judges NoWorkloads only
// for the policies whose witness workload moved and the dead ones a put
// workload may select (dead.go).
//
// It stands on engine/analysis's exported Lint for the shadowed rules and
// on the engine's Partition and Resolve for the rest; nothing here runs on
// the decision path. It imports the engine, engine/analysis, engine/resource,
// engine/inventory and engine/internal/index; never gRPC, etcd or the API's
// protobuf types. Its readers are the server (Get, List, Status,
// WatchResources, the metrics) and verdictctl.
package conditions
