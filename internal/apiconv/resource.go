package apiconv

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Engine resources to API messages, field by field (the watch, Get and List
// paths). The result is the message whose protobuf JSON is the engine's
// canonical document (resource.EncodeJSON): defaults left out as the document
// leaves them out, enums as their names. TestDirectMappingEqualsJSON holds the
// two equal over every conformance resource.

// ResourceToProto encodes an engine resource as an API resource. The message
// shares the resource's maps and slices (tags, values, unset, catch-all types):
// like the resource, it must not be modified.
func ResourceToProto(r resource.Resource) (*verdictv1.Resource, error) {
	switch t := r.(type) {
	case *resource.Mesh:
		return &verdictv1.Resource{Resource: &verdictv1.Resource_Mesh{Mesh: meshToProto(t)}}, nil
	case *resource.Scope:
		return &verdictv1.Resource{Resource: &verdictv1.Resource_Scope{Scope: scopeToProto(t)}}, nil
	case *resource.Policy:
		p, err := policyToProto(t)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.Key(), err)
		}
		return &verdictv1.Resource{Resource: &verdictv1.Resource_Policy{Policy: p}}, nil
	case *resource.Workload:
		return WorkloadToProto(t), nil
	}
	return nil, fmt.Errorf("unknown resource type %T", r)
}

func meshToProto(m *resource.Mesh) *verdictv1.Mesh {
	out := &verdictv1.Mesh{Kind: "Mesh", Name: m.Name,
		DefaultAction: m.DefaultAction.String(), UnenforcedAction: m.UnenforcedAction.String(), StrictTypes: m.StrictTypes,
		CreationTime: timestamp(m.Meta.CreationTime), ModificationTime: timestamp(m.Meta.ModificationTime)}
	out.TieBreak = m.TieBreak.String() // "" when unset (the profile's, else Name)
	out.ItemOrder = m.ItemOrder.String()
	out.Profile = m.Profile.String()
	if m.InvalidResources != resource.InvalidDeny {
		out.InvalidResources = m.InvalidResources.String()
	}
	if len(m.Types) > 0 {
		out.Types = make(map[string]*verdictv1.TypeSettings, len(m.Types))
		for name, ts := range m.Types {
			pts := &verdictv1.TypeSettings{DefaultAction: ts.DefaultAction.String(), UnenforcedAction: ts.UnenforcedAction.String(),
				Select: ts.Select.String(), TieBreak: ts.TieBreak.String()}
			if ts.Combine != resource.FirstMatch {
				pts.Combine = ts.Combine.String()
			}
			out.Types[name] = pts
		}
	}
	return out
}

func scopeToProto(s *resource.Scope) *verdictv1.Scope {
	out := &verdictv1.Scope{Kind: "Scope", Mesh: s.Mesh, Name: s.Name, Parent: s.Parent, Priority: s.Priority,
		Selectors: Selectors(s.Selectors), CatchAll: s.CatchAll.String(), CatchAllTypes: s.CatchAllTypes,
		CreationTime: timestamp(s.Meta.CreationTime), ModificationTime: timestamp(s.Meta.ModificationTime)}
	if !s.Enforced {
		f := false
		out.Enforced = &f
	}
	if s.Mode == resource.ModeAudit {
		out.Mode = s.Mode.String()
	}
	return out
}

