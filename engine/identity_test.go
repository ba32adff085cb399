package engine

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

func memoWorld(t *testing.T) *Snapshot {
	t.Helper()
	return Build(1, []Resource{
		&Policy{Mesh: "m", Name: "web-to-db", Type: DefaultType, Action: Allow,
			Sources: []Selector{{Match: map[string]string{"app": "web"}}}, Destinations: []Selector{{Match: map[string]string{"app": "db"}}}},
		&Policy{Mesh: "m", Name: "deny-ext", Type: DefaultType, Action: Deny, Priority: -1,
			Sources:      []Selector{{Expressions: []Expression{{Key: "ip", Operator: OpCIDR, Values: []string{"192.168.0.0/16"}}}}},
			Destinations: []Selector{{}}},
		&Policy{Mesh: "m", Name: "log", Type: "TrafficLog", Sources: []Selector{{}}, Destinations: []Selector{{}}},
		&Workload{Mesh: "m", Name: "web-1", Tags: Tags{"app": "web"}, Addresses: []string{"10.0.0.1"}},
		&Workload{Mesh: "other", Name: "x", Tags: Tags{"app": "x"}},
	})
}

var memoFlows = []Request{
	{Mesh: "m", Source: Tags{"app": "web"}, Destination: Tags{"app": "db"}, Protocol: TCP, Port: 5432},
	{Mesh: "m", Source: Tags{"app": "web", "ip": "192.168.1.1"}, Destination: Tags{"app": "db"}, Protocol: TCP, Port: 5432},
	{Mesh: "m", Source: Tags{"app": "api"}, Destination: Tags{"app": "db"}},
}

// decideAll decides every flow and returns the memo misses it caused.
func decideAll(t *testing.T, s *Snapshot) (uint64, []Decision) {
	t.Helper()
	before := s.memoMisses()
	out := make([]Decision, len(memoFlows))
	for i := range memoFlows {
		d, err := s.Decide(&memoFlows[i])
		if err != nil {
			t.Fatal(err)
		}
		if d.Revision != s.Revision() {
			t.Fatalf("answer names revision %d, the snapshot is at %d", d.Revision, s.Revision())
		}
		out[i] = d
	}
	return s.memoMisses() - before, out
}

// TestMemoSurvivesUnrelatedChanges: the memo of a (mesh, type) is kept by the
// changes that cannot alter its answers, and dropped by those that can. Hits
// are counted (memo misses), never timed.
func TestMemoSurvivesUnrelatedChanges(t *testing.T) {
	t.Parallel()
	for _, tc := range memoChanges(Allow) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := memoWorld(t)
			decideAll(t, s)
			decideAll(t, s) // seen twice: stored
			if miss, _ := decideAll(t, s); miss != 0 {
				t.Fatalf("warm memo: %d misses", miss)
			}
			next := s.Apply(2, []Change{tc.change})
			miss, got := decideAll(t, next)
			if tc.kept && miss != 0 {
				t.Errorf("%d of %d flows missed the memo after %s", miss, len(memoFlows), tc.name)
			}
			if !tc.kept && miss != uint64(len(memoFlows)) {
				t.Errorf("%d of %d flows missed the memo after %s: want all", miss, len(memoFlows), tc.name)
			}
			for i := range memoFlows {
				r := memoFlows[i]
				r.NoCache = true
				want, _ := next.Decide(&r)
				if !sameDecisionIgnoringRevision(got[i], want) {
					t.Errorf("flow %d: memo %+v, decided %+v", i, got[i], want)
				}
			}
		})
	}
}

func sameDecisionIgnoringRevision(a, b Decision) bool {
	a.Revision, b.Revision = 0, 0
	return reflect.DeepEqual(a, b)
}

