package explorer

import (
	"maps"
	"slices"
)

// AllowedHost is allowedHost, for the tests.
var AllowedHost = allowedHost

// Methods lists the methods the page may call.
func Methods() []string { return slices.Sorted(maps.Keys(methods)) }
