package engine

// Endpoints by reference (docs/workloads.md, "Endpoints by reference"): a
// flow's source or destination given by a workload name, an address, a
// principal or an identity instead of by tags, resolved against the mesh's
// inventory (inventory.go) to the tag set the flow is decided on. Decisions are
// a function of the resolved tags alone: the decision cache is keyed by them, so
// a workload change never leaves a stale answer in it.

import (
	"errors"
	"fmt"
	"strings"
)

// ErrEndpointNotFound is returned for an endpoint that names a workload the
// mesh does not know (an invalid workload is not known). An unknown identity
// is ErrIdentityNotFound (identity.go).
var ErrEndpointNotFound = errors.New("endpoint not found")

// EndpointForm says how an endpoint was given.
type EndpointForm uint8

// Endpoint forms.
const (
	FormTags EndpointForm = iota + 1
	FormWorkload
	FormAddress
	FormPrincipal
	FormIdentity
)

var formNames = [...]string{"", "tags", "workload", "address", "principal", "identity"}

// String is the form's field name: "tags", "workload", "address", "principal",
// "identity".
func (f EndpointForm) String() string {
	if int(f) < len(formNames) {
		return formNames[f]
	}
	return ""
}

// ResolvedAs says what an endpoint resolved to.
type ResolvedAs uint8

// What endpoints resolve to.
const (
	AsTags             ResolvedAs = iota + 1 // given as tags: used as given
	AsWorkload                               // a workload of the inventory (by name, or holding the address)
	AsExternal                               // an address no workload holds: {ip: ADDR}
	AsPrincipalHolders                       // a principal held by workloads: the tags they all share
	AsKumaSpiffe                             // a principal no workload holds, of Kuma's spiffe://<mesh>/<service> form
	AsUnknownPrincipal                       // a principal no workload holds, of another form: {principal: ID}
	AsIdentity                               // an identity: the tag set it was computed from
)

var resolvedNames = [...]string{"", "TAGS", "WORKLOAD", "EXTERNAL", "PRINCIPAL_HOLDERS", "KUMA_SPIFFE",
	"UNKNOWN_PRINCIPAL", "IDENTITY"}

func (a ResolvedAs) String() string {
	if int(a) < len(resolvedNames) {
		return resolvedNames[a]
	}
	return ""
}

// Endpoint is one end of a flow, given by exactly one of its forms (Validate).
// The zero Endpoint is the empty tag set.
type Endpoint struct {
	Tags      Tags
	Workload  string // a workload's name
	Address   string // an IP address
	Principal string // a certificate identity (a SPIFFE ID)
	Identity  uint64 // a numeric identity; 0 = not given
}

// Form returns the form the endpoint is given in: the first given of
// workload, address, principal and identity, else tags. (Validate refuses an
// endpoint that gives several.)
func (e *Endpoint) Form() EndpointForm {
	switch {
	case e == nil:
		return FormTags
	case e.Workload != "":
		return FormWorkload
	case e.Address != "":
		return FormAddress
	case e.Principal != "":
		return FormPrincipal
	case e.Identity != 0:
		return FormIdentity
	}
	return FormTags
}

// forms lists the forms the endpoint gives, in field order.
func (e *Endpoint) forms() []EndpointForm {
	var out []EndpointForm
	if len(e.Tags) > 0 {
		out = append(out, FormTags)
	}
	if e.Workload != "" {
		out = append(out, FormWorkload)
	}
	if e.Address != "" {
		out = append(out, FormAddress)
	}
	if e.Principal != "" {
		out = append(out, FormPrincipal)
	}
	if e.Identity != 0 {
		out = append(out, FormIdentity)
	}
	return out
}

// check adds the endpoint's field errors under field ("source").
func (e *Endpoint) check(errs *errList, field string) {
	forms := e.forms()
	if len(forms) > 1 {
		names := make([]string, len(forms))
		for i, f := range forms {
			names[i] = f.String()
		}
		errs.add(joinPath(field, forms[1].String()), fmt.Sprintf("an endpoint is given by exactly one of tags, workload, address, "+
			"principal or identity; this one gives %s", strings.Join(names, " and ")))
	}
	if err := CheckTags(e.Tags); err != nil {
		errs.add(joinPath(field, "tags"), err.Error())
	}
	if e.Workload != "" {
		if err := checkName(e.Workload); err != nil {
			errs.add(joinPath(field, "workload"), err.Error())
		}
	}
	if e.Address != "" {
		if _, err := CanonicalAddress(e.Address); err != nil {
			errs.add(joinPath(field, "address"), err.Error())
		}
	}
	if e.Principal != "" {
		if err := checkTagValue(e.Principal, false); err != nil {
			errs.add(joinPath(field, "principal"), err.Error())
		}
	}
}

