// Package explorer is verdictd's web explorer (docs/explorer.md): one page of
// plain HTML, CSS and JavaScript embedded in the binary (ui/), and the small
// JSON-over-HTTP surface it calls — POST /api/<service>/<method> with a
// protojson body — which forwards each call to the gRPC server in the same
// process, so the server's method table judges it as it judges a call from
// the network.
//
// The handler guards its listener: a Host header that is not an IP address,
// localhost or a configured name is refused (DNS rebinding), a cross-origin
// POST is refused, and with a token configured every API call needs it.
//
// Besides the methods, POST /api/documents reads pasted YAML with
// engine/resource's one decoder (as verdictctl reads files) into the API's
// resources, for the impact view's Impact call; it calls nothing and writes
// nothing.
//
// It imports the API's generated types, gRPC's client interface and
// engine/resource (the model and its decoder, which links no index); never
// server/, the engine's decision packages or the store.
package explorer
