package engine

import (
	"sort"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Member returns the part of a workload in the set at snapshot s; false when
// it takes no part (unknown, invalid, or none of its addresses concerned).
func (s *Snapshot) PeerMember(p *inventory.PeerPlan, mesh, name string) (inventory.PeerMember, bool) {
	inv := s.inventoryOf(mesh)
	if inv == nil {
		return inventory.PeerMember{}, false
	}
	e, ok := inv.ByName.Get(name)
	if !ok {
		return inventory.PeerMember{}, false
	}
	return p.Member(e)
}

// Members returns the part of every workload of the mesh in the set at s,
// by workload name: O(workloads of the mesh).
func (s *Snapshot) PeerMembers(p *inventory.PeerPlan, mesh string) map[string]inventory.PeerMember {
	out := map[string]inventory.PeerMember{}
	inv := s.inventoryOf(mesh)
	if inv == nil || p.Kind != inventory.PeerSet {
		return out
	}
	inv.ByName.Range(func(name string, e *inventory.WorkloadEntry) bool {
		if m, ok := p.Member(e); ok {
			out[name] = m
		}
		return true
	})
	return out
}

// TouchedWorkloads returns the workloads of a mesh whose part in any set may
// differ between prev and s, given the names of the workloads changed between
// them: the changed ones and those that claim an address one of them held in
// prev or holds in s (a change can make such a claimant valid or invalid).
func (s *Snapshot) TouchedWorkloads(prev *Snapshot, mesh string, changed []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	invs := []*inventory.Inventory{prev.inventoryOf(mesh), s.inventoryOf(mesh)}
	for _, n := range changed {
		add(n)
		for _, inv := range invs {
			if inv == nil {
				continue
			}
			e, ok := inv.ByName.Get(n)
			if !ok {
				continue
			}
			for _, a := range e.Workload.Addresses {
				for _, in := range invs {
					if in == nil {
						continue
					}
					for _, c := range inventory.ClaimsOf(in.Claims.Get, a) {
						add(c.Name)
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// WorkloadAddresses returns a valid workload's addresses; false when the mesh
// holds no valid workload of that name.
func (s *Snapshot) WorkloadAddresses(mesh, name string) ([]string, bool) {
	inv := s.inventoryOf(mesh)
	if inv == nil {
		return nil, false
	}
	e, ok := inv.ByName.Get(name)
	if !ok || e.Err != "" {
		return nil, false
	}
	return e.Workload.Addresses, true
}

func (s *Snapshot) inventoryOf(mesh string) *inventory.Inventory {
	if s == nil {
		return nil
	}
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	ms, ok := s.meshes.Get(mesh)
	if !ok || ms == nil {
		return nil
	}
	return ms.inv
}
