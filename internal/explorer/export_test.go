package explorer

import (
	"maps"
	"slices"
)

// AllowedHost is allowedHost, for the tests.
var AllowedHost = allowedHost

// Methods lists the methods the page may call.
func Methods() []string { return slices.Sorted(maps.Keys(methods)) }

// Callable tells whether the page may call a method: it is in the table, and
// the table reads its answer as its descriptor says it comes.
func Callable(path string) bool {
	_, _, ok := lookup(path)
	return ok
}
