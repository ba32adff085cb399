package firewall

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Programmer keeps one nftables table (family inet) equal to the last
// Ruleset applied. It is safe for concurrent use; applies are serialised.
type Programmer struct {
	table string
	opts  []nftables.ConnOption

	mu      sync.Mutex
	applied *state // nil until the first apply: then the table is replaced whole
}

// state is what was last programmed: the structure's signature and each
// set's elements.
type state struct {
	sig   string
	elems map[string][][2][]byte
}

// Stats says what an Apply did.
type Stats struct {
	Full                    bool // the table was replaced whole (else: set elements only)
	Rules, Sets, Elements   int  // in the table after the apply
	ElementsAdded, ElemsDel int
}

// New returns a programmer of the table named table (in family inet), over
// netlink with opts (e.g. nftables.WithNetNSFd). Nothing is read or written
// before the first Apply, which replaces any table of that name whole: the
// name must be the agent's own.
func New(table string, opts ...nftables.ConnOption) (*Programmer, error) {
	if !nameOK(table) {
		return nil, fmt.Errorf("firewall: table name %q: 1-40 characters [A-Za-z0-9_-]", table)
	}
	return &Programmer{table: table, opts: append([]nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}, opts...)}, nil
}

// batchBuffer bounds one batch: a netlink sendmsg fails with EMSGSIZE when
// the batch exceeds the socket's send buffer (a workload with 1k rules and
// 10k peer addresses is a few MB), and the kernel's acknowledgements of a
// batch overflow a default receive buffer (ENOBUFS). The *FORCE options
// pass net.core.[rw]mem_max; they need CAP_NET_ADMIN, which programming
// nftables needs anyway. The memory is used only as a batch needs it.
const batchBuffer = 64 << 20

func bigBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, batchBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, batchBuffer))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("firewall: netlink buffers: %w", serr)
	}
	return nil
}

