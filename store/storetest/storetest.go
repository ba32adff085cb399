// Package storetest is the store.Store contract as one test suite, run against
// every implementation (store/memory and store/etcd on a real, embedded etcd):
// writes and optimistic concurrency, limits, pinned pagination, watches through
// interruptions and compaction, broken values, and the syncer on top.
package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// Harness is one store under test with the hooks the suite needs.
type Harness struct {
	// Store is the store under test.
	Store store.Store
	// Writer writes to the same data as Store but is not cut off by
	// Interrupt (the same store when Interrupt only affects watches).
	Writer store.Store
	// RawPut stores value at path (the key without prefix) as is, as
	// `etcdctl put` would, and returns the revision of the write.
	RawPut func(ctx context.Context, path string, value []byte) (int64, error)
	// RawDelete deletes path (the key without prefix, its bytes as they are),
	// as `etcdctl del` would, and returns the revision of the delete.
	RawDelete func(ctx context.Context, path string) (int64, error)
	// Compact discards the history before rev.
	Compact func(ctx context.Context, rev int64) error
	// Interrupt cuts Store off from its backend (its watches hear nothing,
	// Health eventually says so) until resume is called.
	Interrupt func() (resume func())
}

// Factory returns a fresh, empty harness; it registers its cleanup with t.
type Factory func(t *testing.T) Harness

// Run runs the whole suite.
func Run(t *testing.T, newHarness Factory) {
	t.Run("writes", func(t *testing.T) { runWrites(t, newHarness) })
	t.Run("list", func(t *testing.T) { runList(t, newHarness) })
	t.Run("watch", func(t *testing.T) { runWatch(t, newHarness) })
	t.Run("broken values", func(t *testing.T) { runBroken(t, newHarness) })
	t.Run("integrity", func(t *testing.T) { runIntegrity(t, newHarness) })
}

// Context returns a context that ends with the test, or at the guard
// deadline: a guard against hangs, never a timing assertion. (It was one
// minute for the whole test, and on a loaded machine — load 30 on 2 cores —
// writing and listing 10k keys took longer: the TestContract flake of issue
// 12 F10.)
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), guardDeadline(t))
	t.Cleanup(cancel)
	return ctx
}

// guardDeadline is 10 s before the test binary's deadline (go test -timeout),
// so that a hang fails the test with its message rather than the binary's
// panic; 10 minutes from now when there is none.
func guardDeadline(t testing.TB) time.Time {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok && time.Until(dl) > 20*time.Second {
			return dl.Add(-10 * time.Second)
		}
	}
	return time.Now().Add(10 * time.Minute)
}

// Policy returns a valid policy in mesh named name, at priority: web may
// call the service called name.
func Policy(t testing.TB, mesh, name string, priority int) resource.Resource {
	return &resource.Policy{Mesh: mesh, Name: name, Type: resource.DefaultType, Priority: int32(priority), Action: resource.Allow,
		Sources:      []resource.Selector{{Match: map[string]string{"kuma.io/service": "web"}}},
		Destinations: []resource.Selector{{Match: map[string]string{"kuma.io/service": name}}}}
}

// Decode decodes one resource from JSON or fails the test.
func Decode(t testing.TB, doc string) resource.Resource {
	t.Helper()
	r, err := resource.DecodeJSON([]byte(doc))
	if err != nil {
		t.Fatalf("decode %s: %v", doc, err)
	}
	return r
}

// Put is the op that writes r whatever is stored.
func Put(r resource.Resource) store.Op { return store.Op{Key: r.Key(), Resource: r} }

// Apply applies ops or fails the test, and returns the revision.
func Apply(t testing.TB, st store.Store, ops ...store.Op) int64 {
	t.Helper()
	rev, err := st.Apply(Context(t), ops)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return rev
}

// ApplyMany writes the resources in transactions of store.MaxOps and returns
// the last revision.
func ApplyMany(t testing.TB, st store.Store, rs []resource.Resource) int64 {
	t.Helper()
	var rev int64
	for i := 0; i < len(rs); i += store.MaxOps {
		var ops []store.Op
		for _, r := range rs[i:min(i+store.MaxOps, len(rs))] {
			ops = append(ops, Put(r))
		}
		rev = Apply(t, st, ops...)
	}
	return rev
}

// Policies returns n policies in mesh, named prefix-000000...
func Policies(t testing.TB, mesh, prefix string, n int) []resource.Resource {
	t.Helper()
	out := make([]resource.Resource, n)
	for i := range out {
		out[i] = Policy(t, mesh, fmt.Sprintf("%s-%06d", prefix, i), i%7)
	}
	return out
}

// ListAll reads every page of a list of prefix at one revision.
func ListAll(t testing.TB, st store.Store, prefix string) ([]store.Item, int64) {
	t.Helper()
	ctx := Context(t)
	var items []store.Item
	opts := store.ListOptions{Prefix: prefix}
	for {
		page, err := st.List(ctx, opts)
		if err != nil {
			t.Fatalf("list %q: %v", prefix, err)
		}
		items = append(items, page.Items...)
		if page.NextPageToken == "" {
			return items, page.Revision
		}
		opts.PageToken = page.NextPageToken
	}
}

// Digest is the digest (docs/storage.md) of the store's contents (PolicyService.Status,
// section 7), computed from a full list straight from the stored bytes: a
// snapshot's Digest equals it when the snapshot holds exactly what the store
// holds.
func Digest(t testing.TB, st store.Store) string {
	t.Helper()
	items, _ := ListAll(t, st, "")
	sort.Slice(items, func(i, j int) bool { return items[i].Path < items[j].Path })
	d := sha256.New()
	for _, it := range items {
		h := sha256.Sum256(it.Value)
		fmt.Fprintf(d, "%s %s\n", it.Path, hex.EncodeToString(h[:]))
	}
	return hex.EncodeToString(d.Sum(nil))
}

// Eventually polls cond until it holds or a generous deadline passes (a wait,
// not a timing assertion).
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := guardDeadline(t)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("error %v does not mention %q", err, p)
		}
	}
}
