package engine

// Known types (docs/types.md): a policy type a mesh knows, so that a typo in
// a type name is an error, never an answer.

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
)

// ErrTypeNotFound is returned by Decide, Resolve and RulesFor for a type the
// mesh does not know (a typo in a type name must not fail open). The error is
// an *UnknownTypeError naming the nearest known types.
var ErrTypeNotFound = errors.New("type not known")

// builtinTypes are the policy types every mesh knows. Sources:
//   - Kuma v2.14.3, new policies (pkg/plugins/policies/*, each package's
//     ResourceType; the test-only DoNothingPolicy left out);
//   - Kuma v2.14.3, legacy policies (api/mesh/v1alpha1, the types of
//     pkg/core/resources/apis/mesh that are policies: not Dataplane, Mesh,
//     ExternalService, the gateways, zones or insights);
//   - Kong Mesh 2.x: MeshOPA, MeshGlobalRateLimit and the legacy OPAPolicy;
//   - the seed policy models: Kuadrant's AuthPolicy, RateLimitPolicy,
//     TLSPolicy and DNSPolicy (seed 003), UpstreamTimeout (seed 001).
//
// docs/types.md lists them; keep the two in step.
var builtinTypes = []string{
	// Kuma, new policies
	"MeshAccessLog", "MeshCircuitBreaker", "MeshFaultInjection", "MeshHTTPRoute", "MeshHealthCheck",
	"MeshLoadBalancingStrategy", "MeshMetric", "MeshPassthrough", "MeshProxyPatch", "MeshRateLimit",
	"MeshRetry", "MeshTCPRoute", "MeshTLS", "MeshTimeout", "MeshTrace", "MeshTrafficPermission",
	// Kuma, legacy policies
	"CircuitBreaker", "FaultInjection", "HealthCheck", "ProxyTemplate", "RateLimit", "Retry", "Timeout",
	"TrafficLog", "TrafficPermission", "TrafficRoute", "TrafficTrace", "VirtualOutbound",
	// Kong Mesh 2.x
	"MeshGlobalRateLimit", "MeshOPA", "OPAPolicy",
	// the seeds
	"AuthPolicy", "DNSPolicy", "RateLimitPolicy", "TLSPolicy", "UpstreamTimeout",
}

var builtinSet = func() map[string]bool {
	m := make(map[string]bool, len(builtinTypes))
	for _, t := range builtinTypes {
		m[t] = true
	}
	return m
}()

// BuiltinTypes returns the types every mesh knows, sorted.
func BuiltinTypes() []string {
	out := append([]string(nil), builtinTypes...)
	sort.Strings(out)
	return out
}

// IsBuiltinType reports whether t is a built-in policy type.
func IsBuiltinType(t string) bool { return builtinSet[t] }

// UnknownTypeError says that a mesh does not know a type, and which known
// types are nearest to it. It matches ErrTypeNotFound.
type UnknownTypeError struct {
	Mesh, Type string
	Nearest    []string // at most 3, nearest first; empty when none is close
}

func (e *UnknownTypeError) Error() string {
	msg := fmt.Sprintf("type %q is not known in mesh %q (neither built in, declared in the Mesh's types, named in a scope's catchAllTypes, nor used by a policy)", e.Type, e.Mesh)
	if len(e.Nearest) > 0 {
		msg += "; did you mean " + orList(e.Nearest) + "?"
	}
	return msg
}

// Is makes errors.Is(err, ErrTypeNotFound) true.
func (e *UnknownTypeError) Is(target error) bool { return target == ErrTypeNotFound }

func orList(l []string) string {
	switch len(l) {
	case 1:
		return l[0]
	case 2:
		return l[0] + " or " + l[1]
	}
	return strings.Join(l[:len(l)-1], ", ") + " or " + l[len(l)-1]
}

// declaredTypes are the types a mesh's documents name: the Mesh's types and
// its scopes' catchAllTypes. Computed when the mesh is rebuilt (any Mesh or
// Scope change rebuilds it).
func declaredTypes(doc *resource.Mesh, scopes []*resource.Scope) map[string]bool {
	out := map[string]bool{}
	if doc != nil {
		for t := range doc.Types {
			out[t] = true
		}
	}
	for _, s := range scopes {
		for _, t := range s.CatchAllTypes {
			out[t] = true
		}
	}
	return out
}

// checkType returns nil when the mesh knows typ, else an *UnknownTypeError.
func (ms *meshState) checkType(typ string) error {
	if builtinSet[typ] || ms.declared[typ] {
		return nil
	}
	if _, ok := ms.types.Get(typ); ok {
		return nil
	}
	known := append([]string(nil), builtinTypes...)
	for t := range ms.declared {
		known = append(known, t)
	}
	ms.types.Range(func(t string, _ *typeState) bool {
		known = append(known, t)
		return true
	})
	return &UnknownTypeError{Mesh: ms.name, Type: typ, Nearest: resource.NearestNames(typ, known, 3)}
}

// TypeWarnings checks the policy types of a write (docs/types.md, "Known
// types"): a policy whose type is neither built in nor declared in its Mesh's
// types (the Mesh of the write when it has one, else the stored one) gets a
// warning, or, when that Mesh sets strictTypes, a validation error naming the
// put ("resources[2].type").
func (s *Snapshot) TypeWarnings(puts []resource.Resource) ([]string, error) {
	meshes := map[string]*resource.Mesh{}
	for _, r := range puts {
		if m, ok := r.(*resource.Mesh); ok {
			meshes[m.Name] = m
		}
	}
	var warnings []string
	var errs resource.FieldErrors
	for i, r := range puts {
		p, ok := r.(*resource.Policy)
		if !ok || builtinSet[p.Type] {
			continue
		}
		doc, ok := meshes[p.Mesh]
		if !ok {
			if ms, found := s.meshes.Get(p.Mesh); found {
				doc = ms.doc
			}
		}
		if doc != nil {
			if _, declared := doc.Types[p.Type]; declared {
				continue
			}
		}
		known := append([]string(nil), builtinTypes...)
		if doc != nil {
			for t := range doc.Types {
				known = append(known, t)
			}
		}
		msg := fmt.Sprintf("type %q is neither built in nor declared in mesh %q's types", p.Type, p.Mesh)
		if near := resource.NearestNames(p.Type, known, 3); len(near) > 0 {
			msg += "; did you mean " + orList(near) + "?"
		}
		if doc != nil && doc.StrictTypes {
			errs.Add(fmt.Sprintf("resources[%d].type", i), msg+" (the mesh sets strictTypes: declare it in the Mesh's types)")
			continue
		}
		warnings = append(warnings, fmt.Sprintf("resources[%d] (%s): %s", i, p.Key(), msg))
	}
	return warnings, errs.Err()
}