func policyToProto(p *resource.Policy) (*verdictv1.Policy, error) {
	out := &verdictv1.Policy{Kind: "Policy", Mesh: p.Mesh, Name: p.Name, Type: p.Type, Scope: p.Scope, Priority: p.Priority,
		Sources: Selectors(p.Sources), Destinations: Selectors(p.Destinations), Action: p.Action.String(), Unset: p.Unset,
		CreationTime: timestamp(p.Meta.CreationTime), ModificationTime: timestamp(p.Meta.ModificationTime)}
	if p.Rank == resource.RankAbsolute {
		out.Rank = "Absolute"
	}
	if p.Mode == resource.ModeAudit {
		out.Mode = p.Mode.String()
	}
	out.DenyFirst = p.DenyFirst
	for _, pe := range p.Ports {
		proto := pe.Protocol.String()
		if proto == "" {
			proto = "ANY"
		}
		out.Ports = append(out.Ports, &verdictv1.PortEntry{Protocol: proto, Ports: pe.Ports})
	}
	var err error
	if out.Conf, err = confStruct(p.Conf, "conf"); err != nil {
		return nil, err
	}
	if p.TargetRef != nil {
		out.TargetRef = targetRefToProto(p.TargetRef)
	}
	if out.From, err = itemsToProto(p.From, "from"); err != nil {
		return nil, err
	}
	if out.To, err = itemsToProto(p.To, "to"); err != nil {
		return nil, err
	}
	if out.Defaults, err = blockToProto(p.Defaults, "defaults"); err != nil {
		return nil, err
	}
	if out.Overrides, err = blockToProto(p.Overrides, "overrides"); err != nil {
		return nil, err
	}
	return out, nil
}

func targetRefToProto(t *resource.TargetRef) *verdictv1.TargetRef {
	out := &verdictv1.TargetRef{Kind: t.Kind.String(), Name: t.Name, Tags: t.Tags}
	for _, e := range t.Expressions {
		out.Expressions = append(out.Expressions, &verdictv1.Expression{Key: e.Key, Operator: e.Operator.String(), Values: e.Values})
	}
	return out
}

func itemsToProto(items []resource.Item, field string) ([]*verdictv1.Item, error) {
	if items == nil {
		return nil, nil
	}
	out := make([]*verdictv1.Item, len(items))
	for i := range items {
		it := &items[i]
		conf, err := confStruct(it.Conf, fmt.Sprintf("%s[%d].conf", field, i))
		if err != nil {
			return nil, err
		}
		out[i] = &verdictv1.Item{TargetRef: targetRefToProto(&it.TargetRef), Action: it.ItemActionText(), Conf: conf}
	}
	return out, nil
}

// blockToProto: a block always carries its rules (an empty object when it has
// none) and its strategy, as the document does.
func blockToProto(b *resource.Block, field string) (*verdictv1.Block, error) {
	if b == nil {
		return nil, nil
	}
	rules, err := objectStruct(b.Rules, field+".rules")
	if err != nil {
		return nil, err
	}
	return &verdictv1.Block{Strategy: b.Strategy.String(), When: b.When, Rules: rules}, nil
}

// confStruct is a conf as the document has it: absent when empty.
func confStruct(o resource.Object, field string) (*structpb.Struct, error) {
	if len(o) == 0 {
		return nil, nil
	}
	return objectStruct(o, field)
}

// objectStruct converts an engine object; a number is a JSON number read as
// a double, as protobuf JSON reads it.
func objectStruct(o resource.Object, field string) (*structpb.Struct, error) {
	out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(o))}
	for k, v := range o {
		pv, err := value(v, field)
		if err != nil {
			return nil, err
		}
		out.Fields[k] = pv
	}
	return out, nil
}

func value(v any, field string) (*structpb.Value, error) {
	switch t := v.(type) {
	case nil:
		return structpb.NewNullValue(), nil
	case string:
		return structpb.NewStringValue(t), nil
	case bool:
		return structpb.NewBoolValue(t), nil
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: number %s: %w", field, t, err)
		}
		return structpb.NewNumberValue(f), nil
	case resource.Object:
		s, err := objectStruct(t, field)
		if err != nil {
			return nil, err
		}
		return structpb.NewStructValue(s), nil
	case []any:
		l := &structpb.ListValue{Values: make([]*structpb.Value, len(t))}
		for i, e := range t {
			pv, err := value(e, field)
			if err != nil {
				return nil, err
			}
			l.Values[i] = pv
		}
		return structpb.NewListValue(l), nil
	}
	pv, err := structpb.NewValue(v) // other Go numbers, should a caller build objects by hand
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return pv, nil
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
