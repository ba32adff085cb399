// Package firewall programs a kernel firewall (nftables, over netlink) from
// verdict's ordered rules: per guarded workload an inbound and an outbound
// chain holding the rules in verdict's order (first match), peers as named
// interval sets of addresses shared by every rule that names them, the
// side's fallback as the chain's last verdict. Every change is one atomic
// netlink batch; a change of set membership alone updates only the set
// elements. It touches only the table it owns (docs/agent.md).
//
// Established traffic is re-checked: the base chains accept only reply-direction
// packets of a tracked connection without looking at the rules; every
// packet in the original direction goes through them. A rule removed or
// turned to DENY therefore stops new and established connections at once
// (the connection's initiator can send nothing more), with no conntrack
// entry to chase.
package firewall

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Action is a rule's or a fallback's verdict.
type Action uint8

// Actions.
const (
	Allow Action = iota
	Deny
)

// Ruleset is what the firewall enforces.
type Ruleset struct {
	// Sets of peer addresses by name ([A-Za-z0-9_-], at most 40 characters):
	// addresses and CIDRs, IPv4 and IPv6 alike.
	Sets      map[string][]netip.Prefix
	Workloads []Workload
}

// Workload is one guarded workload: its own addresses (traffic to them goes
// through Inbound, traffic from them through Outbound) and its two sides.
type Workload struct {
	Name              string // for the chain names: [A-Za-z0-9_-], at most 40 characters
	Addresses         []netip.Addr
	Inbound, Outbound Side
}

// Side is one side's ordered rules and its fallback.
type Side struct {
	Rules    []Rule
	Fallback Action
}

// Rule matches a peer (the source of inbound traffic, the destination of
// outbound traffic) and ports, first match.
type Rule struct {
	// Peer names a set of Ruleset.Sets; "" matches every peer.
	Peer string
	// Ports: empty matches all traffic; otherwise any entry.
	Ports  []Ports
	Action Action
	// Comment is shown in `nft list ruleset` (the verdict policy and rule).
	Comment string
}

// Ports is one port entry: a protocol ("tcp", "udp", "icmp", or "" for all)
// and port ranges (none: every port; ignored for icmp).
type Ports struct {
	Protocol string
	Ranges   [][2]uint16
}

var nameOK = func(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Validate checks names, references and protocols.
func (rs *Ruleset) Validate() error {
	var errs []error
	for name := range rs.Sets {
		if !nameOK(name) {
			errs = append(errs, fmt.Errorf("set %q: a name of 1-40 characters [A-Za-z0-9_-]", name))
		}
	}
	seen := map[string]bool{}
	for i, w := range rs.Workloads {
		if !nameOK(w.Name) {
			errs = append(errs, fmt.Errorf("workloads[%d]: name %q: 1-40 characters [A-Za-z0-9_-]", i, w.Name))
		}
		if seen[w.Name] {
			errs = append(errs, fmt.Errorf("workloads[%d]: name %q twice", i, w.Name))
		}
		seen[w.Name] = true
		for _, side := range []struct {
			name string
			s    Side
		}{{"inbound", w.Inbound}, {"outbound", w.Outbound}} {
			for j, r := range side.s.Rules {
				if _, ok := rs.Sets[r.Peer]; r.Peer != "" && !ok {
					errs = append(errs, fmt.Errorf("workloads[%d].%s[%d]: no set %q", i, side.name, j, r.Peer))
				}
				for _, p := range r.Ports {
					if _, ok := protoNumber(p.Protocol); !ok {
						errs = append(errs, fmt.Errorf("workloads[%d].%s[%d]: protocol %q: tcp, udp, icmp or empty", i, side.name, j, p.Protocol))
					}
					for _, rg := range p.Ranges {
						if rg[0] > rg[1] {
							errs = append(errs, fmt.Errorf("workloads[%d].%s[%d]: port range %d-%d", i, side.name, j, rg[0], rg[1]))
						}
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// protoNumber is the IP protocol number of a name (0 for "": any).
func protoNumber(p string) (byte, bool) {
	switch strings.ToLower(p) {
	case "":
		return 0, true
	case "tcp":
		return 6, true
	case "udp":
		return 17, true
	case "icmp":
		return 1, true
	}
	return 0, false
}

// interval is [from, to] of one family, inclusive.
type interval struct{ from, to netip.Addr }

// intervals merges a set's prefixes into sorted, disjoint, non-adjacent
// ranges per family. The last address of a family's space is left out of a
// range that reaches it (an nftables interval ends at the address after it);
// a /0 is "every address" for rendering (see Programmer).
func intervals(ps []netip.Prefix, v6 bool) []interval {
	var out []interval
	for _, p := range ps {
		p = p.Masked()
		if p.Addr().Is4() == v6 || !p.IsValid() {
			continue
		}
		out = append(out, interval{p.Addr(), lastAddr(p)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].from.Less(out[j].from) })
	merged := out[:0]
	for _, iv := range out {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if next := last.to.Next(); !next.IsValid() || !next.Less(iv.from) { // overlapping or adjacent
				if last.to.Less(iv.to) {
					last.to = iv.to
				}
				continue
			}
		}
		merged = append(merged, iv)
	}
	return merged
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for bit := 0; bit < 8; bit++ {
			if i*8+bit >= bits {
				b[i] |= 0x80 >> bit
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// elements are the nftables interval elements of the ranges: a start and an
// interval end (the address after the range) each.
func elements(ivs []interval) [][2][]byte {
	out := make([][2][]byte, 0, len(ivs))
	for _, iv := range ivs {
		end := iv.to.Next()
		if !end.IsValid() { // the family's last address: leave it out
			if iv.from == iv.to {
				continue
			}
			end = iv.to
		}
		out = append(out, [2][]byte{iv.from.AsSlice(), end.AsSlice()})
	}
	return out
}

func be16(v uint16) []byte {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, v)
	return b
}

func sameElements(a, b [][2][]byte) bool {
	return slices.EqualFunc(a, b, func(x, y [2][]byte) bool { return bytes.Equal(x[0], y[0]) && bytes.Equal(x[1], y[1]) })
}
