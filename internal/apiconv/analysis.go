package apiconv

// The analysis service's conversions (docs/analysis.md): requests into the
// engine's, answers into pages and changes.

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// ReachRequest translates a ReachRequest; its fields are validated by the
// engine's request (analysis.ReachRequest.Validate).
func ReachRequest(r *verdictv1.ReachRequest) analysis.ReachRequest {
	p, _ := resource.ParseProtocol(r.GetProtocol())
	out := analysis.ReachRequest{Mesh: r.GetMesh(), Type: r.GetType(), Protocol: p, Port: r.GetPort(),
		Destination: r.GetDirection() != verdictv1.ReachDirection_REACH_DIRECTION_FROM}
	tags, ep := Endpoint(r.GetEndpoint())
	if ep != nil {
		out.Endpoint = *ep
	} else {
		out.Endpoint = inventory.Endpoint{Tags: tags}
	}
	return out
}

// ReachEntry translates one entry of a Reach answer.
func ReachEntry(e *analysis.ReachEntry) *verdictv1.ReachEntry {
	out := &verdictv1.ReachEntry{Workload: e.Workload, Identity: e.Identity, Tags: e.Tags,
		OutboundPolicy: e.Outbound.Policy, InboundPolicy: e.Inbound.Policy,
		Outbound: Side(&e.Outbound), Inbound: Side(&e.Inbound), Except: e.Outside.Except}
	switch {
	case e.Outside.Any:
		out.Outside = &verdictv1.ReachEntry_Any{Any: true}
	case e.Outside.CIDR != "":
		out.Outside = &verdictv1.ReachEntry_Cidr{Cidr: e.Outside.CIDR}
	case e.Outside.Principal != "":
		out.Outside = &verdictv1.ReachEntry_Principal{Principal: e.Outside.Principal}
	}
	if e.Workload == "" {
		out.Tags = nil // an outside class has no tags of its own
	}
	return out
}

// MatrixRequest translates a MatrixRequest: selectors of the tags given, and
// the class holding the protocol and port when one is given.
func MatrixRequest(r *verdictv1.MatrixRequest, classes func() []analysis.FlowClass) analysis.MatrixRequest {
	out := analysis.MatrixRequest{Mesh: r.GetMesh(), Type: r.GetType()}
	if len(r.GetSources()) > 0 {
		out.Sources = &resource.Selector{Match: r.GetSources()}
	}
	if len(r.GetDestinations()) > 0 {
		out.Destinations = &resource.Selector{Match: r.GetDestinations()}
	}
	if r.GetProtocol() != "" {
		p, _ := resource.ParseProtocol(r.GetProtocol())
		if c, ok := analysis.ClassOf(classes(), p, r.GetPort()); ok {
			c.Port = r.GetPort()
			if p == resource.ICMP {
				c.Port = 0
			}
			out.Classes = []analysis.FlowClass{c}
		} else {
			out.Classes = []analysis.FlowClass{{Protocol: p, Port: r.GetPort(), Lo: r.GetPort(), Hi: r.GetPort()}}
		}
	}
	return out
}

// MatrixEntry translates one allowed pair.
func MatrixEntry(e *analysis.MatrixEntry) *verdictv1.MatrixEntry {
	return &verdictv1.MatrixEntry{Source: e.Source, Destination: e.Destination, SourceIdentity: e.SourceIdentity,
		DestinationIdentity: e.DestinationIdentity, Protocol: e.Class.Protocol.String(), Port: e.Class.Port,
		PortLo: e.Class.Lo, PortHi: e.Class.Hi, OutboundPolicy: e.Outbound.Policy, InboundPolicy: e.Inbound.Policy}
}

