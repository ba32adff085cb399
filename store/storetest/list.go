package storetest

import (
	"errors"
	"testing"

	"github.com/verdictpdp/verdict/store"
)

func runList(t *testing.T, newHarness Factory) {
	t.Run("pages are read at the revision of the first page, at 10k keys", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		ctx := Context(t)
		n := 10000
		if testing.Short() {
			n = 2000
		}
		rs := Policies(t, "m1", "p", n)
		ApplyMany(t, st, rs)
		ApplyMany(t, st, Policies(t, "m2", "q", 10))

		var got []store.Item
		opts := store.ListOptions{Prefix: "m1/", Limit: 1000}
		var rev int64
		for pages := 0; ; pages++ {
			page, err := st.List(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			if pages == 0 {
				rev = page.Revision
				// Writes after the first page are not seen by the next ones.
				Apply(t, h.Writer, Put(Policy(t, "m1", "p-zzz", 0)), store.Op{Key: rs[n-1].Key()})
			}
			if page.Revision != rev {
				t.Fatalf("page %d at revision %d, the first at %d", pages, page.Revision, rev)
			}
			if len(page.Items) > 1000 {
				t.Fatalf("page of %d items, limit 1000", len(page.Items))
			}
			got = append(got, page.Items...)
			if page.NextPageToken == "" {
				break
			}
			opts.PageToken = page.NextPageToken
		}
		if len(got) != n {
			t.Fatalf("listed %d items, want %d", len(got), n)
		}
		for i, it := range got {
			if it.Err != nil || it.Path != rs[i].Key().String() {
				t.Fatalf("item %d: %q (err %v), want %q", i, it.Path, it.Err, rs[i].Key().String())
			}
		}
		if all, _ := ListAll(t, st, ""); len(all) != n+10 {
			t.Fatalf("listed %d items under every mesh, want %d", len(all), n+10)
		}
		if page, err := st.List(ctx, store.ListOptions{Prefix: "m2/", Limit: 3}); err != nil || len(page.Items) != 3 || page.NextPageToken == "" {
			t.Fatalf("m2 page: %d items, token %q, %v", len(page.Items), page.NextPageToken, err)
		}
	})

	t.Run("bad page tokens and future revisions are invalid arguments", func(t *testing.T) {
		st := newHarness(t).Store
		ctx := Context(t)
		ApplyMany(t, st, Policies(t, "m1", "p", 3))
		page, err := st.List(ctx, store.ListOptions{Prefix: "m1/", Limit: 1})
		if err != nil || page.NextPageToken == "" {
			t.Fatalf("first page: %v", err)
		}
		tests := []struct {
			name string
			opts store.ListOptions
		}{
			{"garbage", store.ListOptions{PageToken: "not-a-token"}},
			{"another list's token", store.ListOptions{Prefix: "m2/", PageToken: page.NextPageToken}},
			{"a future revision", store.ListOptions{Revision: page.Revision + 1000}},
		}
		for _, tt := range tests {
			if _, err := st.List(ctx, tt.opts); !errors.Is(err, store.ErrInvalidArgument) {
				t.Fatalf("%s: %v, want ErrInvalidArgument", tt.name, err)
			}
		}
	})

	t.Run("a list at a compacted revision fails with ErrCompacted", func(t *testing.T) {
		h := newHarness(t)
		st := h.Store
		ctx := Context(t)
		old := ApplyMany(t, st, Policies(t, "m1", "p", 3))
		page, err := st.List(ctx, store.ListOptions{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		now := Apply(t, st, Put(Policy(t, "m1", "later", 0)))
		if err := h.Compact(ctx, now); err != nil {
			t.Fatal(err)
		}
		if _, err := st.List(ctx, store.ListOptions{Revision: old}); !errors.Is(err, store.ErrCompacted) {
			t.Fatalf("list at a compacted revision: %v", err)
		}
		if _, err := st.List(ctx, store.ListOptions{PageToken: page.NextPageToken}); !errors.Is(err, store.ErrCompacted) {
			t.Fatalf("next page at a compacted revision: %v", err)
		}
		if page, err := st.List(ctx, store.ListOptions{Revision: now}); err != nil || len(page.Items) != 4 {
			t.Fatalf("list at the compaction revision: %d items, %v", len(page.Items), err)
		}
	})
}
