package engine

import (
	"testing"
	"unsafe"

	"github.com/verdictpdp/verdict/engine/internal/index"
)

// TestCompiledSizes holds the compiled structures to the size classes their
// comments claim: a byte more moves each into the next class, paid per
// selector, rule or policy.
func TestCompiledSizes(t *testing.T) {
	for _, c := range []struct {
		name string
		size uintptr
		max  uintptr
	}{
		{"matcher", unsafe.Sizeof(index.Matcher{}), 80},
		{"rule", unsafe.Sizeof(index.Rule{}), 144},
		{"compiledPolicy", unsafe.Sizeof(compiledPolicy{}), 80},
		{"onePolicy", unsafe.Sizeof(onePolicy{}), 224},
		{"pairEntry", unsafe.Sizeof(PairEntry{}), 64}, // one cache line per pair memo hit
	} {
		if c.size > c.max {
			t.Errorf("%s: %d bytes, more than %d", c.name, c.size, c.max)
		}
	}
}
