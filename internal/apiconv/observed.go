package apiconv

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/observed"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// ObservedFlowProto translates a flow of the observed-flows table.
func ObservedFlowProto(f *observed.Flow) *verdictv1.ObservedFlow {
	end := func(e *observed.End) *verdictv1.ObservedEnd {
		return &verdictv1.ObservedEnd{Given: endpointProto(e.Given), Tags: e.Tags, Identity: e.Identity}
	}
	return &verdictv1.ObservedFlow{Mesh: f.Mesh, Type: f.Type, Source: end(&f.Source), Destination: end(&f.Destination),
		Protocol: f.Protocol.String(), Port: f.Port, FirstSeen: timestamppb.New(f.First), LastSeen: timestamppb.New(f.Last),
		Count: f.Count, Action: Action(f.Action), Policy: f.Policy, Revision: f.Revision}
}

// ReplayEnd is an observed end as Impact replays it: a workload, address
// or principal as given (it resolves anew on each snapshot), an end given
// as tags or by identity as the tags it stood for.
func ReplayEnd(given inventory.Endpoint, tags resource.Tags) inventory.Endpoint {
	switch given.Form() {
	case inventory.FormWorkload, inventory.FormAddress, inventory.FormPrincipal:
		return inventory.Endpoint{Workload: given.Workload, Address: given.Address, Principal: given.Principal}
	case inventory.FormIdentity:
		return inventory.Endpoint{Tags: tags}
	}
	return inventory.Endpoint{Tags: given.Tags}
}

// ReplayFlow is a flow of the table to replay (ReplayEnd).
func ReplayFlow(f *observed.Flow) analysis.ObservedFlow {
	return analysis.ObservedFlow{Mesh: f.Mesh, Type: f.Type, Source: ReplayEnd(f.Source.Given, f.Source.Tags),
		Destination: ReplayEnd(f.Destination.Given, f.Destination.Tags), Protocol: f.Protocol, Port: f.Port, Count: f.Count}
}

// ReplayFlowProto is a flow another replica observed, to replay
// (ReplayEnd); false for a protocol this build does not know.
func ReplayFlowProto(f *verdictv1.ObservedFlow) (analysis.ObservedFlow, bool) {
	p, err := resource.ParseProtocol(f.GetProtocol())
	if err != nil {
		return analysis.ObservedFlow{}, false
	}
	end := func(e *verdictv1.ObservedEnd) inventory.Endpoint {
		_, ep := Endpoint(e.GetGiven())
		given := inventory.Endpoint{Tags: e.GetGiven().GetTags()}
		if ep != nil {
			given = *ep
		}
		return ReplayEnd(given, e.GetTags())
	}
	return analysis.ObservedFlow{Mesh: f.GetMesh(), Type: f.GetType(), Source: end(f.GetSource()), Destination: end(f.GetDestination()),
		Protocol: p, Port: f.GetPort(), Count: f.GetCount()}, true
}
