package fanout

import (
	"slices"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func app(a string) map[string]string { return map[string]string{"app": a} }

func TestSetNamesAreStable(t *testing.T) {
	t.Parallel()
	a := resource.Selector{Match: app("web"), Expressions: []resource.Expression{
		{Key: "env", Operator: resource.OpIn, Values: []string{"b", "a"}}, {Key: "zone", Operator: resource.OpExists}}}
	b := resource.Selector{Match: app("web"), Expressions: []resource.Expression{
		{Key: "zone", Operator: resource.OpExists}, {Key: "env", Operator: resource.OpIn, Values: []string{"a", "b"}}}}
	tests := []struct {
		name string
		x, y string
		same bool
	}{
		{"expression and value order do not matter", selectorKey("default", a), selectorKey("default", b), true},
		{"another mesh is another set", selectorKey("default", a), selectorKey("prod", a), false},
		{"another value is another set", selectorKey("default", resource.Selector{Match: app("web")}),
			selectorKey("default", resource.Selector{Match: app("web2")}), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if (setName(tc.x) == setName(tc.y)) != tc.same {
				t.Fatalf("%q %q", setName(tc.x), setName(tc.y))
			}
			if n := setName(tc.x); len("p_"+n+"_4") > 16 {
				t.Fatalf("name %q too long for the agent's suffixes", n)
			}
		})
	}
}

// resolveWatched converts the engine's forms by number: the two enums agree.
func TestEndpointEnumsAgree(t *testing.T) {
	t.Parallel()
	forms := map[inventory.EndpointForm]verdictv1.EndpointForm{inventory.FormTags: verdictv1.EndpointForm_ENDPOINT_FORM_TAGS,
		inventory.FormWorkload: verdictv1.EndpointForm_ENDPOINT_FORM_WORKLOAD, inventory.FormAddress: verdictv1.EndpointForm_ENDPOINT_FORM_ADDRESS,
		inventory.FormPrincipal: verdictv1.EndpointForm_ENDPOINT_FORM_PRINCIPAL, inventory.FormIdentity: verdictv1.EndpointForm_ENDPOINT_FORM_IDENTITY}
	for e, p := range forms {
		if verdictv1.EndpointForm(e) != p {
			t.Errorf("form %v is %v in the API, not %v", e, p, verdictv1.EndpointForm(e))
		}
	}
	as := map[inventory.ResolvedAs]verdictv1.ResolvedAs{inventory.AsTags: verdictv1.ResolvedAs_RESOLVED_AS_TAGS,
		inventory.AsWorkload: verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, inventory.AsExternal: verdictv1.ResolvedAs_RESOLVED_AS_EXTERNAL,
		inventory.AsPrincipalHolders: verdictv1.ResolvedAs_RESOLVED_AS_PRINCIPAL_HOLDERS, inventory.AsKumaSpiffe: verdictv1.ResolvedAs_RESOLVED_AS_KUMA_SPIFFE,
		inventory.AsUnknownPrincipal: verdictv1.ResolvedAs_RESOLVED_AS_UNKNOWN_PRINCIPAL, inventory.AsIdentity: verdictv1.ResolvedAs_RESOLVED_AS_IDENTITY}
	for e, p := range as {
		if verdictv1.ResolvedAs(e) != p {
			t.Errorf("resolved-as %v is %v in the API, not %v", e, p, verdictv1.ResolvedAs(e))
		}
	}
}

// A set follows the workloads a change touched, and its delta says exactly
// what entered and left it — for a set of workloads' addresses and for a set
// that is CIDRs less the workloads that fail the selector.
func TestPeerSetDeltas(t *testing.T) {
	t.Parallel()
	put := func(name string, tags map[string]string, addr string) engine.Change {
		return engine.Put(&resource.Workload{Mesh: "default", Name: name, Tags: tags, Addresses: []string{addr}})
	}
	del := func(name string) engine.Change {
		return engine.Delete(resource.Key{Kind: resource.KindWorkload, Mesh: "default", Name: name})
	}
	web, prod := app("web"), map[string]string{"app": "web", "env": "prod"}
	notProd := resource.Selector{Expressions: []resource.Expression{{Key: "env", Operator: resource.OpNotIn, Values: []string{"prod"}},
		{Key: "ip", Operator: resource.OpCIDR, Values: []string{"10.0.0.0/30"}}}}
	tests := []struct {
		name    string
		sel     resource.Selector
		start   []engine.Change
		change  []engine.Change
		added   []string
		removed []string
		idsIn   []uint64
		idsOut  []uint64
	}{
		{"a matching workload added", resource.Selector{Match: web}, []engine.Change{put("w1", web, "10.0.0.1")},
			[]engine.Change{put("w2", web, "10.0.0.2")}, []string{"10.0.0.2"}, nil, nil, nil},
		{"a workload's tags no longer match", resource.Selector{Match: web}, []engine.Change{put("w1", web, "10.0.0.1")},
			[]engine.Change{put("w1", app("db"), "10.0.0.1")}, nil, []string{"10.0.0.1"}, nil, []uint64{resource.Identity("default", web)}},
		{"a workload that does not match: no delta", resource.Selector{Match: web}, []engine.Change{put("w1", web, "10.0.0.1")},
			[]engine.Change{put("d1", app("db"), "10.0.0.9")}, nil, nil, nil, nil},
		{"a workload moves to another address", resource.Selector{Match: web}, []engine.Change{put("w1", web, "10.0.0.1")},
			[]engine.Change{put("w1", web, "10.0.0.7")}, []string{"10.0.0.7"}, []string{"10.0.0.1"}, nil, nil},
		{"CIDR less a workload that fails NotIn", notProd, nil,
			[]engine.Change{put("p1", prod, "10.0.0.3")}, []string{"10.0.0.0/31", "10.0.0.2"}, []string{"10.0.0.0/30"}, nil, nil},
		{"the failing workload goes: the CIDR whole again", notProd, []engine.Change{put("p1", prod, "10.0.0.3")},
			[]engine.Change{del("p1")}, []string{"10.0.0.0/30"}, []string{"10.0.0.0/31", "10.0.0.2"}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s1 := engine.Empty().Apply(1, tc.start)
			s2 := s1.Apply(2, tc.change)
			r := newSetRegistry()
			_, ps, err := r.peer(s1, "default", tc.sel)
			if err != nil || ps == nil {
				t.Fatalf("peer: %v %v", ps, err)
			}
			var names []string
			for _, c := range tc.change {
				names = append(names, c.Key.Name)
			}
			ps.update(s2, s2.TouchedWorkloads(s1, "default", names), false)
			d := ps.deltaAt(2)
			if d == nil {
				d = &verdictv1.AddressSetDelta{}
			}
			if !slices.Equal(d.GetAdded(), tc.added) || !slices.Equal(d.GetRemoved(), tc.removed) ||
				!slices.Equal(d.GetIdentitiesAdded(), tc.idsIn) || !slices.Equal(d.GetIdentitiesRemoved(), tc.idsOut) {
				t.Fatalf("delta %v", d)
			}
			// The set brought up to date equals the set computed afresh.
			_, fresh, _ := newSetRegistry().peer(s2, "default", tc.sel)
			if got, want := ps.message(), fresh.message(); !slices.Equal(got.GetAddresses(), want.GetAddresses()) ||
				!slices.Equal(got.GetIdentities(), want.GetIdentities()) {
				t.Fatalf("updated %v, afresh %v", got, want)
			}
		})
	}
}
