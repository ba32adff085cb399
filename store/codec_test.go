package store_test

import (
	"crypto/sha256"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

const goodDoc = `{"kind":"Policy","mesh":"default","name":"a","sources":[{}],"destinations":[{}],"creationTime":"2020-01-02T03:04:05Z"}`

func TestDecodeItem(t *testing.T) {
	tests := []struct {
		name, path, value string
		err               string // "" = decodes
	}{
		{"a valid policy", "default/policies/TrafficPermission/a", goodDoc, ""},
		{"not JSON", "default/policies/TrafficPermission/a", `{`, "JSON"},
		{"an invalid document", "default/policies/TrafficPermission/a", `{"kind":"Policy","name":"a","action":"MAYBE"}`, "action"},
		{"another resource than the key's", "default/policies/TrafficPermission/b", goodDoc, "not the resource its key names"},
		{"a key that is no resource key", "default/things/a", goodDoc, "is not"},
		{"an empty path", "", goodDoc, "is not"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			it := store.DecodeItem(tt.path, []byte(tt.value), 3, 7)
			if it.Path != tt.path || string(it.Value) != tt.value || it.CreateRevision != 3 || it.ModRevision != 7 {
				t.Fatalf("item %+v does not carry its path, value and revisions", it)
			}
			c := it.Change()
			if tt.err != "" {
				if it.Err == nil || it.Resource != nil || !errors.Is(it.Err, resource.ErrInvalid) || !strings.Contains(it.Err.Error(), tt.err) {
					t.Fatalf("Err = %v, Resource = %v; want an ErrInvalid mentioning %q", it.Err, it.Resource, tt.err)
				}
				if c.Err == nil || string(c.Value) != tt.value || c.ModRevision != 7 {
					t.Fatalf("broken change %+v", c)
				}
				return
			}
			m := it.Resource.Metadata()
			if it.Err != nil || m.CreateRevision != 3 || m.ModRevision != 7 || m.ValueHash != sha256.Sum256([]byte(tt.value)) {
				t.Fatalf("item %+v, meta %+v", it, m)
			}
			if c.Resource == nil || c.Value != nil || c.Key != it.Key {
				t.Fatalf("change %+v", c)
			}
		})
	}
}

func TestDeleteChange(t *testing.T) {
	c := store.DeleteChange("default/scopes/s", 9)
	if c.Key != (resource.Key{Kind: resource.KindScope, Mesh: "default", Name: "s"}) || c.Resource != nil || c.Err != nil || c.ModRevision != 9 {
		t.Fatalf("DeleteChange = %+v", c)
	}
	if c := store.DeleteChange("junk", 9); c.Key.Kind != 0 || c.Path != "junk" {
		t.Fatalf("DeleteChange of an unparseable path = %+v", c)
	}
}

func TestCheckOps(t *testing.T) {
	a, _ := resource.DecodeJSON([]byte(goodDoc))
	b := a.(*resource.Policy).WithMeta(resource.Meta{})
	bp := *b.(*resource.Policy)
	bp.Name = "b"
	many := make([]store.Op, store.MaxOps+1)
	tests := []struct {
		name string
		ops  []store.Op
		want error
	}{
		{"no ops", nil, nil},
		{"a put without key", []store.Op{{Resource: a}}, nil},
		{"a put with its key", []store.Op{{Key: a.Key(), Resource: a}}, nil},
		{"a put and a delete", []store.Op{{Resource: a}, {Key: bp.Key(), ExpectedRevision: 4}}, nil},
		{"too many", many, store.ErrTooLarge},
		{"a put under another key", []store.Op{{Key: bp.Key(), Resource: a}}, store.ErrInvalidArgument},
		{"a delete without key", []store.Op{{}}, store.ErrInvalidArgument},
		{"one key twice", []store.Op{{Resource: a}, {Key: a.Key()}}, store.ErrInvalidArgument},
		{"a bad expected revision", []store.Op{{Resource: a, ExpectedRevision: -2}}, store.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := store.CheckOps(tt.ops)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("CheckOps = %v, want %v", err, tt.want)
			}
			if err == nil && len(keys) != len(tt.ops) {
				t.Fatalf("%d keys for %d ops", len(keys), len(tt.ops))
			}
		})
	}
}

