package engine

import (
	"fmt"
	"strings"

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
func (s *Snapshot) ResolveEndpoint(mesh string, ep *Endpoint, destination bool, port uint32, reg *Registry) (EndpointResolution, error) {
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
func resolveEndpoint(ms *meshState, mesh string, ep *Endpoint, destination bool, port uint32, reg *Registry, withID bool) (EndpointResolution, error) {
	var inv *inventory
	if ms != nil {
		inv = ms.inv
	}
	var errs resource.FieldErrors
	ep.check(&errs, "")
	if err := errs.Err(); err != nil {
		return EndpointResolution{}, err
	}
	if !destination {
		port = 0
	}
	r := EndpointResolution{Form: ep.Form()}
	switch r.Form {
	case FormTags:
		r.ResolvedAs, r.Tags = AsTags, ep.Tags
		if r.Tags == nil {
			r.Tags = resource.Tags{}
		}
	case FormWorkload:
		e, ok := inv.workload(ep.Workload)
		if !ok {
			return EndpointResolution{}, fmt.Errorf("%w: mesh %q has no valid workload %q", ErrEndpointNotFound, mesh, ep.Workload)
		}
		r.ResolvedAs, r.Workload = AsWorkload, e.w.Name
		r.Tags = e.w.ResolvedTags(port, "")
		if len(r.Tags) == len(e.w.Tags) && resource.SameTagSet(r.Tags, e.w.Tags) {
			r.Identity = e.id
			return r, nil
		}
	case FormAddress:
		addr, _ := resource.CanonicalAddress(ep.Address) // checked above
		if e, ok := inv.owner(addr); ok {
			r.ResolvedAs, r.Workload = AsWorkload, e.w.Name
			r.Tags = e.w.ResolvedTags(port, addr)
		} else {
			r.ResolvedAs, r.Tags = AsExternal, resource.Tags{resource.IPTag: addr}
		}
	case FormPrincipal:
		if ps, ok := inv.principal(ep.Principal); ok {
			r.ResolvedAs, r.Holders = AsPrincipalHolders, ps.len()
			r.Tags = withTag(ps.shared, resource.PrincipalTag, ep.Principal)
		} else if svc, ok := kumaSpiffeService(mesh, ep.Principal); ok {
			r.ResolvedAs = AsKumaSpiffe
			r.Tags = resource.Tags{resource.ServiceTag: svc, resource.PrincipalTag: ep.Principal}
		} else {
			r.ResolvedAs, r.Tags = AsUnknownPrincipal, resource.Tags{resource.PrincipalTag: ep.Principal}
		}
	case FormIdentity:
		if ms == nil {
			return EndpointResolution{}, fmt.Errorf("%w: %d: mesh %q holds no resource", ErrIdentityNotFound, ep.Identity, mesh)
		}
		ts, err := ms.lookupIdentity(ep.Identity, reg.Mesh(ms.name))
		if err != nil {
			return EndpointResolution{}, err
		}
		r.ResolvedAs, r.Tags, r.Identity = AsIdentity, ts.Tags(), ts.Identity()
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

// kumaSpiffeService returns <service> of a principal of Kuma's form
// spiffe://<mesh>/<service>, when <mesh> is mesh (SPEC section 10: the form
// counts only in the request's mesh).
func kumaSpiffeService(mesh, principal string) (string, bool) {
	rest, ok := strings.CutPrefix(principal, "spiffe://")
	if !ok {
		return "", false
	}
	m, svc, ok := strings.Cut(rest, "/")
	if !ok || m != mesh || svc == "" || strings.Contains(svc, "/") {
		return "", false
	}
	return svc, true
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
