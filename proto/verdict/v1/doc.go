// Package verdictv1 is verdict's gRPC API (docs/api.md), generated from
// the protos beside it by `make proto`: DecisionService (Decide, DecideBatch,
// DecideStream, Resolve), PolicyService (Apply, Get, List, Delete, Status) and
// WatchService (WatchResources, WatchRules). The resource messages' protobuf
// JSON is the canonical document of docs/resources.md, the form stored in etcd;
// apiconv.ResourceFromProto and apiconv.ResourceToProto (internal/apiconv) convert them to and from
// the engine's types.
package verdictv1
