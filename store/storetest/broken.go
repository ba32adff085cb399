package storetest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// The broken values of the suite, written as etcdctl would.
var brokenValues = []struct {
	name, path, value string
}{
	{"not JSON", "default/policies/TrafficPermission/bad", `{"kind":"Policy",`},
	{"invalid policy", "default/policies/TrafficPermission/invalid", `{"kind":"Policy","mesh":"default","name":"invalid","action":"MAYBE"}`},
	{"another resource than its key names", "default/policies/TrafficPermission/liar",
		`{"kind":"Policy","mesh":"default","name":"other","sources":[{}],"destinations":[{}]}`},
	{"a key that is not a resource key", "default/junk", `{}`},
}

// BrokenCount is the number of broken values WriteBroken writes.
func BrokenCount() int { return len(brokenValues) }

// WriteBroken writes the suite's broken values with h.RawPut and returns the
// last revision.
func WriteBroken(t testing.TB, h Harness) int64 {
	t.Helper()
	var rev int64
	for _, b := range brokenValues {
		r, err := h.RawPut(Context(t), b.path, []byte(b.value))
		if err != nil {
			t.Fatalf("raw put %s: %v", b.path, err)
		}
		rev = r
	}
	return rev
}

func runBroken(t *testing.T, newHarness Factory) {
	t.Run("are read back with their error and counted, never as a failure", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		ctx := Context(t)
		good := Policy(t, "default", "good", 0)
		r := Apply(t, st, Put(good), Put(Policy(t, "other", "fine", 0)))
		f := Follow(t, st, 0)
		f.WaitRevision(t, r)
		skipped := st.Health().Skipped
		last := WriteBroken(t, h)

		bad, _ := engine.ParseKey("", "/default/policies/TrafficPermission/bad")
		it, err := st.Get(ctx, bad)
		if err != nil {
			t.Fatalf("Get of a broken value: %v", err)
		}
		if it.Err == nil || it.Resource != nil || !errors.Is(it.Err, engine.ErrInvalid) || string(it.Value) != brokenValues[0].value {
			t.Fatalf("Get of a broken value = %+v", it)
		}

		items, _ := ListAll(t, st, "")
		errs := map[string]error{}
		for _, it := range items {
			errs[it.Path] = it.Err
		}
		if len(items) != 2+len(brokenValues) {
			t.Fatalf("listed %d items, want %d", len(items), 2+len(brokenValues))
		}
		for _, b := range brokenValues {
			if errs[b.path] == nil {
				t.Fatalf("%s: listed without its error", b.name)
			}
		}
		if errs[good.Key().String()] != nil || errs["other/policies/TrafficPermission/fine"] != nil {
			t.Fatalf("valid resources listed with errors: %v", errs)
		}

		f.WaitRevision(t, last)
		n := 0
		for _, c := range changesOf(f.Events()) {
			if c.Err != nil {
				n++
				if c.Resource != nil || c.Value == nil || c.ModRevision == 0 {
					t.Fatalf("broken change %+v lacks its value or revision", c)
				}
			}
		}
		if n != len(brokenValues) {
			t.Fatalf("the watch delivered %d broken values, want %d", n, len(brokenValues))
		}
		if got := st.Health().Skipped; got < skipped+int64(len(brokenValues)) {
			t.Fatalf("Health().Skipped = %d, want at least %d", got, skipped+int64(len(brokenValues)))
		}

		// Repairing a broken value through Apply replaces it.
		fixed := Policy(t, "default", "bad", 0)
		rev := Apply(t, st, Put(fixed))
		f.WaitRevision(t, rev)
		it, err = st.Get(ctx, bad)
		if err != nil || it.Err != nil || !bytes.Contains(it.Value, []byte(`"name":"bad"`)) {
			t.Fatalf("after repair: %+v, %v", it, err)
		}
		if e, ok := f.Snapshot().Get(bad); !ok || e.Err != nil {
			t.Fatalf("the repaired policy is not in the folded snapshot: %+v", e)
		}
	})

	t.Run("a broken creationTime source does not block an update", func(t *testing.T) {
		h := newHarness(t)
		if _, err := h.RawPut(Context(t), brokenValues[0].path, []byte(brokenValues[0].value)); err != nil {
			t.Fatal(err)
		}
		bad := Policy(t, "default", "bad", 0)
		if _, err := h.Store.Apply(Context(t), []store.Op{Put(bad)}); err != nil {
			t.Fatalf("overwriting a broken value: %v", err)
		}
	})
}
