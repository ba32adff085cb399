package engine

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// pairFlows are flows between tag sets registered by identity; none is a
// workload's own set, so a workload change never changes what they resolve to.
var pairFlows = []struct {
	src, dst resource.Tags
	proto    resource.Protocol
	port     uint32
}{
	{resource.Tags{"app": "web", "team": "x"}, resource.Tags{"app": "db", "team": "y"}, resource.TCP, 5432},
	{resource.Tags{"app": "api"}, resource.Tags{"app": "db", "team": "y"}, resource.TCP, 5432},
	{resource.Tags{"app": "web", "team": "x"}, resource.Tags{"app": "web", "team": "x"}, resource.UDP, 53},
}

// decidePairs decides every pair flow through a PairScope of s and returns the
// identity-pair memo misses it caused, checking each answer against the
// decision procedure of s without any memo.
func decidePairs(t *testing.T, s *Snapshot, reg *inventory.Registry) (uint64, []Decision) {
	t.Helper()
	ids := make([][2]*inventory.TagSet, len(pairFlows))
	for i, f := range pairFlows { // registered first: a scope sees the registry as it was when made
		src, err := s.Identify("m", f.src, reg)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := s.Identify("m", f.dst, reg)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = [2]*inventory.TagSet{src, dst}
	}
	scope, err := s.PairScope("m", "", reg)
	if err != nil {
		t.Fatal(err)
	}
	before := s.pairMisses()
	out := make([]Decision, len(pairFlows))
	for i, f := range pairFlows {
		src, dst := ids[i][0], ids[i][1]
		var err error
		if src, err = scope.Lookup(src.Identity()); err != nil {
			t.Fatal(err)
		}
		if dst, err = scope.Lookup(dst.Identity()); err != nil {
			t.Fatal(err)
		}
		a, gotp, _ := scope.Answer(src, dst, f.proto, f.port)
		checkAnswer(t, scope, a, gotp)
		got := *gotp
		want, err := s.Decide(&Request{Mesh: "m", Source: f.src, Destination: f.dst, Protocol: f.proto, Port: f.port, NoCache: true})
		if err != nil {
			t.Fatal(err)
		}
		want.SourceResolution, want.DestinationResolution = inventory.EndpointResolution{}, inventory.EndpointResolution{} // the tag form's alone
		if !sameDecisionIgnoringRevision(got, want) {
			t.Errorf("flow %d at revision %d: the pair memo answered %+v, the decision procedure %+v", i, s.Revision(), got, want)
		}
		out[i] = got
	}
	return s.pairMisses() - before, out
}

// TestPairMemoSurvivesUnrelatedChanges: the identity-pair memo of a (mesh,
// type) is kept by the changes that cannot alter its answers and dropped by
// those that can — the tag memo's rules (TestMemoSurvivesUnrelatedChanges) —
// and what it answers after the change is what the decision procedure answers
// then. Hits are counted (misses), never timed.
func TestPairMemoSurvivesUnrelatedChanges(t *testing.T) {
	t.Parallel()
	for _, tc := range memoChanges(resource.Deny) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, reg := memoWorld(t), inventory.NewRegistry(0, 0)
			decidePairs(t, s, reg)
			decidePairs(t, s, reg) // seen twice: stored
			if miss, _ := decidePairs(t, s, reg); miss != 0 {
				t.Fatalf("warm pair memo: %d misses", miss)
			}
			next := s.Apply(2, []Change{tc.change})
			miss, _ := decidePairs(t, next, reg) // compared with the decision procedure
			if tc.kept && miss != 0 {
				t.Errorf("%d of %d flows missed the pair memo after %s", miss, len(pairFlows), tc.name)
			}
			if !tc.kept && miss != uint64(len(pairFlows)) {
				t.Errorf("%d of %d flows missed the pair memo after %s: want all", miss, len(pairFlows), tc.name)
			}
		})
	}
}

