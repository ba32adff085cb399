package engine_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The inventory of the resolution tests: web-1 and web-2 share a principal,
// db-1 owns 10.0.0.3, bad-1 (written after db-1, naming its address) is
// invalid and resolves as unknown everywhere.
const endpointInventory = `
kind: Mesh
name: default
---
kind: Workload
name: web-1
tags: {kuma.io/service: web, env: prod}
addresses: [10.0.0.1, "2001:db8::1"]
principal: spiffe://default/web
ports:
  - {port: 8080, tags: {kuma.io/protocol: http}}
  - {port: 8080, tags: {second: entry}}
  - {port: 9090, tags: {kuma.io/service: web-admin}}
  - {port: 7070}
---
kind: Workload
name: web-2
tags: {kuma.io/service: web, env: stage}
addresses: [10.0.0.2]
principal: spiffe://default/web
---
kind: Workload
name: db-1
tags: {kuma.io/service: db}
addresses: [10.0.0.3]
modificationTime: 2024-01-01T00:00:00Z
---
kind: Workload
name: bad-1
tags: {kuma.io/service: bad}
addresses: [10.0.0.9, 10.0.0.3]
principal: urn:bad
modificationTime: 2024-06-01T00:00:00Z
`

func endpointSnapshot(t *testing.T, more string) *engine.Snapshot {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(endpointInventory + more))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs { // write order: the documents' order
		m := r.Metadata()
		m.CreateRevision, m.ModRevision = int64(i+1), int64(i+1)
		rs[i] = r.WithMeta(m)
	}
	s := engine.Build(int64(len(rs)), rs)
	if inv := s.Invalid(); len(inv) != 1 || inv[0].Path != "default/workloads/bad-1" {
		t.Fatalf("invalid: %+v", inv)
	}
	return s
}

