package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/internal/firewall"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

const (
	allow = verdictv1.Action_ACTION_ALLOW
	deny  = verdictv1.Action_ACTION_DENY
)

func rule(name string, act verdictv1.Action, sets []string, cidrs []string, ports ...*verdictv1.PortEntry) *verdictv1.Rule {
	return &verdictv1.Rule{Policy: name, Rule: "from[0]", Action: act, PeerSets: sets, PeerCidrs: cidrs, Ports: ports}
}

// render shows a side as "action peer ports" lines, in the kernel's order.
func render(s firewall.Side) string {
	var out []string
	for _, r := range s.Rules {
		act := "allow"
		if r.Action == firewall.Deny {
			act = "deny"
		}
		out = append(out, fmt.Sprintf("%s %s %v", act, r.Peer, r.Ports))
	}
	fb := "allow"
	if s.Fallback == firewall.Deny {
		fb = "deny"
	}
	return strings.Join(append(out, "fallback "+fb), "; ")
}

func TestTranslate(t *testing.T) {
	sets := []*verdictv1.AddressSet{{Name: "aweb", Addresses: []string{"10.0.0.1", "10.0.0.2"}},
		{Name: "adb", Addresses: []string{"10.0.1.0/24", "fd00::1"}}}
	tcp := &verdictv1.PortEntry{Protocol: "TCP", Ports: "80, 8000-8100"}
	tests := []struct {
		name string
		side *verdictv1.SideRules
		want string
		err  string
	}{
		{"first match keeps the order",
			&verdictv1.SideRules{Combine: "FirstMatch", Fallback: deny, Rules: []*verdictv1.Rule{
				rule("p1", allow, []string{"aweb"}, nil, tcp), rule("p2", deny, []string{"adb"}, nil)}},
			"allow w1_aweb [{tcp [[80 80] [8000 8100]]}]; deny w1_adb []; fallback deny", ""},
		{"deny overrides: every DENY first, in order",
			&verdictv1.SideRules{Combine: "DenyOverrides", Fallback: allow, Rules: []*verdictv1.Rule{
				rule("a1", allow, []string{"aweb"}, nil), rule("d1", deny, []string{"adb"}, nil),
				rule("a2", allow, nil, nil), rule("d2", deny, nil, nil)}},
			"deny w1_adb []; deny  []; allow w1_aweb []; allow  []; fallback allow", ""},
		{"sets and CIDRs of one rule: consecutive rules, same action",
			&verdictv1.SideRules{Fallback: deny, Rules: []*verdictv1.Rule{
				rule("p", allow, []string{"aweb", "adb"}, []string{"192.168.0.0/16"})}},
			"allow w1_aweb []; allow w1_adb []; allow w1_c" + hashName([]string{"192.168.0.0/16"}) + " []; fallback deny", ""},
		{"an audit rule is never enforced",
			&verdictv1.SideRules{Fallback: allow, Rules: []*verdictv1.Rule{
				{Policy: "trial", Rule: "from[0]", Action: deny, PeerSets: []string{"aweb"}, Audit: true}, rule("p", allow, []string{"adb"}, nil)}},
			"allow w1_adb []; fallback allow", ""},
		{"an unspecified action is DENY",
			&verdictv1.SideRules{Rules: []*verdictv1.Rule{rule("p", verdictv1.Action_ACTION_UNSPECIFIED, nil, nil)}},
			"deny  []; fallback deny", ""},
		{"ANY and ICMP",
			&verdictv1.SideRules{Fallback: allow, Rules: []*verdictv1.Rule{
				rule("p", deny, nil, nil, &verdictv1.PortEntry{Protocol: "ANY", Ports: "53"}, &verdictv1.PortEntry{Protocol: "icmp"})}},
			"deny  [{ [[53 53]]} {icmp []}]; fallback allow", ""},
		{"a set not sent refuses the message",
			&verdictv1.SideRules{Rules: []*verdictv1.Rule{rule("p", deny, []string{"amissing"}, nil)}}, "", `peer set "amissing" not sent`},
		{"a bad port refuses the message",
			&verdictv1.SideRules{Rules: []*verdictv1.Rule{rule("p", deny, nil, nil, &verdictv1.PortEntry{Protocol: "TCP", Ports: "0-80"})}}, "", `"0-80"`},
		{"a bad protocol refuses the message",
			&verdictv1.SideRules{Rules: []*verdictv1.Rule{rule("p", deny, nil, nil, &verdictv1.PortEntry{Protocol: "SCTP"})}}, "", `protocol "SCTP"`},
		{"a bad CIDR refuses the message",
			&verdictv1.SideRules{Rules: []*verdictv1.Rule{rule("p", deny, nil, []string{"10.0.0.0/33"})}}, "", "10.0.0.0/33"},
		{"an unknown combine refuses the message",
			&verdictv1.SideRules{Combine: "PermitOverrides"}, "", `combine "PermitOverrides"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &verdictv1.WatchRulesResponse{Revision: 7, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES,
				Inbound: tc.side, Outbound: &verdictv1.SideRules{Fallback: allow}, Sets: sets, WorkloadAddresses: []string{"10.9.9.9"}}
			g, err := translate("w1", "web", netip.Addr{}, m)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := render(g.in); got != tc.want {
				t.Errorf("inbound\n got %s\nwant %s", got, tc.want)
			}
			if !g.ready || g.revision != 7 || !slices.Equal(g.addrs, []netip.Addr{netip.MustParseAddr("10.9.9.9")}) {
				t.Errorf("state %+v", g)
			}
			rs := ruleset([]*guarded{g}, nil)
			if err := rs.Validate(); err != nil {
				t.Errorf("the ruleset does not validate: %v", err)
			}
			if got := len(rs.Sets["w1_adb"]); got != 2 {
				t.Errorf("set adb has %d members, want 2", got)
			}
		})
	}
}

func TestTranslateAddressForm(t *testing.T) {
	self := netip.MustParseAddr("10.1.1.1")
	g, err := translate("w2", "x", self, &verdictv1.WatchRulesResponse{WorkloadAddresses: []string{"10.1.1.1", "10.1.1.2"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g.addrs, []netip.Addr{self}) {
		t.Errorf("address form guards the watched address only: %v", g.addrs)
	}
	if _, err := translate("w2", "x", netip.Addr{}, &verdictv1.WatchRulesResponse{WorkloadAddresses: []string{"nope"}}); err == nil {
		t.Error("an unreadable workload address is accepted")
	}
}

func TestApplyDeltas(t *testing.T) {
	m := &verdictv1.WatchRulesResponse{Revision: 3, Sets: []*verdictv1.AddressSet{{Name: "aweb", Addresses: []string{"10.0.0.1"}}},
		Inbound: &verdictv1.SideRules{Rules: []*verdictv1.Rule{rule("p", allow, []string{"aweb"}, nil)}}}
	g, err := translate("w1", "web", netip.Addr{}, m)
	if err != nil {
		t.Fatal(err)
	}
	next := g.clone()
	err = next.applyDeltas(&verdictv1.WatchRulesResponse{Revision: 4, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS,
		SetDeltas: []*verdictv1.AddressSetDelta{{Name: "aweb", Added: []string{"10.0.0.2"}, Removed: []string{"10.0.0.1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ruleset([]*guarded{next}, nil).Sets["w1_aweb"]; !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32")}) || next.revision != 4 {
		t.Errorf("after the delta: %v at %d", got, next.revision)
	}
	if got := ruleset([]*guarded{g}, nil).Sets["w1_aweb"]; !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}) {
		t.Errorf("the held state changed under the delta: %v", got)
	}
	for _, bad := range []*verdictv1.AddressSetDelta{{Name: "aother", Added: []string{"10.0.0.3"}}, {Name: "aweb", Added: []string{"x"}}} {
		c := next.clone()
		if err := c.applyDeltas(&verdictv1.WatchRulesResponse{SetDeltas: []*verdictv1.AddressSetDelta{
			{Name: "aweb", Added: []string{"10.0.0.9"}}, bad}}); err == nil {
			t.Errorf("delta %v accepted", bad)
		} else if len(c.sets["w1_aweb"]) != 1 {
			t.Errorf("a refused delta changed the set: %v", c.sets["w1_aweb"])
		}
	}
}

func TestRulesetStance(t *testing.T) {
	st := &stance{in: firewall.Side{Fallback: firewall.Deny}, out: firewall.Side{Fallback: firewall.Deny,
		Rules: []firewall.Rule{{Peer: "verdictd", Action: firewall.Allow}}},
		sets: map[string][]netip.Prefix{"verdictd": {netip.MustParsePrefix("10.0.0.100/32")}}}
	waiting := &guarded{id: "w1", chain: "a", addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	unknown := &guarded{id: "w2", chain: "b"}
	rs := ruleset([]*guarded{waiting, unknown}, st)
	if len(rs.Workloads) != 1 || rs.Workloads[0].Name != "a" || rs.Workloads[0].Inbound.Fallback != firewall.Deny || rs.Sets["verdictd"] == nil {
		t.Errorf("drop stance: %+v", rs)
	}
	if err := rs.Validate(); err != nil {
		t.Error(err)
	}
	if rs := ruleset([]*guarded{waiting, unknown}, nil); len(rs.Workloads) != 0 {
		t.Errorf("accept stance programs %+v", rs.Workloads)
	}
}

func TestChainName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"web", "web"}, {"db-1_x", "db-1_x"}} {
		if got := chainName(tc.in); got != tc.want {
			t.Errorf("chainName(%q) = %q", tc.in, got)
		}
	}
	a, b := chainName("web.prod.svc.cluster.local"), chainName("web.prod.svc.cluster.locaL")
	if a == b || !nameOK("in_"+a) || len(a) > 30 {
		t.Errorf("chain names %q %q: distinct and valid", a, b)
	}
}
