package analysis_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/internal/worldgen"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The analysis answers are held to brute force: Decide on every workload pair
// of random worlds (genWorld's scopes, S&D and targetRef types, expressions,
// audit, PerDestination; genInventory's addresses, principals and port tags)
// on every class of flows, plus probes outside the inventory — addresses and
// principals of every kind — each decided alone and looked up in the answer.

var analysisTypes = []string{"TrafficPermission", "MeshTrafficPermission", "Other"}

// analysisWorld is one random world: its resources and valid workloads.
type analysisWorld struct {
	resources []resource.Resource
	policies  []resource.Resource
	workloads []string
	snap      *engine.Snapshot
}

func newAnalysisWorld(c *worldgen.Choices) *analysisWorld {
	w := &analysisWorld{policies: worldgen.World(c)}
	inv := worldgen.Inventory(c)
	w.resources = append([]resource.Resource{}, w.policies...)
	for _, m := range inv {
		w.resources = append(w.resources, m.W)
		if m.Valid {
			w.workloads = append(w.workloads, m.W.Name)
		}
	}
	w.snap = engine.Build(int64(len(inv)+1), w.resources)
	return w
}

// sidesEqual compares what an analysis answer names: the final action and
// each side's action, policy, scope, rule and reason.
func sidesEqual(a, b engine.Decision) bool {
	same := func(x, y engine.SideDecision) bool {
		return x.Action == y.Action && x.Policy == y.Policy && x.Scope == y.Scope && x.Rule == y.Rule && x.Reason == y.Reason
	}
	return a.Action == b.Action && same(a.Outbound, b.Outbound) && same(a.Inbound, b.Inbound)
}

func decideEP(t *testing.T, s *engine.Snapshot, typ string, src, dst inventory.Endpoint, proto resource.Protocol, port uint32) (engine.Decision, error) {
	t.Helper()
	req := engine.Request{Mesh: "m", Type: typ, SourceEndpoint: &src, DestinationEndpoint: &dst, Protocol: proto, Port: port, NoCache: true}
	return s.Decide(&req)
}

// portsOf returns the ports to probe a class with: its own and another of
// its range.
func portsOf(c *worldgen.Choices, cl analysis.FlowClass) []uint32 {
	out := []uint32{cl.Port}
	if cl.Hi > cl.Lo {
		out = append(out, cl.Lo+uint32(c.N(int(min(cl.Hi-cl.Lo, 5000))))+1)
	}
	return out
}

// probeAddresses and probePrincipals reach every outside class genWorld's
// selectors can tell apart, and some they cannot.
var (
	probeAddresses = []string{"10.0.0.1", "10.0.0.2", "10.0.1.5", "10.0.1.200", "10.0.200.1", "10.1.0.1", "192.168.1.1", "192.168.0.9",
		"192.169.0.1", "1.2.3.4", "100.0.0.1", "11.0.0.1", "172.16.0.1", "0.0.0.0", "255.255.255.255", "2001:db8::1", "2001:db8::2",
		"1::1", "10::", "::1", "fe80::1", "abcd::1", "::ffff:10.0.0.3"}
	probePrincipals = []string{"spiffe://m/web", "spiffe://m/backend", "spiffe://m/redis", "spiffe://m/wx", "spiffe://m/b",
		"spiffe://m/a/b", "spiffe://m/", "spiffe://m/web/x", "spiffe://other/web", "spiffe://m", "urn:x", "urn:y", "s", "spiffe",
		"web", "x", "spiffe://m/r", "spiffe://m/redis2"}
)