func TestResolveEndpoint(t *testing.T) {
	t.Parallel()
	s := endpointSnapshot(t, "")
	web1 := resource.Tags{"kuma.io/service": "web", "env": "prod"}
	id := func(tags resource.Tags) uint64 { return resource.Identity("default", tags) }
	with := func(base resource.Tags, kv ...string) resource.Tags {
		out := maps.Clone(base)
		if out == nil {
			out = resource.Tags{}
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	registered := resource.Tags{"app": "registered"}
	reg := inventory.NewRegistry(0, 0)
	if _, err := s.Identify("default", registered, reg); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		mesh     string
		ep       inventory.Endpoint
		dst      bool
		port     uint32
		reg      *inventory.Registry
		as       inventory.ResolvedAs
		workload string
		holders  int
		tags     resource.Tags
		notFound bool
	}{
		{name: "tags are used as given", ep: inventory.Endpoint{Tags: resource.Tags{"a": "b", "ip": "1.2.3.4"}},
			as: inventory.AsTags, tags: resource.Tags{"a": "b", "ip": "1.2.3.4"}},
		{name: "no form is the empty tag set", as: inventory.AsTags, tags: resource.Tags{}},
		{name: "a workload source has its own tags", ep: inventory.Endpoint{Workload: "web-1"}, port: 8080,
			as: inventory.AsWorkload, workload: "web-1", tags: web1},
		{name: "a workload destination adds its first ports entry for the port", ep: inventory.Endpoint{Workload: "web-1"}, dst: true, port: 8080,
			as: inventory.AsWorkload, workload: "web-1", tags: with(web1, "kuma.io/protocol", "http")},
		{name: "port tags win over the workload's own", ep: inventory.Endpoint{Workload: "web-1"}, dst: true, port: 9090,
			as: inventory.AsWorkload, workload: "web-1", tags: with(web1, "kuma.io/service", "web-admin")},
		{name: "a port entry without tags adds nothing", ep: inventory.Endpoint{Workload: "web-1"}, dst: true, port: 7070,
			as: inventory.AsWorkload, workload: "web-1", tags: web1},
		{name: "a destination with no port has its own tags", ep: inventory.Endpoint{Workload: "web-1"}, dst: true,
			as: inventory.AsWorkload, workload: "web-1", tags: web1},
		{name: "an unknown workload is not found", ep: inventory.Endpoint{Workload: "nope"}, notFound: true},
		{name: "an invalid workload is not found", ep: inventory.Endpoint{Workload: "bad-1"}, notFound: true},
		{name: "a workload of another mesh is not found", mesh: "other", ep: inventory.Endpoint{Workload: "web-1"}, notFound: true},
		{name: "a known address is its workload's tags and ip", ep: inventory.Endpoint{Address: "10.0.0.1"}, port: 8080,
			as: inventory.AsWorkload, workload: "web-1", tags: with(web1, "ip", "10.0.0.1")},
		{name: "a known destination address adds the port's tags", ep: inventory.Endpoint{Address: "10.0.0.1"}, dst: true, port: 8080,
			as: inventory.AsWorkload, workload: "web-1", tags: with(web1, "kuma.io/protocol", "http", "ip", "10.0.0.1")},
		{name: "an IPv6 address is canonical", ep: inventory.Endpoint{Address: "2001:DB8:0::1"},
			as: inventory.AsWorkload, workload: "web-1", tags: with(web1, "ip", "2001:db8::1")},
		{name: "an IPv4-mapped address is the IPv4 address", ep: inventory.Endpoint{Address: "::ffff:10.0.0.2"},
			as: inventory.AsWorkload, workload: "web-2", tags: resource.Tags{"kuma.io/service": "web", "env": "stage", "ip": "10.0.0.2"}},
		{name: "an unknown address is external", ep: inventory.Endpoint{Address: "10.9.9.9"}, dst: true, port: 8080,
			as: inventory.AsExternal, tags: resource.Tags{"ip": "10.9.9.9"}},
		{name: "an unknown IPv6 address is external and canonical", ep: inventory.Endpoint{Address: "2001:db8:0:0::99"},
			as: inventory.AsExternal, tags: resource.Tags{"ip": "2001:db8::99"}},
		{name: "an address of an invalid workload is external", ep: inventory.Endpoint{Address: "10.0.0.9"},
			as: inventory.AsExternal, tags: resource.Tags{"ip": "10.0.0.9"}},
		{name: "a contested address is its earlier-written claimant's", ep: inventory.Endpoint{Address: "10.0.0.3"},
			as: inventory.AsWorkload, workload: "db-1", tags: resource.Tags{"kuma.io/service": "db", "ip": "10.0.0.3"}},
		{name: "an address in another mesh is external", mesh: "other", ep: inventory.Endpoint{Address: "10.0.0.1"},
			as: inventory.AsExternal, tags: resource.Tags{"ip": "10.0.0.1"}},
		{name: "a held principal is the tags its holders share, without port tags", ep: inventory.Endpoint{Principal: "spiffe://default/web"},
			dst: true, port: 8080, as: inventory.AsPrincipalHolders, holders: 2,
			tags: resource.Tags{"kuma.io/service": "web", "principal": "spiffe://default/web"}},
		{name: "a Kuma SPIFFE ID no workload holds names the service", ep: inventory.Endpoint{Principal: "spiffe://default/api"},
			as: inventory.AsKumaSpiffe, tags: resource.Tags{"kuma.io/service": "api", "principal": "spiffe://default/api"}},
		{name: "a Kuma SPIFFE ID of another mesh is an unknown principal", ep: inventory.Endpoint{Principal: "spiffe://other/api"},
			as: inventory.AsUnknownPrincipal, tags: resource.Tags{"principal": "spiffe://other/api"}},
		{name: "the SPIFFE form counts in the request's mesh", mesh: "other", ep: inventory.Endpoint{Principal: "spiffe://other/api"},
			as: inventory.AsKumaSpiffe, tags: resource.Tags{"kuma.io/service": "api", "principal": "spiffe://other/api"}},
		{name: "a SPIFFE ID with a longer path is an unknown principal", ep: inventory.Endpoint{Principal: "spiffe://default/ns/x/sa/y"},
			as: inventory.AsUnknownPrincipal, tags: resource.Tags{"principal": "spiffe://default/ns/x/sa/y"}},
		{name: "a SPIFFE ID with no service is an unknown principal", ep: inventory.Endpoint{Principal: "spiffe://default/"},
			as: inventory.AsUnknownPrincipal, tags: resource.Tags{"principal": "spiffe://default/"}},
		{name: "a principal only an invalid workload holds is unknown", ep: inventory.Endpoint{Principal: "urn:bad"},
			as: inventory.AsUnknownPrincipal, tags: resource.Tags{"principal": "urn:bad"}},
		{name: "an identity is a workload's own tag set, without port tags", ep: inventory.Endpoint{Identity: id(web1)}, dst: true, port: 8080,
			as: inventory.AsIdentity, tags: web1},
		{name: "an identity only an invalid workload has is not found", ep: inventory.Endpoint{Identity: id(resource.Tags{"kuma.io/service": "bad"})},
			notFound: true},
		{name: "an unknown identity is not found", ep: inventory.Endpoint{Identity: 42}, notFound: true},
		{name: "an identity of another mesh is not found", mesh: "other", ep: inventory.Endpoint{Identity: id(web1)}, notFound: true},
		{name: "a registered identity resolves", ep: inventory.Endpoint{Identity: id(registered)},
			reg: reg, as: inventory.AsIdentity, tags: registered},
		{name: "a registered identity needs the registry", ep: inventory.Endpoint{Identity: id(registered)}, notFound: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ep := c.ep
			r, err := s.ResolveEndpoint(c.mesh, &ep, c.dst, c.port, c.reg)
			if c.notFound {
				if !errors.Is(err, inventory.ErrEndpointNotFound) && !errors.Is(err, inventory.ErrIdentityNotFound) {
					t.Fatalf("want not found, got %+v, %v", r, err)
				}
				if name, _ := engine.CodeName(err); name != "NotFound" {
					t.Fatalf("code %q", name)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mesh := c.mesh
			if mesh == "" {
				mesh = "default"
			}
			want := inventory.EndpointResolution{Form: c.ep.Form(), ResolvedAs: c.as, Workload: c.workload, Holders: c.holders,
				Identity: resource.Identity(mesh, c.tags), Tags: c.tags}
			if !reflect.DeepEqual(r, want) {
				t.Fatalf("got  %+v\nwant %+v", r, want)
			}
		})
	}
}

func TestEndpointValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		req   engine.Request
		field string // "" = valid
		why   string
	}{
		{name: "one form each", req: engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "web-1"},
			DestinationEndpoint: &inventory.Endpoint{Address: "10.0.0.1"}}},
		{name: "identity 0 is not given", req: engine.Request{SourceEndpoint: &inventory.Endpoint{Identity: 0, Tags: resource.Tags{"a": "b"}}}},
		{name: "two forms are refused at the second", req: engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "w", Address: "10.0.0.1"}},
			field: "source.address", why: "exactly one of"},
		{name: "tags and an identity are refused", req: engine.Request{DestinationEndpoint: &inventory.Endpoint{Tags: resource.Tags{"a": "b"}, Identity: 7}},
			field: "destination.identity", why: "tags and identity"},
		{name: "a bad address is named", req: engine.Request{DestinationEndpoint: &inventory.Endpoint{Address: "10.0.0.300"}},
			field: "destination.address", why: "not an IP address"},
		{name: "a zone is refused", req: engine.Request{SourceEndpoint: &inventory.Endpoint{Address: "fe80::1%eth0"}},
			field: "source.address", why: "zone"},
		{name: "a bad workload name is named", req: engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "a/b"}},
			field: "source.workload", why: "names use only"},
		{name: "a principal over the limit is named", req: engine.Request{SourceEndpoint: &inventory.Endpoint{Principal: strings.Repeat("p", 1025)}},
			field: "source.principal", why: "limit"},
		{name: "tags beside an endpoint are refused", req: engine.Request{Source: resource.Tags{"a": "b"},
			SourceEndpoint: &inventory.Endpoint{Workload: "w"}}, field: "source.tags", why: "in the endpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := c.req.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ve *resource.ValidationError
			if !errors.As(err, &ve) || len(ve.Errors) != 1 || ve.Errors[0].Field != c.field || !strings.Contains(ve.Errors[0].Reason, c.why) {
				t.Fatalf("want %s: ...%s..., got %v", c.field, c.why, err)
			}
		})
	}
}

