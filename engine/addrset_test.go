package engine_test

import (
	"errors"
	"reflect"
	"sort"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// setOf is what a kernel would hold for a selector at s: its CIDRs, or the
// set's addresses and identities.
func setOf(t *testing.T, s *engine.Snapshot, sel resource.Selector) (kind inventory.PeerKind, addrs []string, ids []uint64) {
	t.Helper()
	p, err := inventory.PlanPeer(sel)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind == inventory.PeerCIDRs {
		return p.Kind, p.CIDRs, nil
	}
	var out []string
	idset := map[uint64]bool{}
	for _, m := range s.PeerMembers(p, "default") {
		if len(m.In) > 0 {
			idset[m.Identity] = true
		}
		if p.Static() {
			addrs = append(addrs, m.In...)
		} else {
			out = append(out, m.Out...)
		}
	}
	if !p.Static() {
		addrs = p.Addresses(out)
	}
	sort.Strings(addrs)
	for id := range idset {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return p.Kind, addrs, ids
}

func TestPeerAddressSets(t *testing.T) {
	t.Parallel()
	web := map[string]string{"app": "web"}
	db := map[string]string{"app": "db", "env": "prod"}
	s := engine.Build(3, []resource.Resource{
		workload("web-1", 1, web, "10.0.0.1", "2001:db8::1"),
		workload("web-2", 2, web, "10.1.0.2"),
		workload("db-1", 3, db, "10.0.0.3"),
	})
	idWeb, idDB := resource.Identity("default", web), resource.Identity("default", db)
	webIDs := []uint64{idWeb}
	dbIDs := []uint64{idDB}
	tests := []struct {
		name  string
		sel   resource.Selector
		kind  inventory.PeerKind
		addrs []string
		ids   []uint64
	}{
		{"tags: the matching workloads' addresses", resource.Selector{Match: web}, inventory.PeerSet,
			[]string{"10.0.0.1", "10.1.0.2", "2001:db8::1"}, webIDs},
		{"no workload matches: an empty set", resource.Selector{Match: map[string]string{"app": "none"}}, inventory.PeerSet, nil, nil},
		{"only an ip CIDR: passed through", resource.Selector{Expressions: []resource.Expression{
			{Key: "ip", Operator: resource.OpCIDR, Values: []string{"192.168.0.0/16", "10.0.0.0/8"}}}}, inventory.PeerCIDRs,
			[]string{"10.0.0.0/8", "192.168.0.0/16"}, nil},
		{"an exact ip: passed through", resource.Selector{Match: map[string]string{"ip": "10.9.9.9"}}, inventory.PeerCIDRs,
			[]string{"10.9.9.9"}, nil},
		{"tags and an ip CIDR: the matching workloads' addresses within it", resource.Selector{Match: web,
			Expressions: []resource.Expression{{Key: "ip", Operator: resource.OpCIDR, Values: []string{"10.0.0.0/16"}}}},
			inventory.PeerSet, []string{"10.0.0.1"}, webIDs},
		{"NotIn on a tag, within a CIDR: the CIDR less the workloads that fail it", resource.Selector{Expressions: []resource.Expression{
			{Key: "env", Operator: resource.OpNotIn, Values: []string{"prod"}},
			{Key: "ip", Operator: resource.OpCIDR, Values: []string{"10.0.0.0/30"}}}},
			inventory.PeerSet, []string{"10.0.0.0/31", "10.0.0.2"}, webIDs},
		{"ip DoesNotExist: nothing a kernel sees", resource.Selector{Match: web, Expressions: []resource.Expression{
			{Key: "ip", Operator: resource.OpDoesNotExist}}}, inventory.PeerSet, nil, nil},
		{"a principal: no address carries one", resource.Selector{Match: map[string]string{"principal": "spiffe://x"}},
			inventory.PeerSet, nil, nil},
		{"In on a tag", resource.Selector{Expressions: []resource.Expression{{Key: "app", Operator: resource.OpIn, Values: []string{"db", "x"}}}},
			inventory.PeerSet, []string{"10.0.0.3"}, dbIDs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kind, addrs, ids := setOf(t, s, tc.sel)
			if kind != tc.kind || !reflect.DeepEqual(addrs, tc.addrs) || !reflect.DeepEqual(ids, tc.ids) {
				t.Fatalf("got %v %v %v, want %v %v %v", kind, addrs, ids, tc.kind, tc.addrs, tc.ids)
			}
		})
	}
}

func TestPeerPrefixOnIPRefused(t *testing.T) {
	t.Parallel()
	_, err := inventory.PlanPeer(resource.Selector{Expressions: []resource.Expression{{Key: "ip", Operator: resource.OpPrefix, Values: []string{"10."}}}})
	if !errors.Is(err, inventory.ErrPeerNotAddressable) {
		t.Fatalf("err %v", err)
	}
}

// A change touches the changed workload and those claiming its addresses: a
// put that takes an address from a later claimant makes it valid or invalid.
func TestTouchedWorkloads(t *testing.T) {
	t.Parallel()
	a := workload("a", 1, map[string]string{"app": "a"}, "10.0.0.1")
	b := workload("b", 2, map[string]string{"app": "b"}, "10.0.0.1", "10.0.0.2")
	c := workload("c", 2, map[string]string{"app": "c"}, "10.0.0.3")
	s1 := engine.Build(2, []resource.Resource{a, b, c})
	s2 := s1.Apply(3, []engine.Change{engine.Delete(a.Key())})
	if got := s2.TouchedWorkloads(s1, "default", []string{"a"}); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("touched %v", got)
	}
	p, _ := inventory.PlanPeer(resource.Selector{Match: map[string]string{"app": "b"}})
	if _, ok := s1.PeerMember(p, "default", "b"); ok {
		t.Fatal("b is invalid at s1, yet a member")
	}
	if m, ok := s2.PeerMember(p, "default", "b"); !ok || !reflect.DeepEqual(m.In, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Fatalf("b at s2: %v %+v", ok, m)
	}
}