// principalMatches is the documented pattern syntax (docs/analysis.md).
func principalMatches(pattern, id, mesh string) bool {
	kuma := "spiffe://" + mesh + "/"
	isKuma := func() bool {
		svc, ok := strings.CutPrefix(id, kuma)
		return ok && svc != "" && !strings.Contains(svc, "/")
	}
	switch {
	case strings.HasSuffix(pattern, "*/*"):
		return strings.HasPrefix(id, strings.TrimSuffix(pattern, "*/*")) && !isKuma()
	case strings.HasSuffix(pattern, "*"):
		p := strings.TrimSuffix(pattern, "*")
		if !strings.HasPrefix(id, p) {
			return false
		}
		return !strings.HasPrefix(p, kuma) || isKuma()
	}
	return id == pattern
}

// covering returns the entry of a reach answer that covers an outside
// endpoint, if any.
func covering(entries []analysis.ReachEntry, ep inventory.Endpoint) (analysis.ReachEntry, bool) {
	for _, e := range entries {
		switch {
		case e.Workload != "":
		case ep.Address != "" && e.Outside.Any:
			return e, true
		case ep.Address != "" && e.Outside.CIDR != "":
			a, _ := netip.ParseAddr(ep.Address)
			if netip.MustParsePrefix(e.Outside.CIDR).Contains(a.Unmap()) {
				return e, true
			}
		case ep.Principal != "" && e.Outside.Principal != "":
			if !principalMatches(e.Outside.Principal, ep.Principal, "m") {
				continue
			}
			excepted := false
			for _, x := range e.Outside.Except {
				excepted = excepted || principalMatches(x, ep.Principal, "m")
			}
			if !excepted {
				return e, true
			}
		}
	}
	return analysis.ReachEntry{}, false
}

func checkReach(t *testing.T, c *worldgen.Choices, w *analysisWorld, typ string, ep inventory.Endpoint, destination bool, proto resource.Protocol, port uint32) {
	t.Helper()
	got, err := analysis.Reach(w.snap, &analysis.ReachRequest{Mesh: "m", Type: typ, Endpoint: ep, Destination: destination, Protocol: proto, Port: port})
	pair := func(peer inventory.Endpoint) (engine.Decision, error) {
		if destination {
			return decideEP(t, w.snap, typ, peer, ep, proto, port)
		}
		return decideEP(t, w.snap, typ, ep, peer, proto, port)
	}
	if err != nil {
		if len(w.workloads) > 0 {
			if _, derr := pair(inventory.Endpoint{Workload: w.workloads[0]}); derr == nil {
				t.Fatalf("Reach failed (%v) where Decide answers", err)
			}
		}
		return
	}
	byName := map[string]analysis.ReachEntry{}
	for _, e := range got.Entries {
		if e.Workload != "" {
			byName[e.Workload] = e
		}
	}
	for _, name := range w.workloads {
		d, err := pair(inventory.Endpoint{Workload: name})
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		e, listed := byName[name]
		if listed != (d.Action == resource.Allow) {
			t.Fatalf("%s %v (dst %v) %v %d: workload %s listed=%v, Decide %+v", typ, ep, destination, proto, port, name, listed, d)
		}
		if listed && !sidesEqual(engine.Decision{Action: resource.Allow, Outbound: e.Outbound, Inbound: e.Inbound}, d) {
			t.Fatalf("workload %s: entry sides %+v / %+v, Decide %+v", name, e.Outbound, e.Inbound, d)
		}
	}
	probes := make([]inventory.Endpoint, 0, 64)
	for _, a := range probeAddresses {
		probes = append(probes, inventory.Endpoint{Address: a})
	}
	for _, p := range probePrincipals {
		probes = append(probes, inventory.Endpoint{Principal: p})
	}
	for i := 0; i < 8; i++ {
		probes = append(probes, inventory.Endpoint{Address: fmt.Sprintf("10.0.%d.%d", c.N(3), c.N(256))})
	}
	for _, e := range got.Entries {
		if e.Outside.CIDR != "" {
			p := netip.MustParsePrefix(e.Outside.CIDR)
			probes = append(probes, inventory.Endpoint{Address: p.Addr().String()})
		}
	}
	for _, p := range probes {
		d, err := pair(p)
		if err != nil {
			t.Fatalf("Decide %v: %v", p, err)
		}
		if d.SourceResolution.ResolvedAs != inventory.AsExternal && d.SourceResolution.ResolvedAs != inventory.AsUnknownPrincipal &&
			d.SourceResolution.ResolvedAs != inventory.AsKumaSpiffe && destination ||
			d.DestinationResolution.ResolvedAs != inventory.AsExternal && d.DestinationResolution.ResolvedAs != inventory.AsUnknownPrincipal &&
				d.DestinationResolution.ResolvedAs != inventory.AsKumaSpiffe && !destination {
			continue // the inventory holds it
		}
		e, covered := covering(got.Entries, p)
		if covered != (d.Action == resource.Allow) {
			t.Fatalf("%s %v (dst %v) %v %d: outside %v covered=%v (%v), Decide %+v\nentries %+v\nnotes %v\n%s", typ, ep, destination, proto, port,
				p, covered, e.Outside, d, got.Entries, got.Notes, worldgen.Describe(w.resources))
		}
		if covered && !sidesEqual(engine.Decision{Action: resource.Allow, Outbound: e.Outbound, Inbound: e.Inbound}, d) {
			t.Fatalf("outside %v: entry %v sides %+v / %+v, Decide %+v", p, e.Outside, e.Outbound, e.Inbound, d)
		}
	}
}

