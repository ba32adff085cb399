package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

func runWrites(t *testing.T, newHarness Factory) {
	t.Run("apply creates, updates and deletes", func(t *testing.T) {
		st := newHarness(t).Store
		ctx := Context(t)
		p := Policy(t, "default", "a", 1)
		rev1 := Apply(t, st, Put(p))
		it, err := st.Get(ctx, p.Key())
		if err != nil {
			t.Fatal(err)
		}
		if it.Err != nil || it.Resource == nil {
			t.Fatalf("Get = %+v", it)
		}
		if it.Path != "default/policies/TrafficPermission/a" || it.Key != p.Key() {
			t.Fatalf("Get path %q key %v", it.Path, it.Key)
		}
		m := it.Resource.Metadata()
		if it.CreateRevision != rev1 || it.ModRevision != rev1 || m.CreateRevision != rev1 || m.ModRevision != rev1 {
			t.Fatalf("revisions %d/%d, meta %d/%d, want %d", it.CreateRevision, it.ModRevision, m.CreateRevision, m.ModRevision, rev1)
		}
		if m.CreationTime.IsZero() || !m.ModificationTime.Equal(m.CreationTime) || m.CreationTime.Location() != time.UTC {
			t.Fatalf("times on create: %v / %v", m.CreationTime, m.ModificationTime)
		}
		if r, err := resource.DecodeJSON(it.Value); err != nil || r.Key() != p.Key() {
			t.Fatalf("stored value %s does not decode to the resource: %v", it.Value, err)
		}

		rev2 := Apply(t, st, Put(Policy(t, "default", "a", 2)))
		it2, err := st.Get(ctx, p.Key())
		if err != nil {
			t.Fatal(err)
		}
		m2 := it2.Resource.Metadata()
		if rev2 <= rev1 || it2.CreateRevision != rev1 || it2.ModRevision != rev2 {
			t.Fatalf("after update: revisions %d/%d, want %d/%d", it2.CreateRevision, it2.ModRevision, rev1, rev2)
		}
		if !m2.CreationTime.Equal(m.CreationTime) || m2.ModificationTime.Before(m.CreationTime) {
			t.Fatalf("after update: times %v / %v, created %v", m2.CreationTime, m2.ModificationTime, m.CreationTime)
		}
		if it2.Resource.(*resource.Policy).Priority != 2 {
			t.Fatal("update not stored")
		}

		rev3 := Apply(t, st, store.Op{Key: p.Key()})
		if _, err := st.Get(ctx, p.Key()); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after delete: %v, want ErrNotFound", err)
		}
		if rev3 <= rev2 {
			t.Fatalf("delete revision %d after %d", rev3, rev2)
		}
		if _, err := st.Apply(ctx, []store.Op{{Key: p.Key()}}); err != nil {
			t.Fatalf("deleting a missing key: %v", err)
		}
		if rev, err := st.Apply(ctx, nil); err != nil || rev < rev3 {
			t.Fatalf("empty Apply = %d, %v; want the current revision", rev, err)
		}
	})

	t.Run("a create keeps the times it carries, an update the stored creationTime", func(t *testing.T) {
		st := newHarness(t).Store
		ctx := Context(t)
		t2020 := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
		p := Policy(t, "default", "timed", 0)
		Apply(t, st, Put(p.WithMeta(resource.Meta{CreationTime: t2020, ModificationTime: t2020})))
		it, _ := st.Get(ctx, p.Key())
		if m := it.Resource.Metadata(); !m.CreationTime.Equal(t2020) || !m.ModificationTime.Equal(t2020) {
			t.Fatalf("create: times %v / %v, want 2020", m.CreationTime, m.ModificationTime)
		}
		Apply(t, st, Put(p.WithMeta(resource.Meta{CreationTime: t2020.AddDate(1, 0, 0)})))
		it, _ = st.Get(ctx, p.Key())
		if m := it.Resource.Metadata(); !m.CreationTime.Equal(t2020) || !m.ModificationTime.After(t2020) {
			t.Fatalf("update: times %v / %v, want creation 2020, modification now", m.CreationTime, m.ModificationTime)
		}
	})

	t.Run("a stale Current changes no outcome", func(t *testing.T) {
		// Op.Current is what the caller's snapshot says a key holds; a store
		// may write with it without reading the key. Stale (its mod revision
		// is not the key's), it must cost at most a retry: the stored
		// creationTime is kept, a create keeps the times it carries,
		// conflicts and missing scopes are still reported.
		st := newHarness(t).Store
		ctx := Context(t)
		t2020 := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
		t1999 := time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC)
		p := Policy(t, "default", "cur", 0)
		rev := Apply(t, st, Put(p.WithMeta(resource.Meta{CreationTime: t2020, ModificationTime: t2020})))
		with := func(r resource.Resource, expected int64, cur store.Current) store.Op {
			return store.Op{Key: r.Key(), Resource: r, ExpectedRevision: expected, Current: &cur}
		}
		created := func(k resource.Key) time.Time {
			it, err := st.Get(ctx, k)
			if err != nil || it.Resource == nil {
				t.Fatalf("Get %s: %+v, %v", k, it, err)
			}
			return it.Resource.Metadata().CreationTime
		}
		updates := []struct {
			name string
			cur  store.Current
		}{
			{"right", store.Current{ModRevision: rev, CreationTime: t2020}},
			{"a stale mod revision and another creationTime", store.Current{ModRevision: 1, CreationTime: t1999}},
			{"nothing stored", store.Current{}},
		}
		for i, u := range updates {
			cur := u.cur
			if _, err := st.Apply(ctx, []store.Op{with(Policy(t, "default", "cur", i+1), store.AnyRevision, cur)}); err != nil {
				t.Fatalf("update with %s Current: %v", u.name, err)
			}
			if got := created(p.Key()); !got.Equal(t2020) {
				t.Fatalf("update with %s Current: creationTime %v, want the stored %v", u.name, got, t2020)
			}
		}
		n := Policy(t, "default", "new", 0).WithMeta(resource.Meta{CreationTime: t1999, ModificationTime: t1999})
		if _, err := st.Apply(ctx, []store.Op{with(n, store.AnyRevision, store.Current{ModRevision: rev, CreationTime: t2020})}); err != nil {
			t.Fatalf("create with a Current saying it exists: %v", err)
		}
		if got := created(n.Key()); !got.Equal(t1999) {
			t.Fatalf("create with a Current saying it exists: creationTime %v, want the carried %v", got, t1999)
		}
		if _, err := st.Apply(ctx, []store.Op{with(p, store.MustNotExist, store.Current{})}); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("a create of an existing key, with a Current saying it is absent: %v, want ErrConflict", err)
		}
		if _, err := st.Apply(ctx, []store.Op{with(p, rev, store.Current{ModRevision: rev})}); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("an update at a stale revision, with a Current agreeing: %v, want ErrConflict", err)
		}
		q := &resource.Policy{Mesh: "default", Name: "scoped", Type: resource.DefaultType, Scope: "Nope", Action: resource.Deny,
			Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}}
		if _, err := st.Apply(ctx, []store.Op{with(q, store.AnyRevision, store.Current{})}); !errors.Is(err, store.ErrIntegrity) {
			t.Fatalf("a policy in a missing scope, with a Current: %v, want ErrIntegrity", err)
		}
	})

	t.Run("expected revisions", func(t *testing.T) {
		st := newHarness(t).Store
		ctx := Context(t)
		a := Policy(t, "default", "a", 0)
		ra := Apply(t, st, Put(a))
		rb := Apply(t, st, Put(Policy(t, "default", "b", 0)))
		tests := []struct {
			name     string
			ops      []store.Op
			conflict string // the key the conflict names; "" = success
		}{
			{"a create of an existing key conflicts", []store.Op{{Resource: a, ExpectedRevision: store.MustNotExist}}, "default/policies/TrafficPermission/a"},
			{"a create of a new key succeeds", []store.Op{{Resource: Policy(t, "default", "c", 0), ExpectedRevision: store.MustNotExist}}, ""},
			{"an update at a stale revision conflicts", []store.Op{{Resource: a, ExpectedRevision: ra - 1}}, "default/policies/TrafficPermission/a"},
			{"an update at the current revision succeeds", []store.Op{{Resource: a, ExpectedRevision: ra}}, ""},
			{"an update at the old revision now conflicts", []store.Op{{Resource: a, ExpectedRevision: ra}}, "default/policies/TrafficPermission/a"},
			{"an update of a missing key at a revision conflicts", []store.Op{{Resource: Policy(t, "default", "nope", 0), ExpectedRevision: ra}}, "default/policies/TrafficPermission/nope"},
			{"a delete at a stale revision conflicts", []store.Op{{Key: a.Key(), ExpectedRevision: ra}}, "default/policies/TrafficPermission/a"},
			{"a conflict anywhere writes nothing", []store.Op{Put(Policy(t, "default", "d", 0)), {Key: resource.Key{Kind: resource.KindPolicy, Mesh: "default", Type: "TrafficPermission", Name: "b"}, ExpectedRevision: rb + 1000}}, "default/policies/TrafficPermission/b"},
			{"a delete at the current revision succeeds", []store.Op{{Key: Policy(t, "default", "b", 0).Key(), ExpectedRevision: rb}}, ""},
		}
		for _, tt := range tests {
			_, err := st.Apply(ctx, tt.ops)
			if tt.conflict == "" {
				if err != nil {
					t.Fatalf("%s: %v", tt.name, err)
				}
				continue
			}
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("%s: %v, want ErrConflict", tt.name, err)
			}
			mustContain(t, err, tt.conflict)
		}
		if _, err := st.Get(ctx, Policy(t, "default", "d", 0).Key()); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a put of a conflicting transaction was written: %v", err)
		}
	})

	t.Run("concurrent writers keep creationTime", func(t *testing.T) {
		st := newHarness(t).Store
		ctx := Context(t)
		p := Policy(t, "default", "hot", 0)
		rev0 := Apply(t, st, Put(p))
		first, _ := st.Get(ctx, p.Key())
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for w := range 4 {
			updates := make([]resource.Resource, 10)
			for i := range updates {
				updates[i] = Policy(t, "default", "hot", w*100+i)
			}
			wg.Go(func() {
				for _, u := range updates {
					if _, err := st.Apply(ctx, []store.Op{Put(u)}); err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent update: %v", err)
		}
		it, _ := st.Get(ctx, p.Key())
		if it.CreateRevision != rev0 || !it.Resource.Metadata().CreationTime.Equal(first.Resource.Metadata().CreationTime) {
			t.Fatalf("after concurrent updates: create revision %d (want %d), creationTime %v (want %v)",
				it.CreateRevision, rev0, it.Resource.Metadata().CreationTime, first.Resource.Metadata().CreationTime)
		}
	})

	t.Run("limits and invalid ops are refused before anything is written", func(t *testing.T) {
		st := newHarness(t).Store
		ctx := Context(t)
		big := func(name string) resource.Resource {
			return Decode(t, fmt.Sprintf(`{"kind":"Policy","mesh":"default","name":%q,"sources":[{}],"destinations":[{}],"conf":{"blob":%q}}`,
				name, strings.Repeat("x", 600*1024)))
		}
		many := make([]store.Op, store.MaxOps+1)
		for i := range many {
			many[i] = Put(Policy(t, "default", fmt.Sprintf("p%d", i), 0))
		}
		a := Policy(t, "default", "a", 0)
		tests := []struct {
			name string
			ops  []store.Op
			want error
		}{
			{"129 operations", many, store.ErrTooLarge},
			{"1.8 MiB of values", []store.Op{Put(big("big1")), Put(big("big2")), Put(big("big3"))}, store.ErrTooLarge},
			{"two ops on one key", []store.Op{Put(a), {Key: a.Key()}}, store.ErrInvalidArgument},
			{"a key that is not the resource's", []store.Op{{Key: Policy(t, "default", "b", 0).Key(), Resource: a}}, store.ErrInvalidArgument},
			{"a delete without a key", []store.Op{{}}, store.ErrInvalidArgument},
		}
		for _, tt := range tests {
			if _, err := st.Apply(ctx, tt.ops); !errors.Is(err, tt.want) {
				t.Fatalf("%s: %v, want %v", tt.name, err, tt.want)
			}
		}
		if items, _ := ListAll(t, st, ""); len(items) != 0 {
			t.Fatalf("refused writes stored %d items", len(items))
		}
		// Just under the limits goes through.
		if _, err := st.Apply(ctx, many[:store.MaxOps]); err != nil {
			t.Fatalf("128 operations: %v", err)
		}
		if _, err := st.Apply(ctx, []store.Op{Put(big("big1")), Put(big("big2"))}); err != nil {
			t.Fatalf("1.2 MiB of values: %v", err)
		}
	})
}