// TestPairMemoNeverServesStale: a change that alters an answer is seen by
// the next snapshot's compact path at once, and undoing it as well, however
// warm the pair memo was.
func TestPairMemoNeverServesStale(t *testing.T) {
	t.Parallel()
	s, reg := memoWorld(t), inventory.NewRegistry(0, 0)
	web, _ := s.Identify("m", resource.Tags{"app": "web", "team": "x"}, reg)
	db, _ := s.Identify("m", resource.Tags{"app": "db", "team": "y"}, reg)
	decide := func(s *Snapshot) Decision {
		t.Helper()
		scope, err := s.PairScope("m", "", reg)
		if err != nil {
			t.Fatal(err)
		}
		var d Decision
		for i := 0; i < 3; i++ { // warm: stored on the second sight, a pair hit on the third
			dp, _ := scope.Decide(web, db, resource.TCP, 5432)
			d = *dp
		}
		return d
	}
	if d := decide(s); d.Action != resource.Allow || d.Policy != "web-to-db" {
		t.Fatalf("before: %+v, want ALLOW by web-to-db", d)
	}
	deny := s.Apply(2, []Change{Put(&resource.Policy{Mesh: "m", Name: "deny-web", Type: resource.DefaultType, Action: resource.Deny, Priority: -10,
		Sources: []resource.Selector{{Match: map[string]string{"app": "web"}}}, Destinations: []resource.Selector{{Match: map[string]string{"app": "db"}}}})})
	if d, _ := deny.Decide(&Request{Mesh: "m", Source: web.Tags(), Destination: db.Tags(), Protocol: resource.TCP, Port: 5432, NoCache: true}); d.Policy != "deny-web" {
		t.Fatalf("the decision procedure answers %+v after the deny policy: the test's premise is wrong", d)
	}
	if d := decide(deny); d.Action != resource.Deny || d.Policy != "deny-web" {
		t.Errorf("after a deny policy: %+v, want DENY by deny-web", d)
	}
	back := deny.Apply(3, []Change{Delete(resource.Key{Kind: resource.KindPolicy, Mesh: "m", Type: resource.DefaultType, Name: "deny-web"})})
	if d := decide(back); d.Action != resource.Allow || d.Policy != "web-to-db" {
		t.Errorf("after the deny policy's delete: %+v, want ALLOW by web-to-db", d)
	}
	if d := decide(s); d.Action != resource.Allow || d.Policy != "web-to-db" {
		t.Errorf("the first snapshot again: %+v, want ALLOW by web-to-db", d)
	}
}