func checkMatrix(t *testing.T, c *worldgen.Choices, w *analysisWorld, typ string) {
	t.Helper()
	type key struct {
		src, dst string
		class    analysis.FlowClass
	}
	got := map[key]analysis.MatrixEntry{}
	_, _, err := analysis.Matrix(w.snap, &analysis.MatrixRequest{Mesh: "m", Type: typ}, func(e analysis.MatrixEntry) bool {
		got[key{e.Source, e.Destination, e.Class}] = e
		return true
	})
	if err != nil {
		return
	}
	for _, cl := range analysis.FlowClasses("m", typ, w.snap) {
		for _, s := range w.workloads {
			for _, d := range w.workloads {
				e, listed := got[key{s, d, cl}]
				for _, port := range portsOf(c, cl) {
					dec, err := decideEP(t, w.snap, typ, inventory.Endpoint{Workload: s}, inventory.Endpoint{Workload: d}, cl.Protocol, port)
					if err != nil {
						t.Fatal(err)
					}
					if listed != (dec.Action == resource.Allow) {
						t.Fatalf("matrix %s %s->%s %v (port %d): listed=%v, Decide %+v", typ, s, d, cl, port, listed, dec)
					}
					if listed && !sidesEqual(engine.Decision{Action: resource.Allow, Outbound: e.Outbound, Inbound: e.Inbound}, dec) {
						t.Fatalf("matrix %s->%s %v: entry %+v, Decide %+v", s, d, cl, e, dec)
					}
				}
			}
		}
	}
}

func checkAnalysis(t *testing.T, data []byte) {
	c := worldgen.NewChoices(data)
	w := newAnalysisWorld(c)
	for _, typ := range analysisTypes {
		classes := analysis.FlowClasses("m", typ, w.snap)
		for i := 0; i < 4; i++ {
			cl := classes[c.N(len(classes))]
			port := portsOf(c, cl)[c.N(2)%len(portsOf(c, cl))]
			var ep inventory.Endpoint
			switch {
			case len(w.workloads) > 0 && c.Chance(60):
				ep = inventory.Endpoint{Workload: w.workloads[c.N(len(w.workloads))]}
			case c.Chance(50):
				ep = inventory.Endpoint{Address: probeAddresses[c.N(len(probeAddresses))]}
			default:
				ep = inventory.Endpoint{Principal: probePrincipals[c.N(len(probePrincipals))]}
			}
			checkReach(t, c, w, typ, ep, c.Chance(50), cl.Protocol, port)
		}
		checkMatrix(t, c, w, typ)
	}
	// The same on snapshots derived from this one, which start from what it
	// computed (the classes and the rule orders its lineage carries): a
	// policy re-put with its action flipped (its conditions stay) and a
	// random change.
	for _, next := range derivedSnapshots(c, w) {
		dw := *w
		dw.snap = next
		for _, typ := range analysisTypes {
			classes := analysis.FlowClasses("m", typ, next)
			cl := classes[c.N(len(classes))]
			ep := inventory.Endpoint{Address: probeAddresses[c.N(len(probeAddresses))]}
			if len(w.workloads) > 0 {
				ep = inventory.Endpoint{Workload: w.workloads[c.N(len(w.workloads))]}
			}
			checkReach(t, c, &dw, typ, ep, c.Chance(50), cl.Protocol, cl.Port)
			checkMatrix(t, c, &dw, typ)
		}
	}
}

