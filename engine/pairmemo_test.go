package engine

import (
	"errors"
	"fmt"
	"testing"
)

// pairFlows are flows between tag sets registered by identity; none is a
// workload's own set, so a workload change never changes what they resolve to.
var pairFlows = []struct {
	src, dst Tags
	proto    Protocol
	port     uint32
}{
	{Tags{"app": "web", "team": "x"}, Tags{"app": "db", "team": "y"}, TCP, 5432},
	{Tags{"app": "api"}, Tags{"app": "db", "team": "y"}, TCP, 5432},
	{Tags{"app": "web", "team": "x"}, Tags{"app": "web", "team": "x"}, UDP, 53},
}

// decidePairs decides every pair flow through a PairScope of s and returns the
// identity-pair memo misses it caused, checking each answer against the
// decision procedure of s without any memo.
func decidePairs(t *testing.T, s *Snapshot, reg *Registry) (uint64, []Decision) {
	t.Helper()
	ids := make([][2]*TagSet, len(pairFlows))
	for i, f := range pairFlows { // registered first: a scope sees the registry as it was when made
		src, err := s.Identify("m", f.src, reg)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := s.Identify("m", f.dst, reg)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = [2]*TagSet{src, dst}
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
		gotp, _ := scope.Decide(src, dst, f.proto, f.port)
		got := *gotp
		want, err := s.Decide(&Request{Mesh: "m", Source: f.src, Destination: f.dst, Protocol: f.proto, Port: f.port, NoCache: true})
		if err != nil {
			t.Fatal(err)
		}
		want.SourceResolution, want.DestinationResolution = EndpointResolution{}, EndpointResolution{} // the tag form's alone
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
	for _, tc := range memoChanges(Deny) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, reg := memoWorld(t), NewRegistry(0, 0)
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
	s, reg := memoWorld(t), NewRegistry(0, 0)
	web, _ := s.Identify("m", Tags{"app": "web", "team": "x"}, reg)
	db, _ := s.Identify("m", Tags{"app": "db", "team": "y"}, reg)
	decide := func(s *Snapshot) Decision {
		t.Helper()
		scope, err := s.PairScope("m", "", reg)
		if err != nil {
			t.Fatal(err)
		}
		var d Decision
		for i := 0; i < 3; i++ { // warm: stored on the second sight, a pair hit on the third
			dp, _ := scope.Decide(web, db, TCP, 5432)
			d = *dp
		}
		return d
	}
	if d := decide(s); d.Action != Allow || d.Policy != "web-to-db" {
		t.Fatalf("before: %+v, want ALLOW by web-to-db", d)
	}
	deny := s.Apply(2, []Change{Put(&Policy{Mesh: "m", Name: "deny-web", Type: DefaultType, Action: Deny, Priority: -10,
		Sources: []Selector{{Match: map[string]string{"app": "web"}}}, Destinations: []Selector{{Match: map[string]string{"app": "db"}}}})})
	if d, _ := deny.Decide(&Request{Mesh: "m", Source: web.Tags(), Destination: db.Tags(), Protocol: TCP, Port: 5432, NoCache: true}); d.Policy != "deny-web" {
		t.Fatalf("the decision procedure answers %+v after the deny policy: the test's premise is wrong", d)
	}
	if d := decide(deny); d.Action != Deny || d.Policy != "deny-web" {
		t.Errorf("after a deny policy: %+v, want DENY by deny-web", d)
	}
	back := deny.Apply(3, []Change{Delete(Key{Kind: KindPolicy, Mesh: "m", Type: DefaultType, Name: "deny-web"})})
	if d := decide(back); d.Action != Allow || d.Policy != "web-to-db" {
		t.Errorf("after the deny policy's delete: %+v, want ALLOW by web-to-db", d)
	}
	if d := decide(s); d.Action != Allow || d.Policy != "web-to-db" {
		t.Errorf("the first snapshot again: %+v, want ALLOW by web-to-db", d)
	}
}

// TestPairMemoVerifiesTagSets: an identity that resolves to another tag set
// (two registries disagreeing on one identity, as a collision would) is never
// answered from the pair memo entry of the first.
func TestPairMemoVerifiesTagSets(t *testing.T) {
	t.Parallel()
	s := memoWorld(t)
	s = s.Apply(2, []Change{Put(&Policy{Mesh: "m", Name: "deny-api", Type: DefaultType, Action: Deny, Priority: 10,
		Sources: []Selector{{Match: map[string]string{"app": "api"}}}, Destinations: []Selector{{}}})})
	byApp := func(tags Tags) uint64 {
		if tags["app"] == "db" {
			return 7
		}
		return 42
	}
	regs := [2]*Registry{NewRegistry(0, 0), NewRegistry(0, 0)}
	for i, app := range []string{"web", "api"} {
		regs[i].identity = func(_ string, tags Tags) uint64 { return byApp(tags) }
		if _, err := s.Identify("m", Tags{"app": app}, regs[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Identify("m", Tags{"app": "db"}, regs[i]); err != nil {
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
			if d, _ := scope.Decide(src, dst, TCP, 5432); d.Policy != want {
				t.Errorf("round %d, identity 42 as %v: decided by %q, want %q", round, src.Tags(), d.Policy, want)
			}
		}
	}
}

// byIDs answers every pair flow through DecideIDs of a new scope of s: the
// answers, and how many flows it answered (the rest need the full path).
func byIDs(t *testing.T, s *Snapshot, reg *Registry) (int, []*Decision) {
	t.Helper()
	scope, err := s.PairScope("m", "", reg)
	if err != nil {
		t.Fatal(err)
	}
	n, out := 0, make([]*Decision, len(pairFlows))
	for i, f := range pairFlows {
		src, dst := Identity("m", f.src), Identity("m", f.dst)
		d, srcSet, dstSet, ok := scope.DecideIDs(src, dst, f.proto, f.port)
		if !ok {
			continue
		}
		if srcSet.Identity() != src || dstSet.Identity() != dst {
			t.Fatalf("flow %d: DecideIDs gave the sets of %d and %d", i, srcSet.Identity(), dstSet.Identity())
		}
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
	s, reg := memoWorld(t), NewRegistry(0, 0)
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
			return s.Apply(2, []Change{Put(&Workload{Mesh: "m", Name: "web-1", Tags: Tags{"app": "web"}, Addresses: []string{"10.0.0.9"}})})
		}, true},
		{"a workload with a new identity", func() *Snapshot {
			return s.Apply(3, []Change{Put(&Workload{Mesh: "m", Name: "db-1", Tags: Tags{"app": "db"}})})
		}, false},
		{"a workload whose identity leaves the inventory", func() *Snapshot {
			return s.Apply(4, []Change{Delete(Key{Kind: KindWorkload, Mesh: "m", Name: "web-1"})})
		}, false},
		{"a set registered", func() *Snapshot {
			if _, err := s.Identify("m", Tags{"app": "new"}, reg); err != nil {
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
	s, reg := memoWorld(t), NewRegistry(3, 0) // pairFlows' three sets fill it
	decidePairs(t, s, reg)
	decidePairs(t, s, reg)
	if n, _ := byIDs(t, s, reg); n != len(pairFlows) {
		t.Fatalf("warm: %d of %d flows answered by identities", n, len(pairFlows))
	}
	for i := range 3 { // evicts every one of them (their marks first, then them)
		if _, err := s.Identify("m", Tags{"app": fmt.Sprint("filler", i)}, reg); err != nil {
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
	if _, err := scope.Lookup(Identity("m", pairFlows[0].src)); !errors.Is(err, ErrIdentityNotFound) {
		t.Fatalf("an evicted set: %v, want ErrIdentityNotFound", err)
	}
}
