package firewall

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/verdictpdp/verdict/internal/netnstest"
)

// The figures of BENCHMARKS.md ("The firewall agent"). They need root and
// network namespaces, as the namespace test does; they are reports, never
// assertions.

func benchProgrammer(b *testing.B) (*netnstest.Topo, *Programmer) {
	b.Helper()
	netnstest.Require(b)
	tp := netnstest.NewTopo(b)
	hns, err := netns.GetFromName(tp.H)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hns.Close() })
	p, err := New("verdict-bench", nftables.WithNetNSFd(int(hns)))
	if err != nil {
		b.Fatal(err)
	}
	return tp, p
}

// BenchmarkApplyToEnforcing: from the start of an Apply that turns a
// rule to ALLOW until a TCP connection through the programmed namespace
// succeeds (the previous iteration turned it back to DENY). p50 and p99 are
// reported; probes are 5 ms connect attempts, so the resolution is ~5 ms.
func BenchmarkApplyToEnforcing(b *testing.B) {
	tp, p := benchProgrammer(b)
	netnstest.Echo(b, tp.B, "10.250.2.2:8080")
	a24 := []netip.Prefix{netip.MustParsePrefix("10.250.1.0/24")}
	var lat []time.Duration
	for b.Loop() {
		if _, err := p.Apply(ruleset(a24, Deny)); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := p.Apply(ruleset(a24, Allow)); err != nil {
			b.Fatal(err)
		}
		for {
			c, err := netnstest.Dial(b, tp.A, "10.250.2.2:8080", 5*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			if time.Since(start) > 10*time.Second {
				b.Fatal("the ALLOW was not enforced within 10 s")
			}
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// large is a workload with rules rules, over sets sets that hold addrs
// addresses in all (distinct /32s of 10.128.0.0/9), ports per rule.
func large(rules, sets, addrs int, shift int) *Ruleset {
	rs := &Ruleset{Sets: map[string][]netip.Prefix{}}
	for i := range addrs {
		n := i + shift
		a := netip.AddrFrom4([4]byte{10, byte(128 + n>>16&0x7f), byte(n >> 8), byte(n)})
		name := fmt.Sprintf("s%d", i%sets)
		rs.Sets[name] = append(rs.Sets[name], netip.PrefixFrom(a, 32))
	}
	w := Workload{Name: "big", Addresses: []netip.Addr{netip.MustParseAddr("10.250.2.2")}, Outbound: Side{Fallback: Allow}}
	for i := range rules {
		act := Allow
		if i%5 == 0 {
			act = Deny
		}
		w.Inbound.Rules = append(w.Inbound.Rules, Rule{Peer: fmt.Sprintf("s%d", i%sets), Action: act,
			Ports: []Ports{{Protocol: "tcp", Ranges: [][2]uint16{{uint16(1000 + i), uint16(1000 + i)}}}}})
	}
	w.Inbound.Fallback = Deny
	rs.Workloads = []Workload{w}
	return rs
}

// BenchmarkApplyLarge: a workload with 1k rules and 10k peer addresses
// (100 sets), the table replaced whole each time (a restart, or a change of
// rules): the time of one apply, the table's size, and rules and elements
// programmed per second.
func BenchmarkApplyLarge(b *testing.B) {
	_, p := benchProgrammer(b)
	rs := large(1000, 100, 10000, 0)
	var st Stats
	for b.Loop() {
		p.applied = nil // replace whole every time
		var err error
		if st, err = p.Apply(rs); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(st.Rules), "kernel-rules")
	b.ReportMetric(float64(st.Elements), "elements")
	b.ReportMetric(float64(st.Rules)/sec, "rules/s")
	b.ReportMetric(float64(st.Elements)/sec, "elements/s")
}

// BenchmarkApplyDelta: the same workload, 1k of its 10k addresses replaced
// by others each time (membership only): set elements programmed per second.
func BenchmarkApplyDelta(b *testing.B) {
	_, p := benchProgrammer(b)
	base := large(1000, 100, 10000, 0)
	if _, err := p.Apply(base); err != nil {
		b.Fatal(err)
	}
	next := []*Ruleset{large(1000, 100, 10000, 1000), base}
	changed := 0
	i := 0
	for b.Loop() {
		st, err := p.Apply(next[i%2])
		i++
		if err != nil {
			b.Fatal(err)
		}
		if st.Full {
			b.Fatal("a membership change replaced the table whole")
		}
		changed += st.ElementsAdded + st.ElemsDel
	}
	b.ReportMetric(float64(changed)/b.Elapsed().Seconds(), "elements/s")
}