// Decide resolves both ends, reports how, and decides on the resolved tags:
// an external address falls to CIDR selectors, an empty selector matches
// unknown endpoints too, and errors keep their order (mesh, then endpoint).
func TestDecideByReference(t *testing.T) {
	t.Parallel()
	s := endpointSnapshot(t, `
---
kind: Policy
type: TrafficPermission
name: deny-outside
sources: [{}]
destinations: [{expressions: [{key: ip, operator: CIDR, values: [10.9.0.0/16]}]}]
action: DENY
---
kind: Policy
type: TrafficPermission
name: web-to-db
sources: [{match: {kuma.io/service: web}}]
destinations: [{match: {kuma.io/service: db}}]
action: ALLOW
`)
	decide := func(req engine.Request) (engine.Decision, error) {
		t.Helper()
		if err := req.Validate(); err != nil {
			t.Fatal(err)
		}
		return s.Decide(&req)
	}
	d, err := decide(engine.Request{SourceEndpoint: &inventory.Endpoint{Principal: "spiffe://default/web"},
		DestinationEndpoint: &inventory.Endpoint{Address: "10.0.0.3"}})
	if err != nil || d.Action != resource.Allow || d.Policy != "web-to-db" {
		t.Fatalf("principal to address: %+v, %v", d, err)
	}
	if d.SourceResolution.ResolvedAs != inventory.AsPrincipalHolders || d.DestinationResolution.Workload != "db-1" {
		t.Fatalf("resolution %+v / %+v", d.SourceResolution, d.DestinationResolution)
	}
	d, err = decide(engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "web-1"},
		DestinationEndpoint: &inventory.Endpoint{Address: "10.9.1.1"}})
	if err != nil || d.Action != resource.Deny || d.Policy != "deny-outside" || d.DestinationResolution.ResolvedAs != inventory.AsExternal {
		t.Fatalf("to an external address: %+v, %v", d, err)
	}
	// The tag form is reported as such; its identity is left to the caller.
	d, err = decide(engine.Request{Source: resource.Tags{"kuma.io/service": "web"}, Destination: resource.Tags{"kuma.io/service": "db"}})
	if err != nil || d.Action != resource.Allow || d.SourceResolution.Form != inventory.FormTags || d.SourceResolution.ResolvedAs != inventory.AsTags ||
		d.SourceResolution.Tags["kuma.io/service"] != "web" {
		t.Fatalf("tags: %+v, %v", d, err)
	}
	if _, err := decide(engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "bad-1"}}); !errors.Is(err, inventory.ErrEndpointNotFound) {
		t.Fatalf("invalid workload: %v", err)
	}
	if _, err := decide(engine.Request{Mesh: "nope", SourceEndpoint: &inventory.Endpoint{Workload: "web-1"}}); !errors.Is(err, engine.ErrMeshNotFound) {
		t.Fatalf("unknown mesh: %v", err)
	}
	// Explain traces the resolved tags.
	d, err = decide(engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "web-1"},
		DestinationEndpoint: &inventory.Endpoint{Address: "10.9.1.1"}, Explain: true})
	if err != nil || d.Explain == nil || d.Action != resource.Deny {
		t.Fatalf("explain: %+v, %v", d, err)
	}
}