// derivedSnapshots returns snapshots Apply derives from the world's: one
// with a policy's action flipped, one with a random change.
func derivedSnapshots(c *worldgen.Choices, w *analysisWorld) []*engine.Snapshot {
	rev := w.snap.Revision() + 1
	var out []*engine.Snapshot
	var policies []*resource.Policy
	for _, r := range w.policies {
		if p, ok := r.(*resource.Policy); ok {
			policies = append(policies, p)
		}
	}
	if len(policies) > 0 {
		q := policies[c.N(len(policies))]
		p := *q
		p.Action = resource.Deny
		if q.Action == resource.Deny {
			p.Action = resource.Allow
		}
		m := p.Metadata()
		m.ModRevision = rev
		out = append(out, w.snap.Apply(rev, []engine.Change{engine.Put(p.WithMeta(m))}))
	}
	puts, deletes, _ := genChange(c, w, rev)
	var changes []engine.Change
	for _, r := range puts {
		changes = append(changes, engine.Put(r))
	}
	for _, k := range deletes {
		changes = append(changes, engine.Delete(k))
	}
	return append(out, w.snap.Apply(rev, changes))
}

// TestAnalysisMatchesDecide holds Reach and Matrix to brute-force Decide,
// with each class's masks (bulk.go) kept from its second decision and the
// workloads interned by one Bulk, then with the masks kept from the first
// decision and the workloads interned by two, a half each (bulkbase.go).
func TestAnalysisMatchesDecide(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 40
	}
	for _, forced := range []bool{false, true} {
		analysis.KeepMasks(forced)
		analysis.SplitInterning(forced)
		for i := 0; i < n; i++ {
			checkAnalysis(t, worldgen.SeedBytes(5_000_000+i))
		}
	}
	analysis.KeepMasks(false)
	analysis.SplitInterning(false)
}

func FuzzAnalysisMatchesDecide(f *testing.F) {
	for i := 0; i < 10; i++ {
		f.Add(worldgen.SeedBytes(5_100_000 + i))
	}
	f.Fuzz(func(t *testing.T, seed []byte) { withSplit(seed, func() { checkAnalysis(t, seed) }) })
}

// withSplit runs check with the workloads of every base interned in two
// halves for half the seeds (by their last byte), by one Bulk for the
// others.
func withSplit(seed []byte, check func()) {
	analysis.SplitInterning(len(seed) > 0 && seed[len(seed)-1]&1 == 1)
	defer analysis.SplitInterning(false)
	check()
}