// TestMemoKeepsReservedKeysApart: two flows whose source tags differ only in
// ip (which identities leave out and CIDR selectors read) never share an
// answer, in either order.
func TestMemoKeepsReservedKeysApart(t *testing.T) {
	t.Parallel()
	s := memoWorld(t)
	reg := NewRegistry(0, 0)
	web, err := s.Identify("m", Tags{"app": "web", "ip": "192.168.1.1"}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := web.Tags()["ip"]; ok {
		t.Fatal("an identity's tag set holds ip")
	}
	db, err := reg.Register("m", Tags{"app": "db"})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ {
		withIP, _ := s.Decide(&memoFlows[1]) // denied: 192.168.0.0/16
		bySet, err := s.DecideSets(&SetRequest{Mesh: "m", Source: web, Destination: db, Protocol: TCP, Port: 5432})
		if err != nil {
			t.Fatal(err)
		}
		if withIP.Action != Deny || bySet.Action != Allow {
			t.Fatalf("round %d: with ip %v (want DENY), by identity %v (want ALLOW)", round, withIP.Action, bySet.Action)
		}
	}
}

func TestRegistryBounds(t *testing.T) {
	t.Parallel()
	t.Run("count", func(t *testing.T) {
		r := NewRegistry(4, 1<<20)
		var sets []*TagSet
		for i := 0; i < 4; i++ {
			s, err := r.Register("m", Tags{"i": fmt.Sprint(i)})
			if err != nil {
				t.Fatal(err)
			}
			sets = append(sets, s)
		}
		// 0 and 2 are in use; 1 and 3 are not: the next two evict 1 and 3.
		r.Lookup("m", sets[0].Identity())
		r.Lookup("m", sets[2].Identity())
		for i := 4; i < 6; i++ {
			if _, err := r.Register("m", Tags{"i": fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
		}
		st := r.Stats()
		if st.Sets != 4 || st.Evicted != 2 {
			t.Fatalf("stats %+v, want 4 sets, 2 evicted", st)
		}
		for i, want := range []bool{true, false, true, false} {
			if _, ok := r.Lookup("m", sets[i].Identity()); ok != want {
				t.Errorf("set %d present %v, want %v", i, ok, want)
			}
		}
	})
	t.Run("bytes", func(t *testing.T) {
		one := setBytes(Tags{"k": "0000"})
		r := NewRegistry(1000, 3*one)
		for i := 0; i < 10; i++ {
			if _, err := r.Register("m", Tags{"k": fmt.Sprintf("%04d", i)}); err != nil {
				t.Fatal(err)
			}
			if st := r.Stats(); st.Bytes > 3*one || st.Sets > 3 {
				t.Fatalf("after %d: %+v over the bound of %d bytes", i, st, 3*one)
			}
		}
		big := Tags{"k": string(make([]byte, 4*one))}
		if _, err := r.Register("m", big); !errors.Is(err, ErrRegistryFull) {
			t.Errorf("a set over the byte bound: %v, want ErrRegistryFull", err)
		}
	})
	t.Run("meshes apart", func(t *testing.T) {
		r := NewRegistry(0, 0)
		s, _ := r.Register("a", Tags{"app": "web"})
		if _, ok := r.Lookup("b", s.Identity()); ok {
			t.Error("an identity of mesh a answered in mesh b")
		}
		if s.Identity() != Identity("a", Tags{"app": "web"}) {
			t.Error("the registered identity is not the documented encoding's")
		}
	})
}

// TestIdentityCollisionRefused: a second tag set with an identity already held
// is refused, in the registry and against the inventory, and an identity the
// two know with different sets is not answered. SHA-256 collisions cannot be
// found, so the test makes identities collide through the registry's hook.
func TestIdentityCollisionRefused(t *testing.T) {
	t.Parallel()
	s := memoWorld(t) // web-1 holds {app: web}
	reg := NewRegistry(0, 0)
	webID := Identity("m", Tags{"app": "web"})
	reg.identity = func(string, Tags) uint64 { return webID } // every set collides with web-1's
	if _, err := s.Identify("m", Tags{"app": "api"}, reg); !errors.Is(err, ErrIdentityCollision) {
		t.Fatalf("a set colliding with a workload's: %v, want ErrIdentityCollision", err)
	}
	if got, err := s.LookupIdentity("m", webID, reg); err != nil || got.Tags()["app"] != "web" {
		t.Fatalf("the workload's identity after a refused collision: %v %v", got, err)
	}
	// The registry alone: first come, first served; the second refused.
	reg2 := NewRegistry(0, 0)
	reg2.identity = func(string, Tags) uint64 { return 42 }
	if _, err := reg2.Register("m", Tags{"app": "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg2.Register("m", Tags{"app": "b"}); !errors.Is(err, ErrIdentityCollision) {
		t.Fatalf("a second set under one identity: %v, want ErrIdentityCollision", err)
	}
	if got, _ := reg2.Lookup("m", 42); got.Tags()["app"] != "a" {
		t.Fatalf("the first set was replaced: %v", got.Tags())
	}
	// Registered first, then a workload arrives with another set under the
	// same identity: never answered.
	reg3 := NewRegistry(0, 0)
	reg3.identity = func(string, Tags) uint64 { return webID }
	empty := Build(1, []Resource{&Policy{Mesh: "m", Name: "p", Type: DefaultType, Sources: []Selector{{}}, Destinations: []Selector{{}}}})
	if _, err := empty.Identify("m", Tags{"app": "api"}, reg3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupIdentity("m", webID, reg3); !errors.Is(err, ErrIdentityCollision) {
		t.Fatalf("an identity known with two sets: %v, want ErrIdentityCollision", err)
	}
	if name, _ := CodeName(ErrIdentityCollision); name != "FailedPrecondition" {
		t.Errorf("code %q", name)
	}
}

func TestLookupIdentity(t *testing.T) {
	t.Parallel()
	s := memoWorld(t)
	reg := NewRegistry(0, 0)
	if _, err := s.LookupIdentity("m", Identity("m", Tags{"app": "web"}), reg); err != nil {
		t.Errorf("a workload's own tag set: %v", err)
	}
	if _, err := s.LookupIdentity("m", Identity("m", Tags{"app": "api"}), reg); !errors.Is(err, ErrIdentityNotFound) {
		t.Errorf("an identity nobody registered: %v", err)
	}
	if _, err := s.Identify("m", Tags{"app": "api"}, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupIdentity("m", Identity("m", Tags{"app": "api"}), reg); err != nil {
		t.Errorf("a registered identity: %v", err)
	}
	if _, err := s.LookupIdentity("nope", 1, reg); !errors.Is(err, ErrMeshNotFound) {
		t.Errorf("an unknown mesh: %v", err)
	}
}

// memoChange is a change and whether a (mesh, type)'s memo survives it.
type memoChange struct {
	name   string
	change Change
	kept   bool
}

// memoChanges lists the changes the memo tests apply to memoWorld: those that
// cannot alter the answers of mesh m's TrafficPermission (kept) and those that
// can; the mesh document is put with meshDefault.
func memoChanges(meshDefault Action) []memoChange {
	return []memoChange{
		{"a workload put", Put(&Workload{Mesh: "m", Name: "db-1", Tags: Tags{"app": "db"}, Addresses: []string{"10.0.0.2"}}), true},
		{"a workload put that changes a tag set", Put(&Workload{Mesh: "m", Name: "web-1", Tags: Tags{"app": "web", "v": "2"}}), true},
		{"a workload delete", Delete(Key{Kind: KindWorkload, Mesh: "m", Name: "web-1"}), true},
		{"a policy of another type", Put(&Policy{Mesh: "m", Name: "log2", Type: "TrafficLog", Sources: []Selector{{}}, Destinations: []Selector{{}}}), true},
		{"another mesh's policy", Put(&Policy{Mesh: "other", Name: "p", Type: DefaultType, Sources: []Selector{{}}, Destinations: []Selector{{}}}), true},
		{"a policy of the type", Put(&Policy{Mesh: "m", Name: "deny-api", Type: DefaultType, Action: Deny,
			Sources: []Selector{{Match: map[string]string{"app": "api"}}}, Destinations: []Selector{{}}}), false},
		{"a policy of the type deleted", Delete(Key{Kind: KindPolicy, Mesh: "m", Type: DefaultType, Name: "web-to-db"}), false},
		{"the mesh document", Put(&Mesh{Name: "m", DefaultAction: meshDefault}), false},
		{"a scope", Put(&Scope{Mesh: "m", Name: "s", Selectors: []Selector{{}}, Enforced: true}), false},
	}
}
