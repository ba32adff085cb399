package inventory

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

	"github.com/verdictpdp/verdict/engine/resource"
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
	Tags      resource.Tags
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

// Check adds the endpoint's field errors under field ("source").
func (e *Endpoint) Check(errs *resource.FieldErrors, field string) {
	forms := e.forms()
	if len(forms) > 1 {
		names := make([]string, len(forms))
		for i, f := range forms {
			names[i] = f.String()
		}
		errs.Add(resource.JoinPath(field, forms[1].String()), fmt.Sprintf("an endpoint is given by exactly one of tags, workload, address, "+
			"principal or identity; this one gives %s", strings.Join(names, " and ")))
	}
	if err := resource.CheckTags(e.Tags); err != nil {
		errs.Add(resource.JoinPath(field, "tags"), err.Error())
	}
	if e.Workload != "" {
		if err := resource.CheckName(e.Workload); err != nil {
			errs.Add(resource.JoinPath(field, "workload"), err.Error())
		}
	}
	if e.Address != "" {
		if _, err := resource.CanonicalAddress(e.Address); err != nil {
			errs.Add(resource.JoinPath(field, "address"), err.Error())
		}
	}
	if e.Principal != "" {
		if err := resource.CheckTagValue(e.Principal, false); err != nil {
			errs.Add(resource.JoinPath(field, "principal"), err.Error())
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
	Tags     resource.Tags // the tags the flow is decided on (shared: do not modify)
}

// Owner returns the valid workload that owns an address.
func (inv *Inventory) Owner(addr string) (*WorkloadEntry, bool) {
	if inv == nil {
		return nil, false
	}
	l, ok := inv.Claims.Get(addr)
	if !ok || len(l) == 0 {
		return nil, false
	}
	e, ok := inv.ByName.Get(l[0].Name)
	if !ok || e.Err != "" {
		return nil, false
	}
	return e, true
}

// Workload returns the valid workload named name.
func (inv *Inventory) Workload(name string) (*WorkloadEntry, bool) {
	if inv == nil {
		return nil, false
	}
	e, ok := inv.ByName.Get(name)
	if !ok || e.Err != "" {
		return nil, false
	}
	return e, true
}

// Principal returns the valid holders of a principal.
func (inv *Inventory) Principal(id string) (*principalSet, bool) {
	if inv == nil {
		return nil, false
	}
	return inv.principals.Get(id)
}

// KumaSpiffeService returns <service> of a principal of Kuma's form
// spiffe://<mesh>/<service>, when <mesh> is mesh: the form counts only in the
// request's mesh (docs/workloads.md, "Endpoints by reference").
func KumaSpiffeService(mesh, principal string) (string, bool) {
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
