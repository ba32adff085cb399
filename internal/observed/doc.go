// Package observed is a replica's table of the distinct flows it decided
// (docs/analysis.md, "Observed flows"): per flow — mesh, type, both ends as
// the request gave them and as they resolved, protocol, port — when it was
// first and last seen, how often, and its last answer. Impact replays them.
//
// The table is bounded: at most Max flows (default 1,000,000), the least
// recently seen evicted first, about 100 bytes per flow (the ends are
// interned and shared by the flows that name them), and at most
// MaxEndBytes of the ends' tags and names (default 64 MiB). Nothing here blocks a
// decision for long: a flow is counted under the lock of one of many shards,
// and the compact path's flows, which arrive by the million per second,
// are counted in the pair memo's entries (tally.go) or, the rest, in a small
// per-stripe cache (Batch); Run's tick and every read (Flows) take both
// into the table.
//
// It imports the engine's resource and inventory types, never the server,
// gRPC or etcd.
package observed
