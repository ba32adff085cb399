package engine_test

import (
	"crypto/sha256"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

func decodeOneDoc(t *testing.T, doc string) resource.Resource {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(doc))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if len(rs) != 1 {
		t.Fatalf("decoded %d resources", len(rs))
	}
	return rs[0]
}

func TestWorkloadDecode(t *testing.T) {
	t.Parallel()
	w := decodeOneDoc(t, `
kind: Workload
mesh: prod
name: web-1
tags: {kuma.io/service: web, version: 2}
addresses: [10.0.0.1, "::ffff:10.0.0.2", "2001:DB8::1"]
principal: spiffe://prod/web
ports: [{port: 8080, tags: {kuma.io/protocol: http}}, {port: 9090}]
`).(*resource.Workload)
	want := &resource.Workload{Mesh: "prod", Name: "web-1",
		Tags:      map[string]string{"kuma.io/service": "web", "version": "2"},
		Addresses: []string{"10.0.0.1", "10.0.0.2", "2001:db8::1"}, Principal: "spiffe://prod/web",
		Ports: []resource.WorkloadPort{{Port: 8080, Tags: map[string]string{"kuma.io/protocol": "http"}}, {Port: 9090}}}
	if !reflect.DeepEqual(w, want) {
		t.Fatalf("got %+v\nwant %+v", w, want)
	}
	if got := w.Key().String(); got != "prod/workloads/web-1" {
		t.Errorf("key %q", got)
	}
	b, err := resource.EncodeJSON(w)
	if err != nil {
		t.Fatal(err)
	}
	back, err := resource.DecodeJSON(b)
	if err != nil || !reflect.DeepEqual(back, w) {
		t.Fatalf("round trip: %v\n%+v", err, back)
	}
	k, err := resource.ParseKey("prod/workloads/web-1")
	if err != nil || k != w.Key() {
		t.Fatalf("ParseKey: %v %+v", err, k)
	}
}

// The seed's Dataplane documents apply unchanged as workloads.
func TestDataplaneIsAWorkload(t *testing.T) {
	t.Parallel()
	w := decodeOneDoc(t, `
type: Dataplane
mesh: default
name: backend-1
networking:
  address: 192.168.0.2
  inbound:
    - port: 9000
      servicePort: 6379
      tags:
        kuma.io/service: backend
    - port: 9000
      servicePort: 6379
      tags:
        kuma.io/service: backend-api
  outbound:
    - port: 1234
      tags:
        kuma.io/service: admin
`).(*resource.Workload)
	want := &resource.Workload{Mesh: "default", Name: "backend-1",
		Tags:      map[string]string{"kuma.io/service": "backend", "kuma.io/name": "backend-1"},
		Addresses: []string{"192.168.0.2"},
		Ports: []resource.WorkloadPort{
			{Port: 9000, Tags: map[string]string{"kuma.io/service": "backend"}},
			{Port: 9000, Tags: map[string]string{"kuma.io/service": "backend-api"}}}}
	if !reflect.DeepEqual(w, want) {
		t.Fatalf("got %+v\nwant %+v", w, want)
	}
}

func TestWorkloadDecodeErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, doc, field, why string
	}{
		{"reserved ip tag", `{kind: Workload, name: w, tags: {ip: 10.0.0.1}}`, `tags["ip"]`, "reserved"},
		{"reserved principal tag", `{kind: Workload, name: w, tags: {principal: x}}`, `tags["principal"]`, "reserved"},
		{"reserved in port tags", `{kind: Workload, name: w, ports: [{port: 80, tags: {ip: x}}]}`, `ports[0].tags["ip"]`, "reserved"},
		{"bad address", `{kind: Workload, name: w, addresses: [10.0.0.300]}`, "addresses[0]", "not an IP address"},
		{"zone", `{kind: Workload, name: w, addresses: ["fe80::1%eth0"]}`, "addresses[0]", "zone"},
		{"address twice", `{kind: Workload, name: w, addresses: [10.0.0.1, 10.0.0.1]}`, "addresses[1]", "also addresses[0]"},
		{"port zero", `{kind: Workload, name: w, ports: [{port: 0}]}`, "ports[0].port", "1 to 65535"},
		{"port missing", `{kind: Workload, name: w, ports: [{tags: {a: b}}]}`, "ports[0].port", "required"},
		{"wildcard tag", `{kind: Workload, name: w, tags: {a: ''}}`, `tags["a"]`, "empty"},
		{"unknown field", `{kind: Workload, name: w, address: 10.0.0.1}`, "address", "unknown field"},
		{"dataplane without networking", `{type: Dataplane, name: d}`, "networking", "required"},
		{"dataplane unknown inbound field", `{type: Dataplane, name: d, networking: {address: 10.0.0.1, inbound: [{port: 1, tagz: {}}]}}`, "networking.inbound[0].tagz", "unknown field"},
		{"dataplane reserved", `{type: Dataplane, name: d, networking: {address: 10.0.0.1, inbound: [{port: 1, tags: {ip: x}}]}}`, `networking.inbound[0].tags["ip"]`, "reserved"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := resource.DecodeYAML([]byte(c.doc))
			if err == nil {
				t.Fatal("decoded")
			}
			want := "documents[0] (line 1)." + c.field
			if !strings.Contains(err.Error(), want+": ") || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("want %q ... %q, got %v", want, c.why, err)
			}
		})
	}
}

