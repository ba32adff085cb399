package engine

import (
	"fmt"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ResolveEndpoint resolves one end of a flow of mesh (docs/workloads.md):
// destination says whether it is the flow's destination (a workload's port
// tags then apply for port; 0 = no port); an identity is looked up as
// LookupIdentity does, in the inventory, then in reg (identities registered
// through the API; nil: none). It fails with ErrEndpointNotFound for an
// unknown workload name, ErrIdentityNotFound or ErrIdentityCollision for an
// identity, ErrInvalid for an endpoint Validate refuses. A mesh that holds no
// resource has an empty inventory.
func (s *Snapshot) ResolveEndpoint(mesh string, ep *inventory.Endpoint, destination bool, port uint32, reg *inventory.Registry) (inventory.EndpointResolution, error) {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	ms, _ := s.meshes.Get(mesh)
	return resolveEndpoint(ms, mesh, ep, destination, port, reg, true)
}

// resolveEndpoint resolves ep in the mesh of ms (nil: a mesh that holds no
// resource, named mesh). Without withID, an identity that would have to be
// computed from the resolved tags is left 0 (Decide takes it from the memo
// when it can: Request.identify).
func resolveEndpoint(ms *meshState, mesh string, ep *inventory.Endpoint, destination bool, port uint32, reg *inventory.Registry, withID bool) (inventory.EndpointResolution, error) {
	var inv *inventory.Inventory
	if ms != nil {
		inv = ms.inv
	}
	var errs resource.FieldErrors
	ep.Check(&errs, "")
	if err := errs.Err(); err != nil {
		return inventory.EndpointResolution{}, err
	}
	if !destination {
		port = 0
	}
	r := inventory.EndpointResolution{Form: ep.Form()}
	switch r.Form {
	case inventory.FormTags:
		r.ResolvedAs, r.Tags = inventory.AsTags, ep.Tags
		if r.Tags == nil {
			r.Tags = resource.Tags{}
		}
	case inventory.FormWorkload:
		e, ok := inv.Workload(ep.Workload)
		if !ok {
			return inventory.EndpointResolution{}, fmt.Errorf("%w: mesh %q has no valid workload %q", inventory.ErrEndpointNotFound, mesh, ep.Workload)
		}
		r.ResolvedAs, r.Workload = inventory.AsWorkload, e.Workload.Name
		r.Tags = e.Workload.ResolvedTags(port, "")
		if len(r.Tags) == len(e.Workload.Tags) && resource.SameTagSet(r.Tags, e.Workload.Tags) {
			r.Identity = e.ID
			return r, nil
		}
	case inventory.FormAddress:
		addr, _ := resource.CanonicalAddress(ep.Address) // checked above
		if e, ok := inv.Owner(addr); ok {
			r.ResolvedAs, r.Workload = inventory.AsWorkload, e.Workload.Name
			r.Tags = e.Workload.ResolvedTags(port, addr)
		} else {
			r.ResolvedAs, r.Tags = inventory.AsExternal, resource.Tags{resource.IPTag: addr}
		}
	case inventory.FormPrincipal:
		if ps, ok := inv.Principal(ep.Principal); ok {
			r.ResolvedAs, r.Holders = inventory.AsPrincipalHolders, ps.Len()
			r.Tags = withTag(ps.Shared, resource.PrincipalTag, ep.Principal)
		} else if svc, ok := inventory.KumaSpiffeService(mesh, ep.Principal); ok {
			r.ResolvedAs = inventory.AsKumaSpiffe
			r.Tags = resource.Tags{resource.ServiceTag: svc, resource.PrincipalTag: ep.Principal}
		} else {
			r.ResolvedAs, r.Tags = inventory.AsUnknownPrincipal, resource.Tags{resource.PrincipalTag: ep.Principal}
		}
	case inventory.FormIdentity:
		if ms == nil {
			return inventory.EndpointResolution{}, fmt.Errorf("%w: %d: mesh %q holds no resource", inventory.ErrIdentityNotFound, ep.Identity, mesh)
		}
		ts, err := ms.lookupIdentity(ep.Identity, reg.Mesh(ms.name))
		if err != nil {
			return inventory.EndpointResolution{}, err
		}
		r.ResolvedAs, r.Tags, r.Identity = inventory.AsIdentity, ts.Tags(), ts.Identity()
		if r.Tags == nil {
			r.Tags = resource.Tags{}
		}
		return r, nil
	}
	if withID {
		r.Identity = resource.Identity(mesh, r.Tags)
	}
	return r, nil
}

// withTag returns a copy of tags with k: v added.
func withTag(tags resource.Tags, k, v string) resource.Tags {
	out := make(resource.Tags, len(tags)+1)
	for tk, tv := range tags {
		out[tk] = tv
	}
	out[k] = v
	return out
}
