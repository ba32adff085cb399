// Package analysis answers questions about many flows at once, exactly:
// Reach (who can reach an endpoint, or what it can reach), Matrix (the
// allowed pairs among workloads), Impact (the flows a proposed change would
// alter) and Lint (rules that never decide, rules whose removal changes
// nothing, ties, dead policies, overlapping scopes) — docs/analysis.md and
// docs/lint.md are the user's view. Every answer equals what Decide gives
// for each flow it stands for; the differential tests hold it to that.
//
// It stands on the engine's bridge, engine.Partition: a read-only view of
// one (mesh, type) of a snapshot — its rules in order, its scopes and their
// membership, its settings and compiled policies — and the engine's own
// decision procedure, which a bulk evaluation narrows with bitmaps of the
// rules each end of a flow satisfies (engine.Prefilter). Nothing here
// decides a flow by rules of its own: scopes, catch-alls, fallbacks, audit
// and PerDestination stay the engine's. What it computes from one snapshot
// it keeps in that snapshot (engine.Snapshot.Attached), so it dies with it.
//
// The files, by concept: bulk.go, bulkbase.go, bulkbits.go and bulkpair.go,
// the bulk evaluation (tag classes, rule bitmaps, pairs on many ports);
// classes.go and flowclass.go, the classes of tag values and of protocols
// and ports the policies tell apart; outside.go, the endpoints outside the
// inventory; reach.go, impact.go; lint.go, lintrules.go, lintscopes.go and
// lintspace.go, lint's findings and the space of flows it reasons over.
//
// Its readers are the server's AnalysisService, engine/policytest (the
// suites' reach and impact cases) and verdictctl's offline lint. It imports
// the engine, its resource and inventory packages and engine/internal/index;
// never gRPC, etcd or the API's protobuf types.
package analysis
