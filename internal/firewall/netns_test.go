package firewall

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/verdictpdp/verdict/internal/netnstest"
)

func ruleset(peer []netip.Prefix, action Action) *Ruleset {
	return &Ruleset{
		Sets: map[string][]netip.Prefix{"clients": peer},
		Workloads: []Workload{{
			Name:      "b",
			Addresses: []netip.Addr{netip.MustParseAddr("10.250.2.2")},
			Inbound: Side{Rules: []Rule{{Peer: "clients", Ports: []Ports{{Protocol: "tcp", Ranges: [][2]uint16{{8080, 8080}}}},
				Action: action, Comment: "web-to-b"}}, Fallback: Deny},
			Outbound: Side{Fallback: Allow},
		}},
	}
}

func TestFirewallEnforcesInANamespace(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.NewTopo(t)
	netnstest.Echo(t, tp.B, "10.250.2.2:8080")
	netnstest.Echo(t, tp.B, "10.250.2.2:9090")
	if !netnstest.Connects(t, tp.A, "10.250.2.2:8080") || !netnstest.Connects(t, tp.A, "10.250.2.2:9090") {
		t.Fatal("the topology does not route before any firewall")
	}

	hns, err := netns.GetFromName(tp.H)
	if err != nil {
		t.Fatal(err)
	}
	defer hns.Close()
	// A table the agent did not create must survive every apply.
	other, err := nftables.New(nftables.WithNetNSFd(int(hns)))
	if err != nil {
		t.Fatal(err)
	}
	other.AddTable(&nftables.Table{Name: "someone-else", Family: nftables.TableFamilyIPv4})
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}

	p, err := New("verdict-test", nftables.WithNetNSFd(int(hns)))
	if err != nil {
		t.Fatal(err)
	}
	a24 := []netip.Prefix{netip.MustParsePrefix("10.250.1.0/24")}
	st, err := p.Apply(ruleset(a24, Allow))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Full {
		t.Error("the first apply must replace the table whole")
	}
	if !netnstest.Connects(t, tp.A, "10.250.2.2:8080") {
		t.Error("allowed: a → b:8080 does not connect")
	}
	if !netnstest.Blocked(t, tp.A, "10.250.2.2:9090") {
		t.Error("denied by the fallback: a → b:9090 connects")
	}

	// An established connection is cut when its rule turns to DENY.
	c, err := netnstest.Dial(t, tp.A, "10.250.2.2:8080", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := netnstest.RoundTrip(c, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ruleset(a24, Deny)); err != nil {
		t.Fatal(err)
	}
	if err := netnstest.RoundTrip(c, 2*time.Second); err == nil {
		t.Error("an established connection still echoes after its rule turned to DENY")
	}
	if !netnstest.Blocked(t, tp.A, "10.250.2.2:8080") {
		t.Error("a new connection passes a DENY rule")
	}

	// Membership alone: only set elements change.
	if _, err := p.Apply(ruleset(a24, Allow)); err != nil {
		t.Fatal(err)
	}
	st, err = p.Apply(ruleset([]netip.Prefix{netip.MustParsePrefix("10.250.3.0/24")}, Allow))
	if err != nil {
		t.Fatal(err)
	}
	if st.Full || st.ElementsAdded == 0 || st.ElemsDel == 0 {
		t.Errorf("a membership change: %+v, want elements only", st)
	}
	if !netnstest.Blocked(t, tp.A, "10.250.2.2:8080") {
		t.Error("a is no longer in the peer set, yet connects")
	}
	st, err = p.Apply(ruleset([]netip.Prefix{netip.MustParsePrefix("10.250.3.0/24"), netip.MustParsePrefix("10.250.1.2/32")}, Allow))
	if err != nil {
		t.Fatal(err)
	}
	if st.Full || !netnstest.Connects(t, tp.A, "10.250.2.2:8080") {
		t.Errorf("a's address added to the set: %+v; it must connect", st)
	}

	// A restarted agent replaces its table whole, and enforces the same.
	p2, err := New("verdict-test", nftables.WithNetNSFd(int(hns)))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p2.Apply(ruleset(a24, Allow)); err != nil || !st.Full {
		t.Fatalf("restart: %+v, %v", st, err)
	}
	if !netnstest.Connects(t, tp.A, "10.250.2.2:8080") || !netnstest.Blocked(t, tp.A, "10.250.2.2:9090") {
		t.Error("after a restart the rules are not the same")
	}
	tables, err := other.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.Name)
	}
	if strings.Count(strings.Join(names, ","), "someone-else") != 1 || strings.Count(strings.Join(names, ","), "verdict-test") != 1 {
		t.Errorf("tables %v: the agent's own once, and someone else's untouched", names)
	}
	if err := p2.Remove(); err != nil {
		t.Fatal(err)
	}
	if !netnstest.Connects(t, tp.A, "10.250.2.2:9090") {
		t.Error("the table removed, traffic still blocked")
	}
}