// EndpointResolution says how one end of a flow was resolved.
type EndpointResolution struct {
	Form       EndpointForm
	ResolvedAs ResolvedAs
	Workload   string // the workload resolved (workload and address forms)
	Holders    int    // the valid workloads holding the principal (principal form)
	// Identity is the identity of Tags, reserved keys excluded — except for
	// a side Request.Source or Destination gave as tags, where Decide leaves
	// it 0 rather than hash the tags of every decision, unless the request
	// asks for it (Request.TagIdentities).
	Identity uint64
	Tags     Tags // the tags the flow is decided on (shared: do not modify)
}

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
		mesh = DefaultMesh
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
	var errs errList
	ep.check(&errs, "")
	if err := errs.err(); err != nil {
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
			r.Tags = Tags{}
		}
	case FormWorkload:
		e, ok := inv.workload(ep.Workload)
		if !ok {
			return EndpointResolution{}, fmt.Errorf("%w: mesh %q has no valid workload %q", ErrEndpointNotFound, mesh, ep.Workload)
		}
		r.ResolvedAs, r.Workload = AsWorkload, e.w.Name
		r.Tags = e.w.resolvedTags(port, "")
		if len(r.Tags) == len(e.w.Tags) && sameTagSet(r.Tags, e.w.Tags) {
			r.Identity = e.id
			return r, nil
		}
	case FormAddress:
		addr, _ := CanonicalAddress(ep.Address) // checked above
		if e, ok := inv.owner(addr); ok {
			r.ResolvedAs, r.Workload = AsWorkload, e.w.Name
			r.Tags = e.w.resolvedTags(port, addr)
		} else {
			r.ResolvedAs, r.Tags = AsExternal, Tags{IPTag: addr}
		}
	case FormPrincipal:
		if ps, ok := inv.principal(ep.Principal); ok {
			r.ResolvedAs, r.Holders = AsPrincipalHolders, ps.len()
			r.Tags = withTag(ps.shared, PrincipalTag, ep.Principal)
		} else if svc, ok := kumaSpiffeService(mesh, ep.Principal); ok {
			r.ResolvedAs = AsKumaSpiffe
			r.Tags = Tags{ServiceTag: svc, PrincipalTag: ep.Principal}
		} else {
			r.ResolvedAs, r.Tags = AsUnknownPrincipal, Tags{PrincipalTag: ep.Principal}
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
			r.Tags = Tags{}
		}
		return r, nil
	}
	if withID {
		r.Identity = Identity(mesh, r.Tags)
	}
	return r, nil
}

// kumaSpiffeService returns <service> of a principal of Kuma's form
// spiffe://<mesh>/<service>, when <mesh> is mesh: the form counts only in the
// request's mesh (docs/workloads.md, "Endpoints by reference").
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

// resolvedTags is the workload's tags as an endpoint: its own tags, plus the
// tags of its first ports entry for port (0: none; port tags win over its own),
// plus ip: addr when addr is given. It returns w.Tags itself when it adds
// nothing.
func (w *Workload) resolvedTags(port uint32, addr string) Tags {
	pt, _ := w.portTags(port)
	if len(pt) == 0 && addr == "" {
		if w.Tags == nil {
			return Tags{}
		}
		return w.Tags
	}
	out := make(Tags, len(w.Tags)+len(pt)+1)
	for k, v := range w.Tags {
		out[k] = v
	}
	for k, v := range pt {
		out[k] = v
	}
	if addr != "" {
		out[IPTag] = addr
	}
	return out
}

// portTags returns the tags of the first ports entry for port, or nil.
func (w *Workload) portTags(port uint32) (map[string]string, bool) {
	if port == 0 {
		return nil, false
	}
	for _, p := range w.Ports {
		if p.Port == port {
			return p.Tags, true
		}
	}
	return nil, false
}

// withTag returns a copy of tags with k: v added.
func withTag(tags Tags, k, v string) Tags {
	out := make(Tags, len(tags)+1)
	for tk, tv := range tags {
		out[tk] = tv
	}
	out[k] = v
	return out
}

// owner returns the valid workload that owns an address.
func (inv *inventory) owner(addr string) (*workloadEntry, bool) {
	if inv == nil {
		return nil, false
	}
	l, ok := inv.claims.Get(addr)
	if !ok || len(l) == 0 {
		return nil, false
	}
	e, ok := inv.byName.Get(l[0].name)
	if !ok || e.err != "" {
		return nil, false
	}
	return e, true
}

// workload returns the valid workload named name.
func (inv *inventory) workload(name string) (*workloadEntry, bool) {
	if inv == nil {
		return nil, false
	}
	e, ok := inv.byName.Get(name)
	if !ok || e.err != "" {
		return nil, false
	}
	return e, true
}

// principal returns the valid holders of a principal.
func (inv *inventory) principal(id string) (*principalSet, bool) {
	if inv == nil {
		return nil, false
	}
	return inv.principals.Get(id)
}