// genChange proposes a change to a world: a policy rewritten, added or
// deleted, now and then a scope or the mesh, and returns the puts and
// deletes with the resources as they would be after it.
func genChange(c *worldgen.Choices, w *analysisWorld, rev int64) ([]resource.Resource, []resource.Key, []resource.Resource) {
	fresh := worldgen.World(c) // a pool of policies and scopes to draw from
	var puts []resource.Resource
	var deletes []resource.Key
	after := append([]resource.Resource{}, w.resources...)
	stamp := func(r resource.Resource, old resource.Resource) resource.Resource {
		m := r.Metadata()
		m.CreateRevision, m.ModRevision = rev, rev
		if old != nil {
			m.CreateRevision = old.Metadata().CreateRevision
		}
		return r.WithMeta(m)
	}
	indexOf := func(k resource.Key) int {
		for i, r := range after {
			if r.Key() == k {
				return i
			}
		}
		return -1
	}
	for n := 1 + c.N(2); n > 0; n-- {
		var candidates []resource.Resource
		for _, r := range fresh {
			if _, isMesh := r.(*resource.Mesh); !isMesh || c.Chance(20) {
				if _, isScope := r.(*resource.Scope); !isScope || c.Chance(30) {
					candidates = append(candidates, r)
				}
			}
		}
		switch {
		case len(w.policies) > 0 && c.Chance(25):
			r := w.policies[c.N(len(w.policies))]
			if _, ok := r.(*resource.Policy); !ok {
				continue
			}
			if i := indexOf(r.Key()); i >= 0 && !containsKey(puts, r.Key()) && !containsK(deletes, r.Key()) {
				deletes = append(deletes, r.Key())
				after = append(after[:i], after[i+1:]...)
			}
		case len(candidates) > 0:
			r := candidates[c.N(len(candidates))]
			if containsKey(puts, r.Key()) || containsK(deletes, r.Key()) {
				continue
			}
			i := indexOf(r.Key())
			var old resource.Resource
			if i >= 0 {
				old = after[i]
			}
			r = stamp(r, old)
			puts = append(puts, r)
			if i >= 0 {
				after[i] = r
			} else {
				after = append(after, r)
			}
		}
	}
	return puts, deletes, after
}

func containsKey(rs []resource.Resource, k resource.Key) bool {
	for _, r := range rs {
		if r.Key() == k {
			return true
		}
	}
	return false
}

func containsK(ks []resource.Key, k resource.Key) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