func workload(name string, rev int64, tags map[string]string, addrs ...string) *resource.Workload {
	return &resource.Workload{Mesh: "default", Name: name, Tags: tags, Addresses: addrs,
		Meta: resource.Meta{CreateRevision: rev, ModRevision: rev}}
}

// An address belongs to one workload: the later-written claimant is invalid,
// with a reason naming the other; when the earlier one goes, it becomes valid.
func TestWorkloadAddressConflict(t *testing.T) {
	t.Parallel()
	a := workload("a", 1, map[string]string{"app": "a"}, "10.0.0.1")
	b := workload("b", 2, map[string]string{"app": "b"}, "10.0.0.2", "10.0.0.1")
	s := engine.Build(2, []resource.Resource{b, a})
	inv := s.Invalid()
	if len(inv) != 1 || inv[0].Path != "default/workloads/b" || !strings.Contains(inv[0].Err.Error(), `workload "a"`) {
		t.Fatalf("invalid: %+v", inv)
	}
	if e, _ := s.Get(b.Key()); e.Err == nil {
		t.Fatal("Get shows b valid")
	}
	if n := s.Len(); n != 2 {
		t.Fatalf("Len %d", n)
	}
	s2 := s.Apply(3, []engine.Change{engine.Delete(a.Key())})
	if inv := s2.Invalid(); len(inv) != 0 {
		t.Fatalf("after delete: %+v", inv)
	}
	// CheckApply refuses a conflicting write, naming both.
	c := workload("c", 0, nil, "10.0.0.2")
	err := s2.CheckApply([]resource.Resource{c}, nil)
	if err == nil || !strings.Contains(err.Error(), "resources[0]") || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("CheckApply: %v", err)
	}
}

// A mesh that holds only workloads exists, and its digest covers them.
func TestWorkloadOnlyMeshAndDigest(t *testing.T) {
	t.Parallel()
	a := workload("a", 1, map[string]string{"app": "a"}, "10.0.0.1")
	s := engine.Build(1, []resource.Resource{a})
	if _, err := s.Decide(&engine.Request{}); err != nil {
		t.Fatalf("Decide on a mesh of workloads: %v", err)
	}
	d1 := s.Digest()
	a2 := workload("a", 2, map[string]string{"app": "a2"}, "10.0.0.1")
	s2 := s.Apply(2, []engine.Change{engine.Put(a2)})
	if s2.Digest() == d1 {
		t.Fatal("digest did not change with the workload")
	}
	s3 := s2.Apply(3, []engine.Change{engine.Delete(a.Key())})
	if s3.Len() != 0 {
		t.Fatalf("Len %d", s3.Len())
	}
	if _, err := s3.Decide(&engine.Request{}); err == nil {
		t.Fatal("the mesh still exists")
	}
}

func TestIdentityEncoding(t *testing.T) {
	t.Parallel()
	// docs/workloads.md, "Identities": keys sorted (app < env), reserved keys left out.
	a := resource.Identity("default", map[string]string{"env": "prod", "app": "web", "ip": "10.0.0.1"})
	b := resource.Identity("", map[string]string{"app": "web", "env": "prod", "principal": "x"})
	if a != b {
		t.Fatalf("%d != %d", a, b)
	}
	sum := sha256.Sum256([]byte("default\x00app\x00web\x00env\x00prod\x00"))
	if want := binary.BigEndian.Uint64(sum[:8]); a != want {
		t.Fatalf("identity %#x, want %#x", a, want)
	}
	if resource.Identity("other", map[string]string{"app": "web", "env": "prod"}) == a {
		t.Fatal("the mesh is not in the identity")
	}
}

