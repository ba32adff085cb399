package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// floodWorld: an Absolute DENY for the victim's tags above an ALLOW for
// every flow, and a workload db-1 whose own identity resolves unregistered.
func floodWorld() *Snapshot {
	return Build(1, []resource.Resource{
		&resource.Policy{Mesh: "m", Name: "deny-victim", Type: resource.DefaultType, Action: resource.Deny, Rank: resource.RankAbsolute,
			Sources: []resource.Selector{{Match: map[string]string{"app": "victim"}}}, Destinations: []resource.Selector{{Match: map[string]string{"app": "db"}}}},
		&resource.Policy{Mesh: "m", Name: "allow-all", Type: resource.DefaultType, Action: resource.Allow,
			Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}},
		&resource.Workload{Mesh: "m", Name: "db-1", Tags: resource.Tags{"app": "db"}},
	})
}

// TestEvictedIdentityNeverAnsweredForAnotherSet is the identity flood: the
// victim's registered set is evicted by a flood of registrations, a colliding
// set is offered under its identity, and the victim's cached identity must
// answer NOT_FOUND — by lookup and by the identity-pair memo alike — never
// the colliding set's ALLOW where the victim's DENY applies.
func TestEvictedIdentityNeverAnsweredForAnotherSet(t *testing.T) {
	t.Parallel()
	s := floodWorld()
	victim := resource.Tags{"app": "victim", "env": "prod"}
	forged := resource.Tags{"app": "forged"}
	victimID := resource.Identity("m", victim)
	dbID := resource.Identity("m", resource.Tags{"app": "db"})
	reg := inventory.NewRegistryWith(inventory.RegistryLimits{MaxSets: 64, MeshMaxSets: 8})
	reg.Identity = func(mesh string, tags resource.Tags) uint64 {
		if resource.SameTagSet(tags, forged) {
			return victimID // SHA-256 prefixes cannot be made to collide: the hook does it
		}
		return resource.Identity(mesh, tags)
	}
	decide := func() (resource.Action, error) {
		t.Helper()
		p, err := s.PairScope("m", "", reg)
		if err != nil {
			t.Fatal(err)
		}
		if a, _, ok := p.DecideIDs(victimID, dbID, resource.TCP, 5432); ok {
			if a.Deny() {
				return resource.Deny, nil
			}
			return resource.Allow, nil
		}
		src, err := p.Lookup(victimID)
		if err != nil {
			return resource.ActionUnset, err
		}
		dst, err := p.Lookup(dbID)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := p.Decide(src, dst, resource.TCP, 5432)
		return d.Action, nil
	}

	if _, err := s.Identify("m", victim, reg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // the second and third from the identity-pair memo
		if a, err := decide(); err != nil || a != resource.Deny {
			t.Fatalf("the victim before the flood: %v %v, want DENY", a, err)
		}
	}
	for i := 0; i < 100; i++ {
		if _, err := s.Identify("m", resource.Tags{"app": fmt.Sprint("flood-", i)}, reg); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := reg.Lookup("m", victimID); ok {
		t.Fatal("the flood did not evict the victim's set: the test proves nothing")
	}
	if set, err := s.Identify("m", forged, reg); !errors.Is(err, inventory.ErrIdentityCollision) {
		t.Fatalf("a set colliding with an evicted one was registered (%v, %v)", set, err)
	}
	for _, lookup := range []struct {
		name string
		err  func() error
	}{
		{"LookupIdentity", func() error { _, err := s.LookupIdentity("m", victimID, reg); return err }},
		{"the compact path", func() error { _, err := decide(); return err }},
	} {
		if err := lookup.err(); !errors.Is(err, inventory.ErrIdentityNotFound) {
			t.Errorf("%s of the evicted identity: %v, want ErrIdentityNotFound", lookup.name, err)
		}
	}
	// The victim registers its own set again: its identity answers for it.
	if _, err := s.Identify("m", victim, reg); err != nil {
		t.Fatalf("the victim's set again: %v", err)
	}
	if a, err := decide(); err != nil || a != resource.Deny {
		t.Fatalf("the victim after registering again: %v %v, want DENY", a, err)
	}
}

// TestRegistryMeshQuotas: one mesh's registrations evict only its own sets;
// a registry full of other meshes' sets refuses a new mesh's set rather than
// evict theirs.
func TestRegistryMeshQuotas(t *testing.T) {
	t.Parallel()
	r := inventory.NewRegistryWith(inventory.RegistryLimits{MaxSets: 20, MeshMaxSets: 10})
	victim, err := r.Register("a", resource.Tags{"app": "victim"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		if _, err := r.Register("b", resource.Tags{"app": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := r.Lookup("a", victim.Identity()); !ok {
		t.Fatal("mesh b's flood evicted mesh a's set")
	}
	if sets, _ := r.MeshStats("b"); sets != 10 {
		t.Errorf("mesh b holds %d sets, over its quota of 10", sets)
	}
	for i := 0; i < 9; i++ {
		if _, err := r.Register("a", resource.Tags{"app": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Register("c", resource.Tags{"app": "x"}); !errors.Is(err, inventory.ErrRegistryFull) {
		t.Errorf("a new mesh's set in a registry full of others': %v, want ErrRegistryFull", err)
	}
	if _, ok := r.Lookup("a", victim.Identity()); !ok {
		t.Error("a refused set evicted another mesh's")
	}
	if name, _ := CodeName(inventory.ErrRegistryFull); name != "ResourceExhausted" {
		t.Errorf("ErrRegistryFull answers %q", name)
	}
	st := r.Stats()
	if st.Sets != 20 || st.Tombstones != 80 || st.Refused != 1 {
		t.Errorf("stats %+v: want 20 sets, 80 tombstones (the bound), 1 refused", st)
	}
}

type countQuota struct{ left int }

func (q *countQuota) Take() error {
	if q.left == 0 {
		return inventory.ErrRegistrationLimit
	}
	q.left--
	return nil
}

// TestRegistrationQuota: a quota is charged for new sets only, and its error
// refuses the set.
func TestRegistrationQuota(t *testing.T) {
	t.Parallel()
	s := floodWorld()
	reg := inventory.NewRegistry(0, 0)
	q := &countQuota{left: 2}
	for i, tc := range []struct {
		tags resource.Tags
		err  error
	}{
		{resource.Tags{"app": "a"}, nil},
		{resource.Tags{"app": "a"}, nil},  // registered: free
		{resource.Tags{"app": "db"}, nil}, // db-1's own set: still a registration
		{resource.Tags{"app": "c"}, inventory.ErrRegistrationLimit},
		{resource.Tags{"app": "a", "ip": "10.0.0.9"}, nil}, // reserved keys dropped: registered
	} {
		if _, err := s.IdentifyWithin("m", tc.tags, reg, q); !errors.Is(err, tc.err) {
			t.Errorf("registration %d (%v): %v, want %v", i, tc.tags, err, tc.err)
		}
	}
	if name, _ := CodeName(inventory.ErrRegistrationLimit); name != "ResourceExhausted" {
		t.Errorf("ErrRegistrationLimit answers %q", name)
	}
}
