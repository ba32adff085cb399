package observed

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// clock is a test clock: each reading one second later.
type clock struct{ n atomic.Int64 }

func (c *clock) now() time.Time { return time.Unix(1_700_000_000+c.n.Add(1), 0) }

func tagsEnd(kv ...string) End {
	t := resource.Tags{}
	for i := 0; i < len(kv); i += 2 {
		t[kv[i]] = kv[i+1]
	}
	return End{Given: inventory.Endpoint{Tags: t}, Tags: t}
}

func workloadEnd(name string, kv ...string) End {
	e := tagsEnd(kv...)
	return End{Given: inventory.Endpoint{Workload: name}, Tags: e.Tags, Identity: resource.Identity("m", e.Tags)}
}

func flowsByKey(t *testing.T, tab *Table) map[string]Flow {
	t.Helper()
	out := map[string]Flow{}
	for _, f := range tab.Flows(nil) {
		k := fmt.Sprintf("%s/%s %s -> %s %s/%d", f.Mesh, f.Type, endText(f.Source), endText(f.Destination), f.Protocol, f.Port)
		if _, dup := out[k]; dup {
			t.Fatalf("flow %s listed twice", k)
		}
		out[k] = f
	}
	return out
}

func endText(e End) string {
	switch g := e.Given; {
	case g.Workload != "":
		return "workload:" + g.Workload
	case g.Address != "":
		return "address:" + g.Address
	case g.Principal != "":
		return "principal:" + g.Principal
	case g.Identity != 0:
		return fmt.Sprintf("identity:%d", g.Identity)
	}
	return fmt.Sprintf("tags:%v", e.Given.Tags)
}

func TestObserveCountsFlowsByTheirEnds(t *testing.T) {
	t.Parallel()
	var c clock
	tab := New(Config{Now: c.now})
	web := workloadEnd("web-1", "app", "web")
	db := workloadEnd("db-1", "app", "db")
	for i, d := range []Decision{
		{Mesh: "m", Source: web, Destination: db, Protocol: resource.TCP, Port: 5432, Action: resource.Allow, Policy: "p1", Revision: 3},
		{Mesh: "m", Source: web, Destination: db, Protocol: resource.TCP, Port: 5432, Action: resource.Deny, Policy: "p2", Revision: 4},
		{Mesh: "m", Source: web, Destination: db, Protocol: resource.TCP, Port: 5433, Action: resource.Allow},
		{Mesh: "m", Type: "Other", Source: web, Destination: db, Protocol: resource.TCP, Port: 5432, Action: resource.Allow},
		{Mesh: "m", Source: tagsEnd("app", "web", "ip", "10.0.0.1"), Destination: db, Protocol: resource.TCP, Port: 5432},
		{Mesh: "m", Source: tagsEnd("app", "web", "ip", "10.0.0.2"), Destination: db, Protocol: resource.TCP, Port: 5432},
		{Mesh: "m", Source: tagsEnd("app", "web", "ip", "10.0.0.2"), Destination: db, Protocol: resource.TCP, Port: 5432},
	} {
		t.Logf("decision %d", i)
		tab.Observe(&d)
	}
	got := flowsByKey(t, tab)
	if len(got) != 5 {
		t.Fatalf("%d flows, want 5: %v", len(got), got)
	}
	f := got["m/TrafficPermission workload:web-1 -> workload:db-1 TCP/5432"]
	if f.Count != 2 || f.Action != resource.Deny || f.Policy != "p2" || f.Revision != 4 || !f.First.Before(f.Last) {
		t.Errorf("flow %+v: want 2 decisions, the last a DENY by p2 at 4, first before last", f)
	}
	if f.Source.Tags["app"] != "web" || f.Source.Identity != web.Identity {
		t.Errorf("source resolved as %v (%d), want the tags decided on", f.Source.Tags, f.Source.Identity)
	}
	if n := got["m/TrafficPermission tags:map[app:web ip:10.0.0.2] -> workload:db-1 TCP/5432"].Count; n != 2 {
		t.Errorf("a flow given as tags: %d decisions, want 2 (the ip tells the ends apart)", n)
	}
}

