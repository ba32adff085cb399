// Package enginefuzz holds fuzz targets and hostile-input tests of the
// engine's public API — the file and value decoders (native and Kuma YAML,
// JSON), selectors and CEL `when` expressions, through Build, Decide, Explain,
// Resolve and RulesFor — kept outside engine/ so that they exercise only what
// callers can reach. `make fuzz` runs every target for FUZZTIME.
package enginefuzz