// Decisions are cached by resolved tags: a workload put that changes what an
// address resolves to changes the answer at once, and the resolution reported
// is the request's, never a cached one.
func TestWorkloadPutsNeverPoisonTheCache(t *testing.T) {
	t.Parallel()
	rs, err := resource.DecodeYAML([]byte(`
kind: Mesh
name: default
---
kind: Policy
type: TrafficPermission
name: deny-db
sources: [{}]
destinations: [{match: {kuma.io/service: db}}]
action: DENY
---
kind: Policy
type: TrafficPermission
name: allow-all
sources: [{}]
destinations: [{}]
action: ALLOW
`))
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Build(1, rs)
	req := engine.Request{Source: resource.Tags{"app": "x"}, DestinationEndpoint: &inventory.Endpoint{Address: "10.0.0.5"}}
	for i := 0; i < 3; i++ { // the later answers come from the cache
		if d, err := s.Decide(&req); err != nil || d.Action != resource.Allow || d.DestinationResolution.ResolvedAs != inventory.AsExternal {
			t.Fatalf("before: %+v, %v", d, err)
		}
	}
	db := &resource.Workload{Mesh: "default", Name: "db-1", Tags: resource.Tags{"kuma.io/service": "db"}, Addresses: []string{"10.0.0.5"}}
	s2 := s.Apply(2, []engine.Change{engine.Put(db)})
	for i := 0; i < 3; i++ {
		if d, err := s2.Decide(&req); err != nil || d.Action != resource.Deny || d.DestinationResolution.Workload != "db-1" {
			t.Fatalf("after the put: %+v, %v", d, err)
		}
	}
	// Same resolved tags by another form: the cached answer, with this
	// request's resolution.
	byName := engine.Request{Source: resource.Tags{"app": "x"}, DestinationEndpoint: &inventory.Endpoint{Workload: "db-1"}}
	if d, err := s2.Decide(&byName); err != nil || d.Action != resource.Deny || d.DestinationResolution.Form != inventory.FormWorkload ||
		d.DestinationResolution.Tags["ip"] != "" {
		t.Fatalf("by name: %+v, %v", d, err)
	}
	s3 := s2.Apply(3, []engine.Change{engine.Delete(db.Key())})
	if d, err := s3.Decide(&req); err != nil || d.Action != resource.Allow {
		t.Fatalf("after the delete: %+v, %v", d, err)
	}
	if _, err := s3.Decide(&byName); !errors.Is(err, inventory.ErrEndpointNotFound) {
		t.Fatalf("deleted workload: %v", err)
	}
}