// TestPairMemoVerifiesTagSets: an identity that resolves to another tag set
// (two registries disagreeing on one identity, as a collision would) is never
// answered from the pair memo entry of the first.
func TestPairMemoVerifiesTagSets(t *testing.T) {
	t.Parallel()
	s := memoWorld(t)
	s = s.Apply(2, []Change{Put(&resource.Policy{Mesh: "m", Name: "deny-api", Type: resource.DefaultType, Action: resource.Deny, Priority: 10,
		Sources: []resource.Selector{{Match: map[string]string{"app": "api"}}}, Destinations: []resource.Selector{{}}})})
	byApp := func(tags resource.Tags) uint64 {
		if tags["app"] == "db" {
			return 7
		}
		return 42
	}
	regs := [2]*inventory.Registry{inventory.NewRegistry(0, 0), inventory.NewRegistry(0, 0)}
	for i, app := range []string{"web", "api"} {
		regs[i].Identity = func(_ string, tags resource.Tags) uint64 { return byApp(tags) }
		if _, err := s.Identify("m", resource.Tags{"app": app}, regs[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Identify("m", resource.Tags{"app": "db"}, regs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for round := 0; round < 3; round++ {
		for i, want := range []string{"web-to-db", "deny-api"} {
			scope, err := s.PairScope("m", "", regs[i])
			if err != nil {
				t.Fatal(err)
			}
			src, err := scope.Lookup(42)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := scope.Lookup(7)
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := scope.Decide(src, dst, resource.TCP, 5432); d.Policy != want {
				t.Errorf("round %d, identity 42 as %v: decided by %q, want %q", round, src.Tags(), d.Policy, want)
			}
		}
	}
}

// byIDs answers every pair flow through DecideIDs of a new scope of s: the
// answers, and how many flows it answered (the rest need the full path).
func byIDs(t *testing.T, s *Snapshot, reg *inventory.Registry) (int, []*Decision) {
	t.Helper()
	scope, err := s.PairScope("m", "", reg)
	if err != nil {
		t.Fatal(err)
	}
	n, out := 0, make([]*Decision, len(pairFlows))
	var srcs, dsts []uint64
	var pps []uint32
	for _, f := range pairFlows {
		srcs, dsts, pps = append(srcs, resource.Identity("m", f.src)), append(dsts, resource.Identity("m", f.dst)), append(pps, f.port|uint32(f.proto)<<16)
	}
	ents := make([]*PairEntry, 2*len(pairFlows))
	scope.DecideIDsN(srcs, dsts, pps, ents)
	for i, f := range pairFlows {
		src, dst := resource.Identity("m", f.src), resource.Identity("m", f.dst)
		a, pe, ok := scope.DecideIDs(src, dst, f.proto, f.port)
		if ents[i] != pe {
			t.Fatalf("flow %d: DecideIDsN gave entry %p, DecideIDs %p", i, ents[i], pe)
		}
		if !ok {
			continue
		}
		if pe.Answer() != a {
			t.Fatalf("flow %d: the entry's answer %#x, DecideIDs %#x", i, uint64(pe.Answer()), uint64(a))
		}
		if srcSet, dstSet := pe.Sets(); srcSet.Identity() != src || dstSet.Identity() != dst {
			t.Fatalf("flow %d: DecideIDs gave the sets of %d and %d", i, srcSet.Identity(), dstSet.Identity())
		}
		d := pe.Decision()
		checkAnswer(t, scope, a, d)
		n, out[i] = n+1, d
	}
	return n, out
}

// TestPairMemoByIdentities: a flow the pair memo holds is answered by its
// identities alone while they resolve as when its entry was verified — kept
// by workload churn that changes no identity — and not after a change that
// may alter a resolution (a registry change, an identity entering or leaving
// the inventory), until the full path has verified the entry again.
func TestPairMemoByIdentities(t *testing.T) {
	t.Parallel()
	s, reg := memoWorld(t), inventory.NewRegistry(0, 0)
	if n, _ := byIDs(t, s, reg); n != 0 {
		t.Fatalf("a cold memo answered %d flows by identities", n)
	}
	decidePairs(t, s, reg)
	_, want := decidePairs(t, s, reg) // seen twice: stored
	n, got := byIDs(t, s, reg)
	if n != len(pairFlows) {
		t.Fatalf("warm: %d of %d flows answered by identities", n, len(pairFlows))
	}
	for i := range got {
		if !sameDecisionIgnoringRevision(*got[i], want[i]) {
			t.Errorf("flow %d: by identities %+v, by tag sets %+v", i, *got[i], want[i])
		}
	}

	steps := []struct {
		name string
		do   func() *Snapshot // the snapshot after the step
		kept bool
	}{
		{"a workload put that keeps its tags", func() *Snapshot {
			return s.Apply(2, []Change{Put(&resource.Workload{Mesh: "m", Name: "web-1", Tags: resource.Tags{"app": "web"}, Addresses: []string{"10.0.0.9"}})})
		}, true},
		{"a workload with a new identity", func() *Snapshot {
			return s.Apply(3, []Change{Put(&resource.Workload{Mesh: "m", Name: "db-1", Tags: resource.Tags{"app": "db"}})})
		}, false},
		{"a workload whose identity leaves the inventory", func() *Snapshot {
			return s.Apply(4, []Change{Delete(resource.Key{Kind: resource.KindWorkload, Mesh: "m", Name: "web-1"})})
		}, false},
		{"a set registered", func() *Snapshot {
			if _, err := s.Identify("m", resource.Tags{"app": "new"}, reg); err != nil {
				t.Fatal(err)
			}
			return s
		}, false},
	}
	for _, st := range steps {
		s = st.do()
		if n, _ := byIDs(t, s, reg); (n == len(pairFlows)) != st.kept || (!st.kept && n != 0) {
			t.Fatalf("after %s: %d of %d flows answered by identities, want %s", st.name, n, len(pairFlows),
				map[bool]string{true: "all", false: "none"}[st.kept])
		}
		decidePairs(t, s, reg) // the full path verifies the entries again
		if n, _ := byIDs(t, s, reg); n != len(pairFlows) {
			t.Fatalf("after %s and the full path: %d of %d flows answered by identities", st.name, n, len(pairFlows))
		}
	}
}

// TestPairMemoByIdentitiesSeesEviction: a set evicted from the registry is
// not answered by a flow's identities: the full path finds it gone.
func TestPairMemoByIdentitiesSeesEviction(t *testing.T) {
	t.Parallel()
	s, reg := memoWorld(t), inventory.NewRegistry(3, 0) // pairFlows' three sets fill it
	decidePairs(t, s, reg)
	decidePairs(t, s, reg)
	if n, _ := byIDs(t, s, reg); n != len(pairFlows) {
		t.Fatalf("warm: %d of %d flows answered by identities", n, len(pairFlows))
	}
	for i := range 3 { // evicts every one of them (their marks first, then them)
		if _, err := s.Identify("m", resource.Tags{"app": fmt.Sprint("filler", i)}, reg); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := byIDs(t, s, reg); n != 0 {
		t.Fatalf("after the eviction: %d flows answered by identities", n)
	}
	scope, err := s.PairScope("m", "", reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := scope.Lookup(resource.Identity("m", pairFlows[0].src)); !errors.Is(err, inventory.ErrIdentityNotFound) {
		t.Fatalf("an evicted set: %v, want ErrIdentityNotFound", err)
	}
}

// checkAnswer fails unless a packs d: its action, its audit bits, and a
// policy number that scope's numbering names as d's policy.
func checkAnswer(t *testing.T, scope *PairScope, a PairAnswer, d *Decision) {
	t.Helper()
	if a.Deny() != (d.Action == resource.Deny) || a.AuditDiffers() != (d.Audit != nil) || (d.Audit != nil && a.AuditDeny() != (d.Audit.Action == resource.Deny)) {
		t.Errorf("answer %#x packs another decision than %+v", uint64(a), d)
	}
	if got := scope.Policies().Name(a.Policy()); got != d.Policy {
		t.Errorf("answer %#x: policy number %d names %q, the decision is by %q", uint64(a), a.Policy(), got, d.Policy)
	}
}

// TestPairAnswerPolicyNumbers: within a scope's numbering a policy has one
// number and a number one policy, whether the answer came from the pair memo,
// the tag memo or the decision procedure; a change that keeps the partition's
// answers keeps the numbering, and one that renames the deciding policy gives
// the next scopes a new numbering that names the new policy — the old
// numbers are never read against the new names.
func TestPairAnswerPolicyNumbers(t *testing.T) {
	t.Parallel()
	s, reg := memoWorld(t), inventory.NewRegistry(0, 0)
	s = s.Apply(2, []Change{Put(&resource.Policy{Mesh: "m", Name: "deny-api", Type: resource.DefaultType, Action: resource.Deny, Priority: 10,
		Sources: []resource.Selector{{Match: map[string]string{"app": "api"}}}, Destinations: []resource.Selector{{}}})})
	// numbers decides every pair flow three times (a miss, stored, a pair
	// hit) and returns the policy's number by name, checking that no number
	// names two policies.
	numbers := func(s *Snapshot) (*PolicyNumbers, map[string]uint32) {
		t.Helper()
		decidePairs(t, s, reg)
		decidePairs(t, s, reg)
		decidePairs(t, s, reg)
		scope, err := s.PairScope("m", "", reg)
		if err != nil {
			t.Fatal(err)
		}
		byName, byNumber := map[string]uint32{}, map[uint32]string{}
		for _, f := range pairFlows {
			a, pe, ok := scope.DecideIDs(resource.Identity("m", f.src), resource.Identity("m", f.dst), f.proto, f.port)
			if !ok {
				t.Fatalf("flow %v → %v not answered by identities when warm", f.src, f.dst)
			}
			p := pe.Decision().Policy
			checkAnswer(t, scope, a, pe.Decision())
			if n, ok := byName[p]; ok && n != a.Policy() {
				t.Errorf("policy %q numbered %d and %d", p, n, a.Policy())
			}
			if q, ok := byNumber[a.Policy()]; ok && q != p {
				t.Errorf("number %d names %q and %q", a.Policy(), q, p)
			}
			byName[p], byNumber[a.Policy()] = a.Policy(), p
		}
		return scope.Policies(), byName
	}
	pn, before := numbers(s)
	if len(before) != 3 || before[""] != 0 {
		t.Fatalf("the flows are decided by %v: want web-to-db, deny-api and no policy (0)", before)
	}

	kept := s.Apply(3, []Change{Put(&resource.Workload{Mesh: "m", Name: "db-1", Tags: resource.Tags{"app": "db"}, Addresses: []string{"10.0.0.2"}})})
	if pn2, after := numbers(kept); pn2 != pn || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("after a workload put: numbering %p %v, was %p %v", pn2, after, pn, before)
	}

	renamed := kept.Apply(4, []Change{
		Delete(resource.Key{Kind: resource.KindPolicy, Mesh: "m", Type: resource.DefaultType, Name: "web-to-db"}),
		Put(&resource.Policy{Mesh: "m", Name: "web-to-db-2", Type: resource.DefaultType, Action: resource.Allow,
			Sources: []resource.Selector{{Match: map[string]string{"app": "web"}}}, Destinations: []resource.Selector{{Match: map[string]string{"app": "db"}}}}),
	})
	pn3, after := numbers(renamed)
	if pn3 == pn {
		t.Fatal("a renamed deciding policy kept the numbering")
	}
	if _, ok := after["web-to-db"]; ok || len(after) != 3 {
		t.Errorf("after the rename the flows are decided by %v: want web-to-db-2, deny-api and no policy", after)
	}
	if got := pn.Name(before["web-to-db"]); got != "web-to-db" {
		t.Errorf("the old numbering's number %d now names %q", before["web-to-db"], got)
	}
}

// TestPolicyNumbersConcurrent: numbers given out concurrently are dense and
// distinct, and each names the policy it was given for.
func TestPolicyNumbersConcurrent(t *testing.T) {
	t.Parallel()
	var pn PolicyNumbers
	const names, workers = 200, 4
	got := make([][names]uint32, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				j := (i*7 + w*31) % names // each worker in another order
				got[w][j] = pn.Number(fmt.Sprint("p", j))
			}
		}()
	}
	wg.Wait()
	seen := map[uint32]bool{}
	for j := range names {
		n := got[0][j]
		for w := 1; w < workers; w++ {
			if got[w][j] != n {
				t.Fatalf("policy p%d numbered %d and %d", j, n, got[w][j])
			}
		}
		if n == 0 || n > names || seen[n] {
			t.Fatalf("policy p%d numbered %d: not dense from 1 or given twice", j, n)
		}
		seen[n] = true
		if pn.Name(n) != fmt.Sprint("p", j) {
			t.Fatalf("number %d names %q, given for p%d", n, pn.Name(n), j)
		}
	}
	if pn.Number("") != 0 || pn.Name(0) != "" {
		t.Fatal("no policy is not number 0")
	}
}
