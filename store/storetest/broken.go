package storetest

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
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

		bad, _ := resource.ParseKey("default/policies/TrafficPermission/bad")
		it, err := st.Get(ctx, bad)
		if err != nil {
			t.Fatalf("Get of a broken value: %v", err)
		}
		if it.Err == nil || it.Resource != nil || !errors.Is(it.Err, resource.ErrInvalid) || string(it.Value) != brokenValues[0].value {
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

	t.Run("keys that are not UTF-8 are listed by their bytes, shown rendered, and break no other read", func(t *testing.T) {
		// Issue 12 F2: a raw key "\xff\xfe/mesh" under the prefix failed Status,
		// the unprefixed List and WatchResources of every tenant (a protobuf
		// string must be UTF-8), until it was deleted.
		h := newHarness(t)
		st := h.Store
		ctx := Context(t)
		r := Apply(t, st, Put(Policy(t, "default", "a", 0)), Put(Policy(t, "other", "b", 0)))
		f := Follow(t, st, 0)
		f.WaitRevision(t, r)
		raws := []string{"\xff\xfe/mesh", "default/policies/TrafficPermission/\xff", "default/policies/TrafficPermission/a\xff"}
		var last int64
		for _, raw := range raws {
			var err error
			if last, err = h.RawPut(ctx, raw, []byte(`{"kind":"Mesh","name":"x\xff"}`)); err != nil {
				t.Fatalf("raw put %q: %v", raw, err)
			}
		}
		want := map[string]bool{"default/policies/TrafficPermission/a": true, "other/policies/TrafficPermission/b": true}
		for _, raw := range raws {
			want[strconv.Quote(raw)] = true
		}
		// Page by page, one item a page: every key once (a page token after a
		// key that is not UTF-8 continues after it), each named in UTF-8.
		seen := map[string]bool{}
		opts := store.ListOptions{Limit: 1}
		for pages := 0; ; pages++ {
			if pages > 2*len(want) {
				t.Fatalf("the list does not end: %d pages, seen %v", pages, seen)
			}
			page, err := st.List(ctx, opts)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			for _, it := range page.Items {
				shown := store.RenderPath(it.Path)
				if !utf8.ValidString(shown) || it.Err != nil && !utf8.ValidString(it.Err.Error()) {
					t.Fatalf("listed %q (error %v): not UTF-8", shown, it.Err)
				}
				if seen[shown] {
					t.Fatalf("listed %q twice", shown)
				}
				seen[shown] = true
				if strings.HasPrefix(shown, `"`) && (it.Err == nil || !errors.Is(it.Err, resource.ErrInvalid)) {
					t.Fatalf("%s listed without its error: %+v", shown, it)
				}
			}
			if opts.PageToken = page.NextPageToken; opts.PageToken == "" {
				break
			}
		}
		if len(seen) != len(want) {
			t.Fatalf("listed %v, want %v", seen, want)
		}
		for p := range want {
			if !seen[p] {
				t.Fatalf("%q not listed; listed %v", p, seen)
			}
		}
		f.WaitRevision(t, last)
		for _, c := range changesOf(f.Events()) {
			if !utf8.ValidString(store.RenderPath(c.Path)) || c.Err != nil && !utf8.ValidString(c.Err.Error()) {
				t.Fatalf("the watch sent %q (error %v): not UTF-8 once rendered", c.Path, c.Err)
			}
		}
		snap := f.Snapshot()
		for _, inv := range snap.Invalid() {
			if !utf8.ValidString(store.RenderPath(inv.Path)) {
				t.Fatalf("Invalid() names %q: not UTF-8 once rendered", inv.Path)
			}
		}
		if got, want := snap.Digest(), Digest(t, st); got != want {
			t.Fatalf("the folded snapshot's digest %s is not the store's %s", got, want)
		}
		// The key whose mesh cannot be read harms no mesh; the policy keys
		// close their own mesh and type only (docs/storage.md, "Invalid values").
		req := &engine.Request{Mesh: "other", Source: resource.Tags{"kuma.io/service": "web"}, Destination: resource.Tags{"kuma.io/service": "b"}}
		if d, err := snap.Decide(req); err != nil || d.Action != resource.Allow {
			t.Fatalf("another mesh: %+v, %v; want ALLOW", d, err)
		}
		req.Mesh = "default"
		if d, err := snap.Decide(req); err != nil || d.Inbound.Reason != engine.ReasonInvalidResource {
			t.Fatalf("the policies' mesh: %+v, %v; want INVALID_RESOURCE", d, err)
		}
	})

	t.Run("a key written to look like another's rendering is another key", func(t *testing.T) {
		// Issue 28 item 10: a key that is not UTF-8 closes its mesh; a
		// literal key spelling its rendering ("default/scopes/\xff" with
		// the quotes and the backslash) was taken for the same key, so that
		// writing and deleting it reopened the mesh on the replicas that
		// followed while etcd still held the bad key: two digests at one
		// revision, and after a restart a DENY.
		if newHarness(t).RawDelete == nil {
			t.Skip("the harness cannot delete raw keys")
		}
		h := newHarness(t)
		st := h.Store
		ctx := Context(t)
		rev := Apply(t, st, Put(Policy(t, "default", "a", 0)))
		followed := Follow(t, st, 0)
		followed.WaitRevision(t, rev)
		bad := "default/scopes/\xff"
		lookalike := strconv.Quote(bad) // what the bad key is shown as
		if store.RenderPath(bad) != lookalike || store.RenderPath(lookalike) == lookalike {
			t.Fatalf("renderings: %q → %q, %q → %q: want the look-alike shown otherwise",
				bad, store.RenderPath(bad), lookalike, store.RenderPath(lookalike))
		}
		value := []byte(`{"kind":"Scope","name":"x"}`)
		steps := []struct {
			name string
			do   func() (int64, error)
		}{
			{"the bad key written", func() (int64, error) { return h.RawPut(ctx, bad, value) }},
			{"the look-alike written", func() (int64, error) { return h.RawPut(ctx, lookalike, value) }},
			{"the look-alike deleted", func() (int64, error) { return h.RawDelete(ctx, lookalike) }},
		}
		req := &engine.Request{Mesh: "default", Source: resource.Tags{"kuma.io/service": "web"}, Destination: resource.Tags{"kuma.io/service": "a"}}
		for _, step := range steps {
			rev, err := step.do()
			if err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			followed.WaitRevision(t, rev)
			fresh := Follow(t, st, 0)
			fresh.WaitRevision(t, rev)
			want := Digest(t, st)
			for name, f := range map[string]*Follower{"the replica that followed": followed, "a replica started now": fresh} {
				snap := f.Snapshot()
				if got := snap.Digest(); got != want {
					t.Fatalf("%s: %s's digest %s, the store's %s", step.name, name, got, want)
				}
				if d, err := snap.Decide(req); err != nil || d.Inbound.Reason != engine.ReasonInvalidResource {
					t.Fatalf("%s: %s decides %+v, %v; want the mesh closed (INVALID_RESOURCE) while the bad key is stored", step.name, name, d, err)
				}
			}
			fresh.Stop()
		}
		paths := map[string]bool{}
		for _, inv := range followed.Snapshot().Invalid() {
			paths[inv.Path] = true
		}
		if !paths[bad] || paths[lookalike] || len(paths) != 1 {
			t.Fatalf("invalid keys %v, want the bad key's bytes alone", paths)
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