func TestExpectations(t *testing.T) {
	tests := []struct {
		expected, actual int64
		holds            bool
	}{
		{store.AnyRevision, 0, true},
		{store.AnyRevision, 5, true},
		{store.MustNotExist, 0, true},
		{store.MustNotExist, 5, false},
		{5, 5, true},
		{5, 6, false},
		{5, 0, false},
	}
	k := resource.Key{Kind: resource.KindMesh, Mesh: "m"}
	for _, tt := range tests {
		if got := store.ExpectationHolds(tt.expected, tt.actual); got != tt.holds {
			t.Errorf("ExpectationHolds(%d, %d) = %v", tt.expected, tt.actual, got)
		}
		if !tt.holds {
			err := store.Conflict(k, tt.expected, tt.actual)
			if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "m/mesh") {
				t.Errorf("Conflict(%d, %d) = %v", tt.expected, tt.actual, err)
			}
		}
	}
}

func TestStamp(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.FixedZone("x", 3600))
	t2020 := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	t2021 := time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
	r, _ := resource.DecodeJSON([]byte(goodDoc)) // carries creationTime 2020
	bare := r.WithMeta(resource.Meta{})
	tests := []struct {
		name           string
		r              resource.Resource
		stored         string
		create, modify time.Time
	}{
		{"a create gets now", bare, "", now, now},
		{"a create keeps the times it carries", r, "", t2020, now},
		{"an update keeps the stored creationTime", bare.WithMeta(resource.Meta{CreationTime: t2021}), goodDoc, t2020, now},
		{"an update over a value without times", r, `{"kind":"Policy"}`, t2020, now},
		{"an update over a broken value", bare, `{`, now, now},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stored []byte
			if tt.stored != "" {
				stored = []byte(tt.stored)
			}
			m := store.Stamp(tt.r, stored, now).Metadata()
			if !m.CreationTime.Equal(tt.create) || !m.ModificationTime.Equal(tt.modify) {
				t.Fatalf("times %v / %v, want %v / %v", m.CreationTime, m.ModificationTime, tt.create, tt.modify)
			}
			if m.CreationTime.Location() != time.UTC || m.ModificationTime.Location() != time.UTC {
				t.Fatal("times not in UTC")
			}
		})
	}
}

func TestPageTokens(t *testing.T) {
	tok := store.EncodePageToken("m1/", 42, "m1/policies/T/x")
	rev, after, err := store.DecodePageToken("m1/", tok)
	if err != nil || rev != 42 || after != "m1/policies/T/x" {
		t.Fatalf("round trip: %d %q %v", rev, after, err)
	}
	for _, bad := range []struct{ prefix, token string }{
		{"m2/", tok},
		{"m1/", "garbage!"},
		{"m1/", store.EncodePageToken("m1/", 0, "m1/x")},
		{"m1/", store.EncodePageToken("m1/", 3, "m2/x")},
	} {
		if _, _, err := store.DecodePageToken(bad.prefix, bad.token); !errors.Is(err, store.ErrInvalidArgument) {
			t.Errorf("DecodePageToken(%q, %q) = %v", bad.prefix, bad.token, err)
		}
	}
}

func FuzzDecodePageToken(f *testing.F) {
	f.Add("m1/", store.EncodePageToken("m1/", 42, "m1/policies/T/x"))
	f.Add("", "e30")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, prefix, token string) {
		rev, after, err := store.DecodePageToken(prefix, token)
		if err != nil {
			if !errors.Is(err, store.ErrInvalidArgument) {
				t.Fatalf("error %v is not ErrInvalidArgument", err)
			}
			return
		}
		if rev <= 0 || !strings.HasPrefix(after, prefix) {
			t.Fatalf("accepted revision %d, after %q for prefix %q", rev, after, prefix)
		}
	})
}