// Apply programs rs in one netlink batch: the whole table when its structure
// (workloads, chains, rules, set names) changed or on the first apply; only
// the elements of the sets whose membership changed otherwise.
func (p *Programmer) Apply(rs *Ruleset) (Stats, error) {
	if err := rs.Validate(); err != nil {
		return Stats{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, err := nftables.New(p.opts...)
	if err != nil {
		return Stats{}, fmt.Errorf("firewall: netlink: %w", err)
	}
	defer conn.CloseLasting() //nolint:errcheck // a non-lasting conn has nothing to close
	r := render(p.table, rs)
	var st Stats
	if p.applied == nil || p.applied.sig != r.sig {
		if err := r.full(conn); err != nil {
			return Stats{}, err
		}
		st.Full = true
	} else {
		add, del, err := r.delta(conn, p.applied.elems)
		if err != nil {
			return Stats{}, err
		}
		st.ElementsAdded, st.ElemsDel = add, del
	}
	if err := conn.Flush(); err != nil {
		p.applied = nil // unknown state: the next apply replaces the table whole
		return Stats{}, fmt.Errorf("firewall: netlink batch: %w", err)
	}
	p.applied = &state{sig: r.sig, elems: r.elems}
	st.Rules, st.Sets = r.nrules, len(r.elems)
	for _, e := range r.elems {
		st.Elements += len(e)
	}
	return st, nil
}

// Remove deletes the table, if it exists.
func (p *Programmer) Remove() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, err := nftables.New(p.opts...)
	if err != nil {
		return err
	}
	t, err := conn.ListTableOfFamily(p.table, nftables.TableFamilyINet)
	if err != nil || t == nil {
		return nil //nolint:nilerr // no such table: nothing to remove
	}
	conn.DelTable(t)
	p.applied = nil
	return conn.Flush()
}

// rendered is a Ruleset as nftables objects.
type rendered struct {
	table  *nftables.Table
	sig    string
	elems  map[string][][2][]byte // set name (with its family suffix) → elements
	v6     map[string]bool
	chains []*nftables.Chain
	rules  []*nftables.Rule // in order, chains set; set lookups by name (IDs filled in full)
	lookup []*expr.Lookup
	nrules int
}

const (
	nfprotoIPv4 = unix.NFPROTO_IPV4
	nfprotoIPv6 = unix.NFPROTO_IPV6
)

type fam struct {
	suffix           string
	nfproto          byte
	saddrOff, addrLn uint32
	daddrOff         uint32
	v6               bool
}

var fams = []fam{
	{"_4", nfprotoIPv4, 12, 4, 16, false},
	{"_6", nfprotoIPv6, 8, 16, 24, true},
}

func render(table string, rs *Ruleset) *rendered {
	r := &rendered{table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet},
		elems: map[string][][2][]byte{}, v6: map[string]bool{}}
	var sig strings.Builder
	addSet := func(name string, f fam, ivs []interval) {
		r.elems[name+f.suffix] = elements(ivs)
		r.v6[name+f.suffix] = f.v6
	}
	names := make([]string, 0, len(rs.Sets))
	for n := range rs.Sets {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, f := range fams {
			addSet("p_"+n, f, intervals(rs.Sets[n], f.v6))
		}
		fmt.Fprintf(&sig, "set %s\n", n)
	}
	accept := nftables.ChainPolicyAccept
	base := map[string]*nftables.Chain{}
	for _, b := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"input", nftables.ChainHookInput}, {"forward", nftables.ChainHookForward}, {"output", nftables.ChainHookOutput}} {
		c := &nftables.Chain{Name: b.name, Table: r.table, Hooknum: b.hook, Priority: nftables.ChainPriorityFilter,
			Type: nftables.ChainTypeFilter, Policy: &accept}
		base[b.name] = c
		r.chains = append(r.chains, c)
		// Invalid packets are dropped; the reply direction of a tracked
		// connection passes (its initiator's packets are the ones checked).
		r.add(c, "", []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitINVALID), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		})
		r.add(c, "", []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}, // IP_CT_DIR_REPLY
			&expr.Verdict{Kind: expr.VerdictAccept},
		})
	}
	for _, w := range rs.Workloads {
		fmt.Fprintf(&sig, "workload %s\n", w.Name)
		for _, f := range fams {
			var ps []netip.Prefix
			for _, a := range w.Addresses {
				if a = a.Unmap(); a.Is6() == f.v6 {
					ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
				}
			}
			addSet("w_"+w.Name, f, intervals(ps, f.v6))
		}
		in := &nftables.Chain{Name: "in_" + w.Name, Table: r.table}
		out := &nftables.Chain{Name: "out_" + w.Name, Table: r.table}
		r.chains = append(r.chains, in, out)
		for _, f := range fams {
			set := "w_" + w.Name + f.suffix
			for _, hook := range []string{"forward", "input"} {
				r.add(base[hook], "", append(addrMatch(f, f.daddrOff, set), &expr.Verdict{Kind: expr.VerdictJump, Chain: in.Name}))
			}
			for _, hook := range []string{"forward", "output"} {
				r.add(base[hook], "", append(addrMatch(f, f.saddrOff, set), &expr.Verdict{Kind: expr.VerdictJump, Chain: out.Name}))
			}
		}
		r.side(in, w.Inbound, true, &sig)
		r.side(out, w.Outbound, false, &sig)
	}
	r.sig = sig.String()
	return r
}

// side renders one workload chain: its rules in order, then the fallback.
// The peer is the source of inbound traffic, the destination of outbound.
func (r *rendered) side(c *nftables.Chain, s Side, inbound bool, sig *strings.Builder) {
	for i, rule := range s.Rules {
		fmt.Fprintf(sig, "  %s[%d] peer=%s action=%d ports=%v comment=%q\n", c.Name, i, rule.Peer, rule.Action, rule.Ports, rule.Comment)
		v := &expr.Verdict{Kind: expr.VerdictReturn}
		if rule.Action == Deny {
			v = &expr.Verdict{Kind: expr.VerdictDrop}
		}
		var peers [][]expr.Any
		if rule.Peer == "" {
			peers = [][]expr.Any{nil}
		} else {
			for _, f := range fams {
				off := f.saddrOff
				if !inbound {
					off = f.daddrOff
				}
				peers = append(peers, addrMatch(f, off, "p_"+rule.Peer+f.suffix))
			}
		}
		for _, pm := range peers {
			for _, l4 := range portMatches(rule.Ports) {
				r.add(c, rule.Comment, append(append(append([]expr.Any{}, pm...), l4...), v))
			}
		}
	}
	fmt.Fprintf(sig, "  %s fallback=%d\n", c.Name, s.Fallback)
	v := &expr.Verdict{Kind: expr.VerdictReturn}
	if s.Fallback == Deny {
		v = &expr.Verdict{Kind: expr.VerdictDrop}
	}
	r.add(c, "fallback", []expr.Any{v})
}