// BenchmarkIdentity: the identity of a tag-form endpoint, which every tag-form
// answer reports per side.
func BenchmarkIdentity(b *testing.B) {
	tags := map[string]string{"kuma.io/service": "backend-api", "env": "prod", "region": "eu-central",
		"zone": "zone-3", "version": "v2", "team": "payments"}
	b.ReportAllocs()
	for b.Loop() {
		_ = resource.Identity("default", tags)
	}
}

// A principal's holders come and go: one holder (kept without maps of holders
// and pair counts), two, one again, none; the resolution's tags and holder
// count follow at each step.
func TestPrincipalHoldersComeAndGo(t *testing.T) {
	t.Parallel()
	const p = "spiffe://default/web"
	withPrincipal := func(w *resource.Workload) *resource.Workload { w.Principal = p; return w }
	a := withPrincipal(workload("a", 1, map[string]string{"app": "web", "env": "prod"}, "10.0.0.1"))
	b := withPrincipal(workload("b", 2, map[string]string{"app": "web", "env": "dev"}, "10.0.0.2"))
	resolve := func(s *engine.Snapshot) (inventory.EndpointResolution, error) {
		return s.ResolveEndpoint("", &inventory.Endpoint{Principal: p}, false, 0, nil)
	}
	steps := []struct {
		name    string
		change  engine.Change
		holders int
		tags    resource.Tags
	}{
		{"one holder: its tags", engine.Put(a), 1, resource.Tags{"app": "web", "env": "prod", "principal": p}},
		{"two holders: the tags they share", engine.Put(b), 2, resource.Tags{"app": "web", "principal": p}},
		{"the first goes: the second's tags", engine.Delete(a.Key()), 1, resource.Tags{"app": "web", "env": "dev", "principal": p}},
		{"back to two", engine.Put(a), 2, resource.Tags{"app": "web", "principal": p}},
		{"the second goes", engine.Delete(b.Key()), 1, resource.Tags{"app": "web", "env": "prod", "principal": p}},
		{"none: unknown", engine.Delete(a.Key()), 0, resource.Tags{"principal": p}},
	}
	s := engine.Empty()
	for i, st := range steps {
		s = s.Apply(int64(i+3), []engine.Change{st.change})
		r, err := resolve(s)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		want := inventory.AsPrincipalHolders
		if st.holders == 0 {
			want = inventory.AsKumaSpiffe
			st.tags = resource.Tags{"kuma.io/service": "web", "principal": p}
		}
		if r.ResolvedAs != want || r.Holders != st.holders || !reflect.DeepEqual(r.Tags, st.tags) {
			t.Fatalf("%s: got %v, %d holders, %v; want %v, %d, %v", st.name, r.ResolvedAs, r.Holders, r.Tags, want, st.holders, st.tags)
		}
	}
}

// Workloads with one tag set share its map in the snapshot; each still reads
// as written (its own name, addresses and revisions), and a tag change of one
// leaves the other's tags alone.
func TestWorkloadTagSetsShared(t *testing.T) {
	t.Parallel()
	a := workload("a", 1, map[string]string{"app": "web"}, "10.0.0.1")
	b := workload("b", 2, map[string]string{"app": "web"}, "10.0.0.2")
	s := engine.Build(2, []resource.Resource{a, b})
	for _, w := range []*resource.Workload{a, b} {
		e, ok := s.Get(w.Key())
		if !ok || e.Err != nil || !reflect.DeepEqual(e.Resource, resource.Resource(w)) {
			t.Fatalf("Get(%s) = %+v, want %+v", w.Name, e.Resource, w)
		}
	}
	ga, _ := s.Get(a.Key())
	gb, _ := s.Get(b.Key())
	if reflect.ValueOf(ga.Resource.(*resource.Workload).Tags).UnsafePointer() != reflect.ValueOf(gb.Resource.(*resource.Workload).Tags).UnsafePointer() {
		t.Fatal("the two workloads' equal tag sets are two maps")
	}
	moved := workload("b", 3, map[string]string{"app": "db"}, "10.0.0.2")
	s = s.Apply(3, []engine.Change{engine.Put(moved)})
	ga, _ = s.Get(a.Key())
	gb, _ = s.Get(b.Key())
	if !reflect.DeepEqual(ga.Resource.(*resource.Workload).Tags, map[string]string{"app": "web"}) ||
		!reflect.DeepEqual(gb.Resource.(*resource.Workload).Tags, map[string]string{"app": "db"}) {
		t.Fatalf("after b moved: a %v, b %v", ga.Resource.(*resource.Workload).Tags, gb.Resource.(*resource.Workload).Tags)
	}
}