// Resolve takes every endpoint form too; a destination given by reference is
// a destination given.
func TestResolveByReference(t *testing.T) {
	t.Parallel()
	s := endpointSnapshot(t, "")
	if _, err := s.Resolve(&engine.ResolveRequest{SourceEndpoint: &inventory.Endpoint{Workload: "web-1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(&engine.ResolveRequest{SourceEndpoint: &inventory.Endpoint{Workload: "nope"}}); !errors.Is(err, inventory.ErrEndpointNotFound) {
		t.Fatalf("unknown workload: %v", err)
	}
	res, err := s.Resolve(&engine.ResolveRequest{Source: resource.Tags{"a": "b"}, DestinationEndpoint: &inventory.Endpoint{Address: "10.0.0.1"}})
	if err != nil || res.Main.Side != "inbound" {
		t.Fatalf("with a destination: %+v, %v", res, err)
	}
}

// The differential test: for random inventories and policy sets, a flow whose
// ends are given by workload name, address, principal or identity is decided
// exactly as the same flow given by the tag sets a plain model of
// docs/workloads.md ("Endpoints by reference") computes — and as the reference decides those tags.
func TestEndpointFormsDecideAsTheirTags(t *testing.T) {
	t.Parallel()
	n := 400
	if testing.Short() {
		n = 60
	}
	for i := 0; i < n; i++ {
		checkEndpointForms(t, seedBytes(1_000_000+i))
	}
}

func FuzzEndpointFormsDecideAsTheirTags(f *testing.F) {
	for i := 0; i < 10; i++ {
		f.Add(seedBytes(2_000_000 + i))
	}
	f.Fuzz(checkEndpointForms)
}

// modelResolve is docs/workloads.md's resolution, written out plainly; ok false
// for NOT_FOUND.
func modelResolve(inv []modelWorkload, ep inventory.Endpoint, dst bool, port uint32) (resource.Tags, bool) {
	own := func(m modelWorkload) resource.Tags {
		out := maps.Clone(m.w.Tags)
		if out == nil {
			out = resource.Tags{}
		}
		if dst {
			for _, p := range m.w.Ports {
				if p.Port == port {
					maps.Copy(out, p.Tags)
					break
				}
			}
		}
		return out
	}
	switch {
	case ep.Workload != "":
		for _, m := range inv {
			if m.w.Name == ep.Workload && m.valid {
				return own(m), true
			}
		}
		return nil, false
	case ep.Address != "":
		addr, _ := resource.CanonicalAddress(ep.Address)
		for _, m := range inv {
			for _, a := range m.w.Addresses {
				if a == addr {
					if !m.valid {
						return resource.Tags{"ip": addr}, true
					}
					t := own(m)
					t["ip"] = addr
					return t, true // the first claimant decides
				}
			}
		}
		return resource.Tags{"ip": addr}, true
	case ep.Principal != "":
		var shared resource.Tags
		for _, m := range inv {
			if !m.valid || m.w.Principal != ep.Principal {
				continue
			}
			if shared == nil {
				shared = maps.Clone(m.w.Tags)
				if shared == nil {
					shared = resource.Tags{}
				}
				continue
			}
			for k, v := range shared {
				if m.w.Tags[k] != v {
					delete(shared, k)
				}
			}
		}
		if shared != nil {
			shared["principal"] = ep.Principal
			return shared, true
		}
		if svc, ok := strings.CutPrefix(ep.Principal, "spiffe://m/"); ok && svc != "" && !strings.Contains(svc, "/") {
			return resource.Tags{"kuma.io/service": svc, "principal": ep.Principal}, true
		}
		return resource.Tags{"principal": ep.Principal}, true
	case ep.Identity != 0:
		for _, m := range inv {
			if m.valid && resource.Identity("m", m.w.Tags) == ep.Identity {
				return maps.Clone(m.w.Tags), true
			}
		}
		return nil, false
	}
	return ep.Tags, true
}

func checkEndpointForms(t *testing.T, data []byte) {
	c := newChoices(data)
	policies := genWorld(c)
	inv := genInventory(c)
	resources := append([]resource.Resource{}, policies...)
	for _, m := range inv {
		resources = append(resources, m.w)
	}
	snap := engine.Build(int64(len(inv)+1), resources)
	for _, m := range inv {
		if e, ok := snap.Get(m.w.Key()); !ok || (e.Err == nil) != m.valid {
			// An identity collision would also invalidate; SHA-256 gives none here.
			t.Fatalf("workload %s: the model says valid=%v, the engine %v", m.w.Name, m.valid, e.Err)
		}
	}
	for i := 0; i < 30; i++ {
		base := genRequest(c)
		src, dst := genEndpoint(c, inv), genEndpoint(c, inv)
		req := base
		req.Source, req.Destination = nil, nil
		req.SourceEndpoint, req.DestinationEndpoint = &src, &dst
		if err := req.Validate(); err != nil {
			t.Fatalf("generated request is invalid: %v", err)
		}
		srcTags, srcOK := modelResolve(inv, src, false, req.Port)
		dstTags, dstOK := modelResolve(inv, dst, true, req.Port)
		byTags := base
		byTags.Source, byTags.Destination = srcTags, dstTags
		want, wantErr := snap.Decide(&byTags)
		var got engine.Decision
		var err error
		for try := 0; try < 2 && err == nil; try++ { // the second from the cache
			got, err = snap.Decide(&req)
		}
		if !srcOK || !dstOK {
			if code, _ := engine.CodeName(err); code != "NotFound" && wantErr == nil {
				t.Fatalf("%+v / %+v: the model says NOT_FOUND, the engine answered %+v, %v", src, dst, got, err)
			}
			continue
		}
		gotCode, _ := engine.CodeName(err)
		wantCode, _ := engine.CodeName(wantErr)
		if (err == nil) != (wantErr == nil) || gotCode != wantCode {
			t.Fatalf("%+v / %+v: errors differ: by reference %v, by tags %v", src, dst, err, wantErr)
		}
		if err != nil {
			continue
		}
		if !sameDecision(got, want) {
			t.Fatalf("%+v / %+v (port %d) decided\nby reference %+v\nby tags      %+v\ntags %v / %v", src, dst, req.Port, got, want, srcTags, dstTags)
		}
		if !equalTags(got.SourceResolution.Tags, srcTags) || !equalTags(got.DestinationResolution.Tags, dstTags) {
			t.Fatalf("%+v / %+v: resolved to %v / %v, the model says %v / %v", src, dst,
				got.SourceResolution.Tags, got.DestinationResolution.Tags, srcTags, dstTags)
		}
		if ref, found := refDecide(policies, byTags); found && !sameDecision(got, ref) {
			t.Fatalf("%+v / %+v: by reference %+v, the reference %+v", src, dst, got, ref)
		}
	}
}

func equalTags(a, b resource.Tags) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}

// Every side's identity is that of its resolved tags, whether the memo
// answered (its entry keeps them) or not (first sight, NoCache, Explain): a
// side given by an endpoint always gets it, a side given as tags only with
// TagIdentities (else 0: Decide hashes no tags).
func TestDecideReportsIdentities(t *testing.T) {
	t.Parallel()
	s := endpointSnapshot(t, `
---
kind: Policy
type: TrafficPermission
name: web-to-db
sources: [{match: {kuma.io/service: web}}]
destinations: [{match: {kuma.io/service: db}}]
action: ALLOW
`)
	web, db := resource.Tags{"kuma.io/service": "web", "env": "prod"}, resource.Tags{"kuma.io/service": "db"}
	flows := []struct {
		name string
		req  engine.Request
	}{
		{"tags", engine.Request{Source: web, Destination: db}},
		{"tags with reserved keys", engine.Request{Source: resource.Tags{"kuma.io/service": "web", "ip": "10.1.1.1"},
			Destination: resource.Tags{"kuma.io/service": "db", "principal": "spiffe://default/db"}}},
		{"a workload to a known address", engine.Request{SourceEndpoint: &inventory.Endpoint{Workload: "web-1"},
			DestinationEndpoint: &inventory.Endpoint{Address: "10.0.0.3"}, Port: 8080}},
		{"a principal to an external address", engine.Request{SourceEndpoint: &inventory.Endpoint{Principal: "spiffe://default/web"},
			DestinationEndpoint: &inventory.Endpoint{Address: "10.9.9.9"}}},
		{"an endpoint given as tags to a destination port's tags", engine.Request{SourceEndpoint: &inventory.Endpoint{Tags: web},
			DestinationEndpoint: &inventory.Endpoint{Workload: "web-1"}, Port: 9090}},
	}
	for _, f := range flows {
		for _, tagIDs := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/TagIdentities=%v", f.name, tagIDs), func(t *testing.T) {
				t.Parallel()
				check := func(how string, req engine.Request) {
					t.Helper()
					req.TagIdentities = tagIDs
					d, err := s.Decide(&req)
					if err != nil {
						t.Fatalf("%s: %v", how, err)
					}
					for _, side := range []struct {
						res   inventory.EndpointResolution
						given bool // by an endpoint
					}{{d.SourceResolution, req.SourceEndpoint != nil}, {d.DestinationResolution, req.DestinationEndpoint != nil}} {
						want := resource.Identity("default", side.res.Tags)
						if !side.given && !tagIDs {
							want = 0
						}
						if side.res.Identity != want {
							t.Fatalf("%s: %s side identity %d, want %d (%+v)", how, side.res.Form, side.res.Identity, want, side.res)
						}
					}
				}
				for i := range 3 { // seen once, stored, answered by the memo
					check(fmt.Sprintf("memo, decision %d", i), f.req)
				}
				nc := f.req
				nc.NoCache = true
				check("NoCache", nc)
				ex := f.req
				ex.Explain = true
				check("Explain", ex)
			})
		}
	}
}
