package firewall

import (
	"net/netip"
	"strings"
	"testing"
)

func TestIntervals(t *testing.T) {
	p := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	tests := []struct {
		name string
		in   []netip.Prefix
		v6   bool
		want string
	}{
		{"one address", p("10.0.0.1/32"), false, "10.0.0.1-10.0.0.1"},
		{"adjacent merge", p("10.0.0.0/25", "10.0.0.128/25"), false, "10.0.0.0-10.0.0.255"},
		{"overlap merge", p("10.0.0.0/16", "10.0.3.0/24", "10.2.0.0/16"), false, "10.0.0.0-10.0.255.255 10.2.0.0-10.2.255.255"},
		{"unmasked prefix", p("10.0.0.7/24"), false, "10.0.0.0-10.0.0.255"},
		{"families apart", p("10.0.0.1/32", "fd00::/64"), true, "fd00::-fd00::ffff:ffff:ffff:ffff"},
		{"sorted", p("10.9.0.0/16", "10.1.0.0/16"), false, "10.1.0.0-10.1.255.255 10.9.0.0-10.9.255.255"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, iv := range intervals(tc.in, tc.v6) {
				got = append(got, iv.from.String()+"-"+iv.to.String())
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("got %q, want %q", g, tc.want)
			}
		})
	}
	// The family's last address cannot end an nftables interval: a range
	// reaching it stops one short, and the lone last address is left out.
	if e := elements(intervals(p("255.255.255.255/32"), false)); len(e) != 0 {
		t.Errorf("elements of the last address: %v", e)
	}
	if e := elements(intervals(p("255.255.255.0/24"), false)); len(e) != 1 {
		t.Errorf("elements of the last /24: %v", e)
	}
}

func TestValidate(t *testing.T) {
	rs := &Ruleset{Sets: map[string][]netip.Prefix{"bad name": nil}, Workloads: []Workload{
		{Name: "w", Inbound: Side{Rules: []Rule{{Peer: "missing"}, {Ports: []Ports{{Protocol: "sctp"}}},
			{Ports: []Ports{{Protocol: "tcp", Ranges: [][2]uint16{{9, 8}}}}}}}},
		{Name: "w"},
	}}
	err := rs.Validate()
	for _, want := range []string{`set "bad name"`, `no set "missing"`, `protocol "sctp"`, "port range 9-8", `name "w" twice`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
}
