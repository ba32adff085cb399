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
// It imports the API's generated types and gRPC's client interface; never
// server/, the engine or the store.
package explorer