// A TagInterner gives decoded workloads with equal tag sets one map (and
// leaves each workload's other fields, and other tag sets, its own); without
// one, each decodes its own.
func TestDecodeItemInternsTags(t *testing.T) {
	t.Parallel()
	item := func(name string, tags map[string]string, in *store.TagInterner) *resource.Workload {
		t.Helper()
		w := &resource.Workload{Mesh: "default", Name: name, Tags: tags, Addresses: []string{"10.0.0.1"}}
		b, err := resource.EncodeJSON(w)
		if err != nil {
			t.Fatal(err)
		}
		it := store.DecodeItemInterned("default/workloads/"+name, b, 1, 2, in)
		if it.Err != nil {
			t.Fatal(it.Err)
		}
		got := it.Resource.(*resource.Workload)
		if got.Name != name || !reflect.DeepEqual(got.Tags, tags) || got.Meta.ModRevision != 2 {
			t.Fatalf("decoded %+v", got)
		}
		return got
	}
	same := func(a, b map[string]string) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}
	web, db := map[string]string{"app": "web", "env": "prod"}, map[string]string{"app": "db"}
	var in store.TagInterner
	a, b, c := item("a", web, &in), item("b", web, &in), item("c", db, &in)
	if !same(a.Tags, b.Tags) || same(a.Tags, c.Tags) {
		t.Fatalf("interned: a and b share %v, a and c share %v", same(a.Tags, b.Tags), same(a.Tags, c.Tags))
	}
	if x, y := item("x", web, nil), item("y", web, nil); same(x.Tags, y.Tags) {
		t.Fatal("without an interner two workloads share a map")
	}
}

// TestDecodeItemNewlyRefused: a stored value that fails only the checks this
// release added (control characters in tags, Kuma's schema of default) is
// marked newly refused, naming the checks; one that fails another check too
// is plainly invalid.
func TestDecodeItemNewlyRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path, value string
		checks            []string // nil: not newly refused
	}{
		{"a NUL in a workload tag", "default/workloads/w",
			`{"kind":"Workload","mesh":"default","name":"w","tags":{"app":"web\u0000env\u0000prod"}}`,
			[]string{resource.StricterControl}},
		{"a typo in a permission item's conf", "default/policies/MeshTrafficPermission/p",
			`{"kind":"Policy","mesh":"default","name":"p","type":"MeshTrafficPermission","targetRef":{"kind":"Mesh"},` +
				`"from":[{"targetRef":{"kind":"Mesh"},"conf":{"actoin":"Deny"}}]}`,
			[]string{resource.StricterKumaSchema}},
		{"both", "default/policies/MeshTrafficPermission/p",
			`{"kind":"Policy","mesh":"default","name":"p","type":"MeshTrafficPermission","targetRef":{"kind":"Mesh"},` +
				`"from":[{"targetRef":{"kind":"MeshSubset","tags":{"a":"\u007f"}},"action":"DENY","conf":{"x":1}}]}`,
			[]string{resource.StricterKumaSchema, resource.StricterControl}},
		{"a stricter check and an old one", "default/policies/MeshTrafficPermission/p",
			`{"kind":"Policy","mesh":"default","name":"p","type":"MeshTrafficPermission","targetRef":{"kind":"Mesh"},` +
				`"from":[{"targetRef":{"kind":"Mesh"},"conf":{"actoin":"Deny"}}],"actoin":"DENY"}`, nil},
		{"an old check alone", "default/policies/TrafficPermission/a", `{"kind":"Policy","name":"a","action":"MAYBE"}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			it := store.DecodeItem(tt.path, []byte(tt.value), 3, 7)
			if it.Err == nil || !errors.Is(it.Err, resource.ErrInvalid) {
				t.Fatalf("Err = %v, want an ErrInvalid", it.Err)
			}
			var se *resource.StricterError
			newly := errors.As(it.Err, &se)
			if newly != (tt.checks != nil) || newly != errors.Is(it.Err, resource.ErrNewlyRefused) {
				t.Fatalf("newly refused %v (%v), want %v", newly, it.Err, tt.checks != nil)
			}
			if !newly {
				return
			}
			if !slices.Equal(se.Checks, tt.checks) || !strings.Contains(it.Err.Error(), "newly refused by a stricter check") {
				t.Errorf("checks %v, error %q; want checks %v", se.Checks, it.Err, tt.checks)
			}
		})
	}
}
