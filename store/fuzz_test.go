package store_test

import (
	"crypto/sha256"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// FuzzDecodeItem feeds arbitrary keys and values, as etcdctl could write them
// under the prefix, through DecodeItem and into a snapshot between two valid
// resources: a value either decodes into the resource its key names (with the
// hash of its bytes) or comes back as a broken value (ErrInvalid, its bytes
// kept); a snapshot applies it either way, keeps the valid resources, counts
// it in Digest, and takes the next change as usual — a malformed value never
// stops the watch.
func FuzzDecodeItem(f *testing.F) {
	f.Add("default/policies/TrafficPermission/a", []byte(goodDoc))
	f.Add("default/policies/TrafficPermission/a", []byte(`{"kind":"Policy","name":`))
	f.Add("default/policies/TrafficPermission/b", []byte(goodDoc))
	f.Add("default/mesh", []byte(`{"kind":"Mesh","name":"default","defaultAction":"ALLOW"}`))
	f.Add("default/scopes/S", []byte(`{"kind":"Scope","name":"S","selectors":[{}],"parent":"S"}`))
	f.Add("not/a/key/at/all/x", []byte("\xff\xfe"))
	f.Add("\xff\xfe/mesh", []byte(`{"kind":"Mesh","name":"x"}`))
	f.Add("m/policies/T/x", []byte(`{"kind":"Policy","mesh":"m","type":"T","name":"x","targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"action":"DENY"}]}`))
	keep := store.DecodeItem("keep/policies/TrafficPermission/k", []byte(`{"kind":"Policy","mesh":"keep","name":"k","sources":[{}],"destinations":[{}]}`), 1, 1)
	after := store.DecodeItem("keep/policies/TrafficPermission/after", []byte(`{"kind":"Policy","mesh":"keep","name":"after","sources":[{}],"destinations":[{}],"action":"DENY"}`), 3, 3)
	if keep.Err != nil || after.Err != nil {
		f.Fatal(keep.Err, after.Err)
	}
	f.Fuzz(func(t *testing.T, path string, value []byte) {
		it := store.DecodeItem(path, value, 2, 2)
		switch {
		case it.Err != nil:
			if it.Resource != nil || !errors.Is(it.Err, resource.ErrInvalid) {
				t.Fatalf("broken value: resource %v, error %v", it.Resource, it.Err)
			}
		case it.Resource == nil:
			t.Fatal("neither a resource nor an error")
		case it.Resource.Key().String() != path || it.Resource.Metadata().ValueHash != sha256.Sum256(value):
			t.Fatalf("decoded %s with hash %x from %q", it.Resource.Key(), it.Resource.Metadata().ValueHash, path)
		}
		if it.Path != path {
			t.Fatalf("item %q read from key %q: want the key's bytes", it.Path, path)
		}
		if !utf8.ValidString(store.RenderPath(it.Path)) || it.Err != nil && !utf8.ValidString(it.Err.Error()) {
			t.Fatalf("item %q, error %v: not UTF-8 once shown (a protobuf string must be)", it.Path, it.Err)
		}
		snap := engine.Empty().Apply(1, []engine.Change{keep.Change()})
		snap = snap.Apply(2, []engine.Change{it.Change()})
		if path != keep.Path {
			if e, ok := snap.Get(keep.Key); !ok || e.Err != nil {
				t.Fatalf("a value at %q disturbed another mesh's resource: %v", path, e.Err)
			}
		}
		if snap.Len() < 1 || len(snap.Digest()) != 64 {
			t.Fatalf("snapshot of %d entries, digest %q", snap.Len(), snap.Digest())
		}
		snap = snap.Apply(3, []engine.Change{after.Change()})
		if e, ok := snap.Get(after.Key); !ok || e.Resource == nil || snap.Revision() != 3 {
			t.Fatalf("the change after a value at %q was not applied", path)
		}
	})
}
