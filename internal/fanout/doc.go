// Package fanout serves the replica's change feed to many watch streams:
// the resource feed (Feed, WatchResources) and the rules hub (Hub,
// WatchRules). Each follows the syncer's snapshots through one subscription
// (follow), computes what its streams share once — a change set converted
// once; a workload's rules once per distinct workload and snapshot that can
// alter them — and encodes it once (Message): a stream holds a cursor or a
// pointer, never a copy, and never a backlog.
//
// It imports neither gRPC nor the server. The server's handlers hand it each
// stream's send function and caller, and map its errors (ErrFellBehind,
// ErrTooManyStreams, ErrStopped) to codes; its codec sends a Message's parts
// as they are. docs/api.md ("WatchService") is the contract; the engine
// (engine.Snapshot.RulesFor, RulesImpact, the inventory's peer plans) computes
// what is sent.
package fanout