// TestLeastRecentlySeenIsEvicted: over the bound, the flow seen longest
// ago goes, whatever was seen how often before (a clock would evict 1
// below: every flow is seen twice before 1 again).
func TestLeastRecentlySeenIsEvicted(t *testing.T) {
	t.Parallel()
	var c clock
	tab := New(Config{Max: 3, Now: c.now})
	a, b := workloadEnd("a"), workloadEnd("b")
	see := func(port uint32) {
		tab.Observe(&Decision{Mesh: "m", Source: a, Destination: b, Protocol: resource.TCP, Port: port})
	}
	for _, p := range []uint32{1, 2, 3, 1, 2, 3, 1} { // 2 is now the least recently seen
		see(p)
	}
	see(4)
	got := map[uint32]bool{}
	for _, f := range tab.Flows(nil) {
		got[f.Port] = true
	}
	if len(got) != 3 || !got[1] || got[2] || !got[3] || !got[4] {
		t.Fatalf("ports kept %v, want 1, 3 and 4", got)
	}
	if tab.Evicted() != 1 {
		t.Errorf("evicted %d, want 1", tab.Evicted())
	}
}

func TestEndsGoWithTheirLastFlow(t *testing.T) {
	t.Parallel()
	tab := New(Config{Max: 10})
	for i := range 100 {
		tab.Observe(&Decision{Mesh: "m", Source: workloadEnd(fmt.Sprintf("s%d", i)), Destination: workloadEnd("d"),
			Protocol: resource.TCP, Port: 80})
	}
	ends := 0
	for i := range tab.ends {
		ends += len(tab.ends[i].index)
	}
	if ends != 11 {
		t.Fatalf("%d ends held for 10 flows from 10 sources to one destination, want 11", ends)
	}
	for _, f := range tab.Flows(nil) {
		if f.Destination.Given.Workload != "d" || f.Source.Given.Workload == "" {
			t.Fatalf("flow %+v: an end id names another end", f)
		}
	}
}

// TestEndBytesAreBounded: distinct ends of kilobytes of tags each are held
// within MaxEndBytes, the least recently seen flows evicted, and the count
// comes back to zero with the last flow's ends.
func TestEndBytesAreBounded(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	tab := New(Config{Max: 1_000_000, MaxEndBytes: limit})
	big := strings.Repeat("x", 2048)
	tagEnd := func(i int) End {
		tags := resource.Tags{"app": fmt.Sprint(i), "blob": big}
		return End{Given: inventory.Endpoint{Tags: tags}, Tags: tags}
	}
	max := int64(0)
	for i := range 5_000 {
		tab.Observe(&Decision{Mesh: "m", Source: tagEnd(i), Destination: workloadEnd("db"), Protocol: resource.TCP, Port: 80})
		max = maxOf(max, tab.EndBytes())
	}
	// One flow over: a new flow's ends are counted before the oldest go.
	if slack := int64(2 * endBytes(endKey{}, tagEnd(0).Tags, tagEnd(0).Tags)); max > limit+slack {
		t.Errorf("ends held %d bytes, bound %d", max, limit)
	}
	if tab.Evicted() == 0 || tab.Len() >= 5_000 || tab.Len() == 0 {
		t.Errorf("%d flows held, %d evicted", tab.Len(), tab.Evicted())
	}
	if !slices.ContainsFunc(tab.Flows(nil), func(f Flow) bool { return f.Source.Given.Tags["app"] == "4999" }) {
		t.Error("the newest flow is not held")
	}
	small := New(Config{Max: 1, MaxEndBytes: limit})
	small.Observe(&Decision{Mesh: "m", Source: tagEnd(1), Destination: workloadEnd("db"), Protocol: resource.TCP, Port: 80})
	small.Observe(&Decision{Mesh: "m", Source: workloadEnd("a"), Destination: workloadEnd("b"), Protocol: resource.TCP, Port: 80})
	if want := endBytes(endKey{a: "a"}, nil, workloadEnd("a").Tags) + endBytes(endKey{a: "b"}, nil, workloadEnd("b").Tags); small.EndBytes() != want {
		t.Errorf("after eviction %d bytes held, want %d (the two workload ends)", small.EndBytes(), want)
	}
}