func checkImpact(t *testing.T, data []byte) {
	c := worldgen.NewChoices(data)
	w := newAnalysisWorld(c)
	rev := w.snap.Revision() + 1
	puts, deletes, afterRes := genChange(c, w, rev)
	if err := w.snap.CheckApply(puts, deletes); err != nil {
		if _, err := analysis.Impact(w.snap, &analysis.ImpactRequest{Puts: puts, Deletes: deletes}); err == nil {
			t.Fatal("Impact accepted a change CheckApply refuses")
		}
		return
	}
	after := engine.Build(rev, afterRes)
	var observed []analysis.ObservedFlow
	var inv []worldgen.Workload
	for _, r := range w.resources {
		if wl, ok := r.(*resource.Workload); ok {
			inv = append(inv, worldgen.Workload{W: wl})
		}
	}
	for i := 0; i < 20; i++ {
		req := worldgen.Request(c)
		observed = append(observed, analysis.ObservedFlow{Mesh: "m", Type: req.Type, Source: worldgen.Endpoint(c, inv), Destination: worldgen.Endpoint(c, inv),
			Protocol: req.Protocol, Port: req.Port, Count: uint64(1 + i)})
	}
	got, err := analysis.Impact(w.snap, &analysis.ImpactRequest{Puts: puts, Deletes: deletes, Flows: observed})
	if err != nil {
		t.Fatalf("Impact: %v", err)
	}
	type key struct {
		typ, src, dst string
		proto         resource.Protocol
		port          uint32
		observed      bool
	}
	listed := map[key]analysis.ImpactChange{}
	for _, ch := range got.Changes {
		k := key{ch.Type, fmt.Sprint(ch.Source), fmt.Sprint(ch.Destination), ch.Class.Protocol, ch.Class.Port, ch.Observed}
		listed[k] = ch
	}
	answer := func(s *engine.Snapshot, typ string, src, dst inventory.Endpoint, proto resource.Protocol, port uint32) (engine.Decision, bool) {
		d, err := decideEP(t, s, typ, src, dst, proto, port)
		return d, err == nil
	}
	changed := func(b, a engine.Decision, bok, aok bool) bool {
		if bok != aok {
			return true
		}
		if !bok {
			return false
		}
		if !sidesEqual(b, a) || b.Policy != a.Policy || (b.Audit == nil) != (a.Audit == nil) {
			return true
		}
		return b.Audit != nil && *b.Audit != *a.Audit
	}
	names := map[string]bool{}
	for _, s := range []*engine.Snapshot{w.snap, after} {
		s.Resources(func(e engine.Entry) bool {
			if wl, ok := e.Resource.(*resource.Workload); ok && e.Err == nil {
				names[wl.Name] = true
			}
			return true
		})
	}
	for _, typ := range analysisTypes {
		_, errB := analysis.NewBulk(w.snap, "m", typ)
		_, errA := analysis.NewBulk(after, "m", typ)
		if errB != nil && errA != nil {
			continue
		}
		touched := false
		for _, ch := range got.Changes {
			touched = touched || ch.Type == typ
		}
		for _, cl := range analysis.FlowClasses("m", typ, w.snap, after) {
			for s := range names {
				for d := range names {
					src, dst := inventory.Endpoint{Workload: s}, inventory.Endpoint{Workload: d}
					for _, port := range portsOf(c, cl) {
						b, bok := answer(w.snap, typ, src, dst, cl.Protocol, port)
						a, aok := answer(after, typ, src, dst, cl.Protocol, port)
						ch, ok := listed[key{typ, fmt.Sprint(src), fmt.Sprint(dst), cl.Protocol, cl.Port, false}]
						if ok != changed(b, a, bok, aok) {
							t.Fatalf("impact %s %s->%s %v port %d: listed=%v; before %+v (%v), after %+v (%v)\nputs %s\ndeletes %v\nworld %s",
								typ, s, d, cl, port, ok, b, bok, a, aok, worldgen.Describe(puts), deletes, worldgen.Describe(w.resources))
						}
						if ok && (bok && !sidesEqual(ch.Before, b) || aok && !sidesEqual(ch.After, a)) {
							t.Fatalf("impact %s %s->%s %v: listed %+v -> %+v; Decide %+v -> %+v", typ, s, d, cl, ch.Before, ch.After, b, a)
						}
					}
				}
			}
		}
		_ = touched
	}
	for _, o := range observed {
		b, bok := answer(w.snap, o.Type, o.Source, o.Destination, o.Protocol, o.Port)
		a, aok := answer(after, o.Type, o.Source, o.Destination, o.Protocol, o.Port)
		_, ok := listed[key{o.Type, fmt.Sprint(o.Source), fmt.Sprint(o.Destination), o.Protocol, o.Port, true}]
		if ok != changed(b, a, bok, aok) {
			t.Fatalf("observed %+v: listed=%v; before %+v (%v), after %+v (%v)\nputs %s\ndeletes %v", o, ok, b, bok, a, aok, worldgen.Describe(puts), deletes)
		}
	}
}

// TestImpactMatchesDecide holds Impact to Decide on the snapshots before and
// after random changes: every inventory pair on every class of flows, and
// random observed flows of every endpoint form.
func TestImpactMatchesDecide(t *testing.T) {
	t.Parallel()
	n := 300
	if testing.Short() {
		n = 40
	}
	for i := 0; i < n; i++ {
		checkImpact(t, worldgen.SeedBytes(6_000_000+i))
	}
}

func FuzzImpactMatchesDecide(f *testing.F) {
	for i := 0; i < 10; i++ {
		f.Add(worldgen.SeedBytes(6_100_000 + i))
	}
	f.Fuzz(func(t *testing.T, seed []byte) { withSplit(seed, func() { checkImpact(t, seed) }) })
}