// ObservedFlow translates a decision-log record into a flow to replay; its
// count is 1 (a record is one decision).
func ObservedFlow(r *verdictv1.DecisionRecord) analysis.ObservedFlow {
	p, _ := resource.ParseProtocol(r.GetProtocol())
	// A record gives an end as the request named it, with the tags it was
	// decided on beside a reference: the reference is replayed (it resolves
	// anew on each snapshot), the tags only when the request gave tags.
	end := func(e *verdictv1.RecordEndpoint) inventory.Endpoint {
		ep := inventory.Endpoint{Workload: e.GetWorkload(), Address: e.GetAddress(), Principal: e.GetPrincipal(), Identity: e.GetIdentity()}
		if ep.Form() == inventory.FormTags {
			ep.Tags = e.GetTags()
		}
		return ep
	}
	return analysis.ObservedFlow{Mesh: r.GetMesh(), Type: r.GetType(), Source: end(r.GetSource()),
		Destination: end(r.GetDestination()), Protocol: p, Port: r.GetPort(), Count: 1}
}

// ImpactResponse translates an Impact answer: the changes in order (mesh,
// type, source, destination, class) and their groups by deciding policy,
// destination and class.
func ImpactResponse(a *analysis.ImpactAnswer) *verdictv1.ImpactResponse {
	out := &verdictv1.ImpactResponse{Revision: a.Revision, Considered: uint64(a.Considered), Redecided: uint64(a.Redecided)}
	type gk struct {
		policy, dst, proto string
		lo, hi             uint32
	}
	groups := map[gk]*verdictv1.ImpactGroup{}
	for i := range a.Changes {
		c := &a.Changes[i]
		pc := &verdictv1.ImpactChange{Mesh: c.Mesh, Type: c.Type, Source: endpointProto(c.Source), Destination: endpointProto(c.Destination),
			Protocol: c.Class.Protocol.String(), Port: c.Class.Port, PortLo: c.Class.Lo, PortHi: c.Class.Hi,
			Observed: c.Observed, Count: c.Count,
			Before: impactAnswer(&c.Before, c.BeforeErr), After: impactAnswer(&c.After, c.AfterErr)}
		if c.Explain != nil {
			pc.Explanation = &verdictv1.Explanation{Outbound: Trace(&c.Explain.Outbound), Inbound: Trace(&c.Explain.Inbound)}
		}
		out.Changes = append(out.Changes, pc)
		policy := c.After.Policy
		if policy == "" {
			policy = c.Before.Policy
		}
		k := gk{policy, EndpointText(c.Destination), pc.Protocol, c.Class.Lo, c.Class.Hi}
		g, ok := groups[k]
		if !ok {
			g = &verdictv1.ImpactGroup{Policy: k.policy, Destination: k.dst, Protocol: k.proto, PortLo: k.lo, PortHi: k.hi}
			groups[k] = g
			out.Groups = append(out.Groups, g)
		}
		g.Flows++
		if c.Observed {
			g.Observed += c.Count
		}
	}
	slices.SortStableFunc(out.Groups, func(x, y *verdictv1.ImpactGroup) int {
		return cmp.Or(cmp.Compare(y.Flows, x.Flows), strings.Compare(x.Policy, y.Policy), strings.Compare(x.Destination, y.Destination))
	})
	return out
}

func impactAnswer(d *engine.Decision, errText string) *verdictv1.ImpactAnswer {
	if errText != "" {
		return &verdictv1.ImpactAnswer{Error: errText}
	}
	return &verdictv1.ImpactAnswer{Action: Action(d.Action), Policy: d.Policy, Outbound: Side(&d.Outbound), Inbound: Side(&d.Inbound)}
}

func endpointProto(e inventory.Endpoint) *verdictv1.Endpoint {
	return &verdictv1.Endpoint{Tags: e.Tags, Workload: e.Workload, Address: e.Address, Principal: e.Principal, Identity: e.Identity}
}

// EndpointText is an endpoint as one word: "db-1", "10.0.0.1",
// "spiffe://shop/web", "identity 42", "{app=web,env=prod}".
func EndpointText(e inventory.Endpoint) string {
	switch {
	case e.Workload != "":
		return e.Workload
	case e.Address != "":
		return e.Address
	case e.Principal != "":
		return e.Principal
	case e.Identity != 0:
		return "identity " + strconv.FormatUint(e.Identity, 10)
	}
	keys := make([]string, 0, len(e.Tags))
	for k := range e.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + e.Tags[k])
	}
	b.WriteByte('}')
	return b.String()
}