func maxOf(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func TestBatchCountsIdentitiesWithTheTable(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	set := func(kv ...string) *inventory.TagSet {
		s, err := reg.Register("m", tagsEnd(kv...).Tags)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	web, db := set("app", "web"), set("app", "db")
	tab := New(Config{})
	for range 3 {
		b := tab.Batch("m", "", web.Identity())
		for range 1000 {
			b.Identities(web, db, resource.TCP, 5432, resource.Allow, "p", 7)
		}
		b.Identities(db, web, resource.UDP, 53, resource.Deny, "", 7)
		b.Done()
	}
	// The same flow decided one by one, named by identity.
	tab.Observe(&Decision{Mesh: "m", Source: End{Given: inventory.Endpoint{Identity: web.Identity()}, Tags: web.Tags(), Identity: web.Identity()},
		Destination: End{Given: inventory.Endpoint{Identity: db.Identity()}, Tags: db.Tags(), Identity: db.Identity()},
		Protocol:    resource.TCP, Port: 5432, Action: resource.Allow, Policy: "p", Revision: 7})
	got := flowsByKey(t, tab)
	if len(got) != 2 {
		t.Fatalf("%d flows, want 2: %v", len(got), got)
	}
	k := fmt.Sprintf("m/TrafficPermission identity:%d -> identity:%d TCP/5432", web.Identity(), db.Identity())
	if f := got[k]; f.Count != 3001 || f.Source.Tags["app"] != "web" || f.Policy != "p" {
		t.Fatalf("flow %s: %+v, want 3001 decisions by p, resolved to app=web", k, f)
	}
}

// TestBatchCollisionsReachTheTable fills a stripe's sets beyond their ways:
// every flow displaced is counted in the table, none lost.
func TestBatchCollisionsReachTheTable(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	var sets []*inventory.TagSet
	for i := range 200 {
		s, err := reg.Register("m", resource.Tags{"app": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, s)
	}
	tab := New(Config{})
	const rounds = 3
	for range rounds {
		b := tab.Batch("m", "", 0)
		for _, s := range sets {
			for _, d := range sets[:20] {
				b.Identities(s, d, resource.TCP, 80, resource.Allow, "p", 1)
			}
		}
		b.Done()
	}
	fl := tab.Flows(nil)
	if len(fl) != 200*20 {
		t.Fatalf("%d flows, want %d", len(fl), 200*20)
	}
	for _, f := range fl {
		if f.Count != rounds {
			t.Fatalf("flow %+v counted %d times, want %d", f, f.Count, rounds)
		}
	}
}

func TestConcurrentCountsAddUp(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	var sets []*inventory.TagSet
	for i := range 50 {
		s, err := reg.Register("m", resource.Tags{"app": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, s)
	}
	tab := New(Config{})
	const workers, rounds = 4, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				b := tab.Batch("m", "", uint64(r))
				for _, s := range sets {
					b.Identities(s, sets[w], resource.TCP, 80, resource.Allow, "", 1)
				}
				b.Done()
				tab.Observe(&Decision{Mesh: "m", Source: workloadEnd(fmt.Sprint("w", w)), Destination: workloadEnd("d"), Protocol: resource.TCP, Port: 80})
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			tab.Flows(nil)
		}
	})
	wg.Wait()
	var total uint64
	for _, f := range tab.Flows(nil) {
		total += f.Count
	}
	if want := uint64(workers * rounds * (len(sets) + 1)); total != want {
		t.Fatalf("%d decisions counted, want %d", total, want)
	}
}

// TestHeapPerFlow measures the table's heap per flow: 200,000 flows among
// 2,000 workloads (ends are shared, as a replica's are), at most 150 bytes
// each (docs/analysis.md).
func TestHeapPerFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 200k flows")
	}
	const flows, workloads = 200_000, 2_000
	ends := make([]End, workloads)
	for i := range ends {
		ends[i] = workloadEnd(fmt.Sprintf("w-%d", i), "app", fmt.Sprint(i%100))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tab := New(Config{Max: flows})
	d := Decision{Mesh: "m", Protocol: resource.TCP, Action: resource.Allow, Policy: "p", Revision: 1}
	for i := range flows {
		d.Source, d.Destination, d.Port = ends[i%workloads], ends[(i/workloads+i)%workloads], uint32(80+i/(workloads*workloads))
		tab.Observe(&d)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if tab.Len() != flows {
		t.Fatalf("%d flows held, want %d", tab.Len(), flows)
	}
	per := float64(after.HeapAlloc-before.HeapAlloc) / flows
	t.Logf("%.1f bytes per flow", per)
	if per > 150 {
		t.Errorf("%.1f bytes per flow, over 150", per)
	}
	runtime.KeepAlive(tab)
}

// TestSlotLayout holds the stripe's cache to whole cache lines: a slot is
// one line and every stripe starts on one, so a count touches one slot line.
func TestSlotLayout(t *testing.T) {
	if n := unsafe.Sizeof(slot{}); n != 64 {
		t.Fatalf("slot is %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(stripe{}); n%64 != 0 {
		t.Fatalf("stripe is %d bytes, not whole lines", n)
	}
	if off := unsafe.Offsetof(stripe{}.slots); off != 0 {
		t.Fatalf("slots at offset %d, want 0", off)
	}
}

// TestEntryKeepsCountAndAnswer: the count and the last answer's action
// share a word; each reads back as written.
func TestEntryKeepsCountAndAnswer(t *testing.T) {
	var f flowShard
	f.free, f.head, f.tail = -1, -1, -1
	f.add(1, flowKey{}, 3, 10, 10, resource.Deny, "p", 1)
	f.touch(1, 1<<40, 5, 20, resource.Allow, "q", 2)
	f.touch(1, 2, 7, 15, resource.Deny, "r", 3) // older: the answer stays
	e := f.at(0)
	if e.count() != 1<<40+5 || e.action() != resource.Allow || e.policy != "q" || e.rev != 2 || e.first != 5 || e.last != 20 {
		t.Fatalf("entry %+v: count %d, action %v", e, e.count(), e.action())
	}
}

// TestBatchKeepsTheLastAnswer counts one flow whose answer changes, past
// a slot's 32-bit count: the table has every decision and the last answer.
func TestBatchKeepsTheLastAnswer(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	web, _ := reg.Register("m", resource.Tags{"app": "web"})
	db, _ := reg.Register("m", resource.Tags{"app": "db"})
	tab := New(Config{})
	b := tab.Batch("m", "", 0)
	b.Identities(web, db, resource.TCP, 5432, resource.Allow, "allow-web", 1)
	for si := range b.s.slots {
		for w := range b.s.slots[si] {
			if sl := &b.s.slots[si][w]; sl.src == web {
				sl.count = math.MaxUint32 - 1
			}
		}
	}
	b.Identities(web, db, resource.TCP, 5432, resource.Allow, "allow-web", 2)
	b.Identities(web, db, resource.TCP, 5432, resource.Deny, "deny-"+strings.Repeat("x", 300), 3)
	b.Identities(web, db, resource.TCP, 5432, resource.Deny, "deny-db", 4)
	b.Done()
	fl := tab.Flows(nil)
	if len(fl) != 1 {
		t.Fatalf("%d flows, want 1: %+v", len(fl), fl)
	}
	f := fl[0]
	if want := uint64(math.MaxUint32) + 2; f.Count != want || f.Action != resource.Deny || f.Policy != "deny-db" || f.Revision != 4 {
		t.Fatalf("flow %+v: want %d decisions, last DENY by deny-db at 4", f, want)
	}
}

// TestIdentitiesNCountsAsIdentities counts one random stream of flows, with
// repeats and set collisions, through IdentitiesN into a table and one by
// one into another: the two tables hold the same flows.
func TestIdentitiesNCountsAsIdentities(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	var sets []*inventory.TagSet
	for i := range 300 {
		s, err := reg.Register("m", resource.Tags{"app": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, s)
	}
	policies := []string{"allow-a", "deny-b", "allow-c"}
	var c1, c2 clock
	one, many := New(Config{Now: c1.now}), New(Config{Now: c2.now})
	x := uint64(1)
	next := func(n int) int { x = x*6364136223846793005 + 1442695040888963407; return int(x>>33) % n }
	for range 40 {
		fs := make([]IdentityFlow, 1+next(1000))
		for i := range fs {
			fs[i] = IdentityFlow{Src: sets[next(len(sets))], Dst: sets[next(40)], PP: uint32(resource.TCP)<<16 | uint32(80+next(3)),
				Policy: uint32(next(len(policies)))}
			fs[i].Deny = fs[i].Policy == 1
		}
		b := one.Batch("m", "", 0)
		for _, f := range fs {
			proto, port := unpackPort(f.PP)
			action := resource.Allow
			if f.Deny {
				action = resource.Deny
			}
			b.Identities(f.Src, f.Dst, proto, port, action, policies[f.Policy], 7)
		}
		b.Done()
		b = many.Batch("m", "", 0)
		b.IdentitiesN(fs, policies, 7)
		b.Done()
	}
	key := func(f Flow) string {
		return fmt.Sprintf("%d>%d %d/%d", f.Source.Identity, f.Destination.Identity, f.Protocol, f.Port)
	}
	got, want := map[string]Flow{}, map[string]Flow{}
	for _, f := range many.Flows(nil) {
		got[key(f)] = f
	}
	for _, f := range one.Flows(nil) {
		want[key(f)] = f
	}
	if len(got) != len(want) || len(want) < 1000 {
		t.Fatalf("%d flows counted by IdentitiesN, %d by Identities", len(got), len(want))
	}
	for k, w := range want {
		g := got[k]
		if g.Count != w.Count || g.Policy != w.Policy || g.Action != w.Action || g.Revision != w.Revision {
			t.Fatalf("flow %s: IdentitiesN %+v, Identities %+v", k, g, w)
		}
	}
}

// Identities counts one decision of a flow between the tag sets src and dst
// as IdentitiesN counts each of its flows: the tests' way to count one.
func (b *Batch) Identities(src, dst *inventory.TagSet, proto resource.Protocol, port uint32, action resource.Action, policy string, rev int64) {
	pp := packPort(proto, port)
	si, fp := setOf(src, dst, pp)
	b.count(src, dst, pp, si, fp, action, policy, rev)
}

// TestFreedEndsCountAnew: a flow evicted with its ends, whose end ids other
// ends then take, is counted as a new flow when seen again — never into
// the flow that now holds the ids.
func TestFreedEndsCountAnew(t *testing.T) {
	t.Parallel()
	var c clock
	tab := New(Config{Max: 1, Now: c.now}) // one shard: each new flow evicts the last
	observe := func(src, dst End) {
		tab.Observe(&Decision{Mesh: "m", Source: src, Destination: dst, Protocol: resource.TCP, Port: 80})
	}
	a, b := workloadEnd("a", "app", "a"), workloadEnd("b", "app", "b")
	observe(a, b)
	observe(workloadEnd("c", "app", "c"), workloadEnd("d", "app", "d")) // a, b freed
	observe(workloadEnd("e", "app", "e"), workloadEnd("f", "app", "f")) // takes freed ids
	observe(b, a)
	fl := tab.Flows(nil)
	if len(fl) != 1 || fl[0].Count != 1 || fl[0].Source.Given.Workload != "b" || fl[0].Destination.Given.Workload != "a" {
		t.Fatalf("flows %+v: want b -> a once", fl)
	}
	if tab.Evicted() != 3 {
		t.Fatalf("%d evicted, want 3", tab.Evicted())
	}
}
