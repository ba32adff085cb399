package agent

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/internal/firewall"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// guarded is what the agent holds of one guarded workload: the last RULES
// message translated, with its sets kept current by SET_DELTAS messages.
type guarded struct {
	id       string // short and unique within the agent: prefixes the workload's set names
	chain    string // the name of its chains' suffix (in_<chain>, out_<chain>)
	ready    bool   // rules received (else: addrs only, under the initial stance)
	revision int64
	addrs    []netip.Addr
	in, out  firewall.Side                    // peers name sets of sets (local names)
	sets     map[string]map[netip.Prefix]bool // local set name → members
	remote   map[string]string                // verdict's set name → local name
}

// translate turns a RULES message into the workload's state. self is the
// watched address (address form) or invalid (name form: the workload's
// addresses come with the message). A message the agent cannot read whole is
// refused: the rules held stay (fail static), never a partial translation
// that could turn a DENY into an ALLOW.
func translate(id, chain string, self netip.Addr, m *verdictv1.WatchRulesResponse) (*guarded, error) {
	g := &guarded{id: id, chain: chain, ready: true, revision: m.GetRevision(),
		sets: map[string]map[netip.Prefix]bool{}, remote: map[string]string{}}
	var errs []error
	if self.IsValid() {
		g.addrs = []netip.Addr{self}
	} else {
		for _, s := range m.GetWorkloadAddresses() {
			a, err := netip.ParseAddr(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("workload address %q: %w", s, err))
				continue
			}
			g.addrs = append(g.addrs, a.Unmap())
		}
	}
	for _, s := range m.GetSets() {
		if _, dup := g.remote[s.GetName()]; dup {
			errs = append(errs, fmt.Errorf("set %q twice", s.GetName()))
			continue
		}
		local := id + "_" + s.GetName()
		if !nameOK(local) {
			errs = append(errs, fmt.Errorf("set name %q: not a valid nftables name", s.GetName()))
			continue
		}
		members := map[netip.Prefix]bool{}
		for _, a := range s.GetAddresses() {
			p, err := parsePeer(a)
			if err != nil {
				errs = append(errs, fmt.Errorf("set %q: %w", s.GetName(), err))
				continue
			}
			members[p] = true
		}
		g.remote[s.GetName()] = local
		g.sets[local] = members
	}
	var err error
	if g.in, err = g.side(m.GetInbound()); err != nil {
		errs = append(errs, fmt.Errorf("inbound: %w", err))
	}
	if g.out, err = g.side(m.GetOutbound()); err != nil {
		errs = append(errs, fmt.Errorf("outbound: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return g, nil
}

// side renders one side's rules in the order the kernel must try them: as
// sent under FirstMatch; under DenyOverrides every DENY rule first (in their
// order), then the ALLOW rules — first match over that order is "any
// matching DENY wins, else the first matching ALLOW". A rule whose peer is
// several sets and CIDRs becomes consecutive kernel rules with the same
// action (one per set, one for the CIDRs), which is the same first match.
func (g *guarded) side(s *verdictv1.SideRules) (firewall.Side, error) {
	out := firewall.Side{Fallback: action(s.GetFallback())}
	rules := s.GetRules()
	switch s.GetCombine() {
	case "", "FirstMatch":
	case "DenyOverrides":
		rules = slices.Clone(rules)
		slices.SortStableFunc(rules, func(a, b *verdictv1.Rule) int {
			return boolInt(action(a.GetAction()) != firewall.Deny) - boolInt(action(b.GetAction()) != firewall.Deny)
		})
	default:
		return firewall.Side{}, fmt.Errorf("combine %q: FirstMatch or DenyOverrides", s.GetCombine())
	}
	var errs []error
	for i, r := range rules {
		if r.GetAudit() {
			continue // an audit rule decides only the shadow decision: never enforced (docs/audit.md)
		}
		ports, err := ports(r.GetPorts())
		if err != nil {
			errs = append(errs, fmt.Errorf("rule %d (%s %s): %w", i, r.GetPolicy(), r.GetRule(), err))
			continue
		}
		comment := r.GetPolicy() + " " + r.GetRule()
		base := firewall.Rule{Ports: ports, Action: action(r.GetAction()), Comment: comment}
		if len(r.GetPeerSets()) == 0 && len(r.GetPeerCidrs()) == 0 {
			out.Rules = append(out.Rules, base) // any peer
			continue
		}
		for _, name := range r.GetPeerSets() {
			local, ok := g.remote[name]
			if !ok {
				errs = append(errs, fmt.Errorf("rule %d (%s %s): peer set %q not sent", i, r.GetPolicy(), r.GetRule(), name))
				continue
			}
			fr := base
			fr.Peer = local
			out.Rules = append(out.Rules, fr)
		}
		if cidrs := r.GetPeerCidrs(); len(cidrs) > 0 {
			members := map[netip.Prefix]bool{}
			for _, c := range cidrs {
				p, err := parsePeer(c)
				if err != nil {
					errs = append(errs, fmt.Errorf("rule %d (%s %s): %w", i, r.GetPolicy(), r.GetRule(), err))
					continue
				}
				members[p] = true
			}
			local := g.id + "_c" + hashName(cidrs)
			g.sets[local] = members
			fr := base
			fr.Peer = local
			out.Rules = append(out.Rules, fr)
		}
	}
	return out, errors.Join(errs...)
}

// applyDeltas updates the sets held with a SET_DELTAS message. A delta for a
// set the rules do not name, or an address that does not parse, refuses the
// message whole (the caller reconnects for the rules in full).
func (g *guarded) applyDeltas(m *verdictv1.WatchRulesResponse) error {
	type change struct {
		set  map[netip.Prefix]bool
		p    netip.Prefix
		keep bool
	}
	var changes []change
	var errs []error
	for _, d := range m.GetSetDeltas() {
		local, ok := g.remote[d.GetName()]
		if !ok {
			errs = append(errs, fmt.Errorf("delta of set %q, which no rule names", d.GetName()))
			continue
		}
		for _, list := range []struct {
			addrs []string
			keep  bool
		}{{d.GetRemoved(), false}, {d.GetAdded(), true}} {
			for _, a := range list.addrs {
				p, err := parsePeer(a)
				if err != nil {
					errs = append(errs, fmt.Errorf("delta of set %q: %w", d.GetName(), err))
					continue
				}
				changes = append(changes, change{g.sets[local], p, list.keep})
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, c := range changes {
		if c.keep {
			c.set[c.p] = true
		} else {
			delete(c.set, c.p)
		}
	}
	g.revision = m.GetRevision()
	return nil
}

// action: anything but ALLOW is DENY (fail closed).
func action(a verdictv1.Action) firewall.Action {
	if a == verdictv1.Action_ACTION_ALLOW {
		return firewall.Allow
	}
	return firewall.Deny
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ports translates port entries: "TCP"/"UDP"/"ICMP"/"ANY"/"" and
// "80,443,8000-8100" (empty: every port).
func ports(entries []*verdictv1.PortEntry) ([]firewall.Ports, error) {
	var out []firewall.Ports
	for _, e := range entries {
		p := firewall.Ports{}
		switch strings.ToUpper(strings.TrimSpace(e.GetProtocol())) {
		case "", "ANY":
		case "TCP":
			p.Protocol = "tcp"
		case "UDP":
			p.Protocol = "udp"
		case "ICMP":
			p.Protocol = "icmp"
		default:
			return nil, fmt.Errorf("protocol %q", e.GetProtocol())
		}
		for part := range strings.SplitSeq(e.GetPorts(), ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			lo, hi, isRange := strings.Cut(part, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
			h, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
			if err1 != nil || err2 != nil || l == 0 || l > h {
				return nil, fmt.Errorf("ports %q: %q is not a port or range of 1-65535", e.GetPorts(), part)
			}
			p.Ranges = append(p.Ranges, [2]uint16{uint16(l), uint16(h)})
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePeer reads an address ("10.0.0.1") or a prefix ("10.0.0.0/8").
func parsePeer(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// hashName is a short stable name for a list of strings.
func hashName(parts []string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return b32.EncodeToString(h.Sum(nil))[:11]
}

// chainName makes a workload's name (or address) a chain name suffix: kept
// when it is already one (at most 30 characters of [A-Za-z0-9_-]); otherwise
// its valid characters, cut, and a hash that keeps distinct names apart.
func chainName(s string) string {
	if len(s) <= 30 && nameOK(s) {
		return s
	}
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= 18 {
			break
		}
		if nameOK(string(c)) {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String() + "-" + hashName([]string{s})
}

// stance is what a workload without rules meets: its sides and the sets
// they name.
type stance struct {
	in, out firewall.Side
	sets    map[string][]netip.Prefix
}

// ruleset merges the guarded workloads (sorted by id) into one firewall
// ruleset; a workload without rules yet gets the stance, when it has
// addresses and a stance is given (nil: the workload is left out).
func ruleset(ws []*guarded, st *stance) *firewall.Ruleset {
	rs := &firewall.Ruleset{Sets: map[string][]netip.Prefix{}}
	stanceUsed := false
	for _, g := range ws {
		w := firewall.Workload{Name: g.chain, Addresses: g.addrs, Inbound: g.in, Outbound: g.out}
		if !g.ready {
			if len(g.addrs) == 0 || st == nil {
				continue
			}
			w.Inbound, w.Outbound = st.in, st.out
			stanceUsed = true
		}
		for name, members := range g.sets {
			ps := make([]netip.Prefix, 0, len(members))
			for p := range members {
				ps = append(ps, p)
			}
			rs.Sets[name] = ps
		}
		rs.Workloads = append(rs.Workloads, w)
	}
	if stanceUsed {
		maps.Copy(rs.Sets, st.sets)
	}
	return rs
}
