// Package resource is verdict's resource model: Mesh, Scope, Policy and
// Workload as Go values, their one decoder and their canonical encoding, the
// limits every field is held to, and the identity of a tag set.
//
// The way in is the one decoder (DecodeYAML, DecodeJSON, DecodeValue): files,
// the API's resources and values found in storage all pass through it, and
// every error names its field (decode*.go; Kuma's universal format is
// normalized in decode_kuma.go). EncodeJSON writes the canonical document
// that etcd stores and the API carries (docs/storage.md, docs/resources.md).
//
// The store, the API conversion, the write planner and verdictctl read
// resources through this package alone, without linking the engine's
// indexes. It imports neither the engine, gRPC, etcd nor the API's protobuf
// types.
package resource
