package engine

import (
	"fmt"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// LookupIdentity returns the tag set of an identity in mesh: the own tag set
// of a valid workload (the inventory), else one registered in reg (may be
// nil). ErrMeshNotFound for a mesh that holds no resource,
// ErrIdentityNotFound for an identity neither knows, ErrIdentityCollision when
// both know it with different tag sets.
func (s *Snapshot) LookupIdentity(mesh string, id uint64, reg *inventory.Registry) (*inventory.TagSet, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	ms, ok := s.meshes.Get(mesh)
	if !ok {
		return nil, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, mesh)
	}
	return ms.lookupIdentity(id, reg.Mesh(mesh))
}

func (ms *meshState) lookupIdentity(id uint64, reg *inventory.MeshRegistry) (*inventory.TagSet, error) {
	var inv *inventory.TagSet
	if ms.inv != nil {
		if ts, ok := ms.inv.Ids.Get(id); ok {
			inv = ts.Set
		}
	}
	regSet, _ := reg.Lookup(id)
	switch {
	case inv != nil && regSet != nil:
		if !resource.SameTagSet(inv.Tags(), regSet.Tags()) {
			return nil, inventory.Collision(ms.name, id, inv.Tags(), regSet.Tags())
		}
		return inv, nil
	case inv != nil:
		return inv, nil
	case regSet != nil:
		return regSet, nil
	}
	return nil, fmt.Errorf("%w: %d in mesh %q: no workload has it as its own tag set and it is not registered (Identify)",
		inventory.ErrIdentityNotFound, id, ms.name)
}

// Identify registers the tags' own set (reserved keys dropped) in reg and
// returns it. ErrIdentityCollision when the inventory or the registry holds
// another tag set with its identity, or the registry evicted another set
// with it (never registered then); ErrRegistryFull when the set does not fit
// (inventory.Registry).
func (s *Snapshot) Identify(mesh string, tags resource.Tags, reg *inventory.Registry) (*inventory.TagSet, error) {
	return s.IdentifyWithin(mesh, tags, reg, nil)
}

// IdentifyWithin is Identify with q (may be nil) admitting the registration
// of a set the registry does not hold yet: the server's per-caller limit.
func (s *Snapshot) IdentifyWithin(mesh string, tags resource.Tags, reg *inventory.Registry, q inventory.Quota) (*inventory.TagSet, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	ms, ok := s.meshes.Get(mesh)
	if !ok {
		return nil, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, mesh)
	}
	own := inventory.OwnTags(tags)
	if ms.inv != nil {
		if ts, ok := ms.inv.Ids.Get(reg.Identity(mesh, own)); ok && !resource.SameTagSet(ts.Tags, own) {
			return nil, inventory.Collision(mesh, ts.Set.Identity(), ts.Tags, own)
		}
	}
	return reg.RegisterWithin(mesh, own, q)
}

// SetRequest is a flow between interned tag sets (the compact path).
type SetRequest struct {
	Mesh        string // "" = default
	Type        string // "" = TrafficPermission
	Source      *inventory.TagSet
	Destination *inventory.TagSet
	Protocol    resource.Protocol
	Port        uint32
	NoCache     bool // decide without the memo (benchmarks)
}

// DecideSets answers a flow between interned tag sets as Decide answers their
// tags, from the same memo: its hashes come with the sets, and a pointer
// compare verifies them.
func (s *Snapshot) DecideSets(req *SetRequest) (Decision, error) {
	meshName := req.Mesh
	if meshName == "" {
		meshName = resource.DefaultMesh
	}
	typ := req.Type
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.meshes.Get(meshName)
	if s.closedByType(meshName, ms, typ) != nil {
		return closedDecision(s.revision, false), nil
	}
	if !ok {
		return Decision{}, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, meshName)
	}
	f := index.Flow{Src: req.Source.Tags(), Dst: req.Destination.Tags(), Proto: req.Protocol, Port: req.Port}
	if req.NoCache {
		if err := ms.checkType(typ); err != nil {
			return Decision{}, err
		}
		var d Decision
		s.decideUncached(ms, typ, &f, 0, &d)
		return d, nil
	}
	var d Decision
	ids, err := s.decideMemo(ms, &memoKey{Mesh: meshName, Type: typ, Flow: f, Src: req.Source, Dst: req.Destination},
		req.Source.Hash(), req.Destination.Hash(), &d)
	d.SourceResolution.Identity, d.DestinationResolution.Identity = ids[0], ids[1]
	return d, err
}

// memoMisses is the number of memo lookups that missed (tests).
func (s *Snapshot) memoMisses() uint64 { return s.cache().Misses() }

// CheckMeshType reports whether flows of mesh and type can be decided: nil,
// ErrMeshNotFound, or ErrTypeNotFound (an *UnknownTypeError). A partition
// closed by an invalid stored resource can: it answers DENY.
func (s *Snapshot) CheckMeshType(mesh, typ string) error {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	ms, ok := s.meshes.Get(mesh)
	if s.closedByType(mesh, ms, typ) != nil {
		return nil
	}
	if !ok {
		return fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, mesh)
	}
	return ms.checkType(typ)
}