// portMatches: one expression list per (protocol, range) the entries allow;
// [nil] for all traffic.
func portMatches(ps []Ports) [][]expr.Any {
	if len(ps) == 0 {
		return [][]expr.Any{nil}
	}
	var out [][]expr.Any
	for _, p := range ps {
		proto, _ := protoNumber(p.Protocol)
		protos := []byte{proto}
		switch {
		case proto == 0 && len(p.Ranges) == 0:
			return [][]expr.Any{nil} // every protocol, every port: all traffic
		case proto == 0:
			protos = []byte{6, 17, 1, 58} // ports for TCP and UDP; ICMP ignores ports
		case proto == 1:
			protos = []byte{1, 58} // ICMP, and ICMPv6 for IPv6 peers
		}
		for _, pr := range protos {
			l4 := []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{pr}},
			}
			if pr == 1 || pr == 58 || len(p.Ranges) == 0 {
				out = append(out, l4)
				continue
			}
			for _, rg := range p.Ranges {
				m := append(slices.Clone(l4), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
				if rg[0] == rg[1] {
					m = append(m, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(rg[0])})
				} else {
					m = append(m, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(rg[0]), ToData: be16(rg[1])})
				}
				out = append(out, m)
			}
		}
	}
	return out
}

// addrMatch: the packet is of family f and its address at off is in set.
func addrMatch(f fam, off uint32, set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.addrLn},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

func (r *rendered) add(c *nftables.Chain, comment string, exprs []expr.Any) {
	rule := &nftables.Rule{Table: r.table, Chain: c, Exprs: exprs}
	if comment != "" {
		rule.UserData = userdata.AppendString(nil, userdata.TypeComment, comment)
	}
	for _, e := range exprs {
		if l, ok := e.(*expr.Lookup); ok {
			r.lookup = append(r.lookup, l)
		}
	}
	r.rules = append(r.rules, rule)
	r.nrules++
}

func (r *rendered) set(name string) *nftables.Set {
	kt := nftables.TypeIPAddr
	if r.v6[name] {
		kt = nftables.TypeIP6Addr
	}
	return &nftables.Set{Table: r.table, Name: name, KeyType: kt, Interval: true}
}

func setElems(pairs [][2][]byte) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(pairs))
	for _, p := range pairs {
		out = append(out, nftables.SetElement{Key: p[0]}, nftables.SetElement{Key: p[1], IntervalEnd: true})
	}
	return out
}

// full queues the whole table: the old one deleted (if any), the new one
// created, in the same batch.
func (r *rendered) full(conn *nftables.Conn) error {
	old, err := conn.ListTableOfFamily(r.table.Name, nftables.TableFamilyINet)
	if err == nil && old != nil {
		conn.DelTable(old)
	}
	conn.AddTable(r.table)
	ids := map[string]uint32{}
	names := make([]string, 0, len(r.elems))
	for n := range r.elems {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		s := r.set(n)
		if err := conn.AddSet(s, setElems(r.elems[n])); err != nil {
			return fmt.Errorf("firewall: set %s: %w", n, err)
		}
		ids[n] = s.ID
	}
	for _, l := range r.lookup {
		l.SetID = ids[l.SetName]
	}
	for _, c := range r.chains {
		conn.AddChain(c)
	}
	for _, rule := range r.rules {
		conn.AddRule(rule)
	}
	return nil
}

// delta queues the element changes of every set whose membership changed.
func (r *rendered) delta(conn *nftables.Conn, old map[string][][2][]byte) (added, deleted int, err error) {
	var errs []error
	for n, want := range r.elems {
		have := old[n]
		if sameElements(have, want) {
			continue
		}
		s := r.set(n)
		var del, add [][2][]byte
		for _, e := range have {
			if !slices.ContainsFunc(want, func(x [2][]byte) bool { return sameElements([][2][]byte{x}, [][2][]byte{e}) }) {
				del = append(del, e)
			}
		}
		for _, e := range want {
			if !slices.ContainsFunc(have, func(x [2][]byte) bool { return sameElements([][2][]byte{x}, [][2][]byte{e}) }) {
				add = append(add, e)
			}
		}
		if len(del) > 0 {
			errs = append(errs, conn.SetDeleteElements(s, setElems(del)))
		}
		if len(add) > 0 {
			errs = append(errs, conn.SetAddElements(s, setElems(add)))
		}
		added, deleted = added+len(add), deleted+len(del)
	}
	return added, deleted, errors.Join(errs...)
}
