// Package inventory holds what endpoints resolve through: a mesh's workloads
// (Inventory: by name, by address, by principal, by identity), the identities
// of tag sets and the registry of sets registered through the API
// (Registry, TagSet), the endpoint forms a request may use (Endpoint), and
// the plans that turn a peer selector into kernel address sets (PeerPlan).
// docs/workloads.md is the user's view.
//
// An Inventory is immutable: Apply returns the next one, sharing what did
// not change, in O(change). The engine holds one per mesh beside the mesh's
// policies; a workload change rebuilds no rule index.
//
// It imports engine/resource and engine/internal/pmap, nothing of the engine
// itself, gRPC or etcd.
package inventory
