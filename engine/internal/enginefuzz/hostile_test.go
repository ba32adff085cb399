package enginefuzz_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
)

// TestHostileFiles: the file decoders (verdictctl apply -f, --bootstrap,
// policy suites) refuse hostile YAML with a validation error that says where,
// promptly, and never crash.
func TestHostileFiles(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 2<<20)
	tests := []struct {
		name string
		doc  string
		want string // in the error
	}{
		{"nesting 10k deep (flow)", "kind: Policy\nname: p\nconf: " + strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000) + "\n", "deep"},
		{"nesting 5k deep (block)", "kind: Policy\nname: p\nconf:\n" + deepBlock(5000), "deep"},
		{"Kuma spec nested 200 deep", "type: MeshTrafficPermission\nname: m\nspec:\n  targetRef: {kind: Mesh}\n  from:\n    - targetRef: {kind: Mesh}\n      default: " +
			strings.Repeat("{a: ", 200) + "1" + strings.Repeat("}", 200) + "\n", "deep"},
		{"alias bomb", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n", "alias"},
		{"merge keys", "kind: Policy\nname: p\nsources: [{<<: {match: {a: b}}}]\ndestinations: [{}]\n", "merge"},
		{"invalid UTF-8", "kind: Policy\nname: p\nsources: [{match: {app: \"\xff\xfe\"}}]\ndestinations: [{}]\n", "UTF-8"},
		{"a 2 MiB value", "kind: Policy\nname: p\nsources: [{}]\ndestinations: [{}]\nconf: {blob: " + big + "}\n", "limit"},
		{"a tag value of 2 KiB", "kind: Policy\nname: p\nsources: [{match: {app: " + strings.Repeat("v", 2048) + "}}]\ndestinations: [{}]\n", "limit"},
		{"10k match entries", "kind: Policy\nname: p\nsources: [{match: {" + manyEntries(10_000) + "}}]\ndestinations: [{}]\n", "limit"},
		{"10k documents, one bad", strings.Repeat("---\nkind: Policy\nname: p\nsources: [{}]\ndestinations: [{}]\n", 9_999) +
			"---\nkind: Policy\nname: bad/name\nsources: [{}]\ndestinations: [{}]\n", "documents[9999]"},
		{"CEL nested 100 deep", "kind: Policy\nname: p\ntype: RL\nsources: [{}]\ndestinations: [{}]\ndefaults: {when: \"" +
			strings.Repeat("(", 100) + "true" + strings.Repeat(")", 100) + "\", rules: {a: 1}}\n", "when"},
		{"unknown field", "kind: Policy\nname: p\nsources: [{}]\ndestinations: [{}]\nactoin: DENY\n", "actoin"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			watchdog(t, 2*time.Minute, func() { _, err = resource.DecodeYAML([]byte(tc.doc)) })
			if !errors.Is(err, resource.ErrInvalid) {
				t.Fatalf("error %v, want a validation error", trunc(err))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", trunc(err), tc.want)
			}
		})
	}
}

func deepBlock(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i+2))
		b.WriteString("a:\n")
	}
	b.WriteString(strings.Repeat(" ", n+2) + "b: 1\n")
	return b.String()
}

func manyEntries(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("k")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(itoa(i))
		b.WriteString(": v")
	}
	return b.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}

func trunc(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
