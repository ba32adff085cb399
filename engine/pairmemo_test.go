package engine

import (
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
