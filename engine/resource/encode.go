package resource

import (
	"encoding/json"
	"time"
)

// EncodeJSON returns the canonical JSON document of a resource: the form stored
// in etcd and carried by the API (it is the protobuf JSON of verdict.v1's
// resource messages). Defaults are left out; DecodeJSON(EncodeJSON(r)) equals r
// but for the store's revisions.
func EncodeJSON(r Resource) ([]byte, error) {
	return json.Marshal(document(r))
}

// DocumentOf returns the canonical document of a resource as a generic tree.
func DocumentOf(r Resource) Object {
	b, err := EncodeJSON(r)
	if err != nil {
		return nil
	}
	v, err := ParseJSON(b)
	if err != nil {
		return nil
	}
	o, _ := v.(Object)
	return o
}

func encodedSize(r Resource) int {
	b, err := EncodeJSON(r)
	if err != nil {
		return MaxResourceBytes + 1
	}
	return len(b)
}

type jsonMesh struct {
	Kind             string                      `json:"kind"`
	Name             string                      `json:"name"`
	DefaultAction    string                      `json:"defaultAction,omitempty"`
	UnenforcedAction string                      `json:"unenforcedAction,omitempty"`
	TieBreak         string                      `json:"tieBreak,omitempty"`
	ItemOrder        string                      `json:"itemOrder,omitempty"`
	InvalidResources string                      `json:"invalidResources,omitempty"`
	Profile          string                      `json:"profile,omitempty"`
	Types            map[string]jsonTypeSettings `json:"types,omitempty"`
	StrictTypes      bool                        `json:"strictTypes,omitempty"`
	CreationTime     string                      `json:"creationTime,omitempty"`
	ModificationTime string                      `json:"modificationTime,omitempty"`
}

type jsonTypeSettings struct {
	Combine          string `json:"combine,omitempty"`
	DefaultAction    string `json:"defaultAction,omitempty"`
	UnenforcedAction string `json:"unenforcedAction,omitempty"`
	Select           string `json:"select,omitempty"`
	TieBreak         string `json:"tieBreak,omitempty"`
}

type jsonScope struct {
	Kind             string         `json:"kind"`
	Mesh             string         `json:"mesh"`
	Name             string         `json:"name"`
	Parent           string         `json:"parent,omitempty"`
	Priority         int32          `json:"priority,omitempty"`
	Selectors        []jsonSelector `json:"selectors"`
	CatchAll         string         `json:"catchAll,omitempty"`
	CatchAllTypes    *[]string      `json:"catchAllTypes,omitempty"`
	Enforced         *bool          `json:"enforced,omitempty"`
	Mode             string         `json:"mode,omitempty"`
	CreationTime     string         `json:"creationTime,omitempty"`
	ModificationTime string         `json:"modificationTime,omitempty"`
}

type jsonSelector struct {
	Match       map[string]string `json:"match,omitempty"`
	Expressions []jsonExpression  `json:"expressions,omitempty"`
}

type jsonExpression struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

type jsonPort struct {
	Protocol string `json:"protocol,omitempty"`
	Ports    string `json:"ports,omitempty"`
}

type jsonTargetRef struct {
	Kind        string            `json:"kind"`
	Name        string            `json:"name,omitempty"`
	Tags        map[string]string `json:"tags,omitempty"`
	Expressions []jsonExpression  `json:"expressions,omitempty"`
}

type jsonItem struct {
	TargetRef jsonTargetRef `json:"targetRef"`
	Action    string        `json:"action,omitempty"`
	Conf      Object        `json:"conf,omitempty"`
}

type jsonBlock struct {
	Strategy string `json:"strategy,omitempty"`
	When     string `json:"when,omitempty"`
	Rules    Object `json:"rules"`
}

type jsonPolicy struct {
	Kind             string         `json:"kind"`
	Mesh             string         `json:"mesh"`
	Name             string         `json:"name"`
	Type             string         `json:"type"`
	Scope            string         `json:"scope,omitempty"`
	Rank             string         `json:"rank,omitempty"`
	Priority         int32          `json:"priority,omitempty"`
	Sources          []jsonSelector `json:"sources,omitempty"`
	Destinations     []jsonSelector `json:"destinations,omitempty"`
	Ports            []jsonPort     `json:"ports,omitempty"`
	Action           string         `json:"action,omitempty"`
	Conf             Object         `json:"conf,omitempty"`
	TargetRef        *jsonTargetRef `json:"targetRef,omitempty"`
	From             []jsonItem     `json:"from,omitempty"`
	To               []jsonItem     `json:"to,omitempty"`
	Defaults         *jsonBlock     `json:"defaults,omitempty"`
	Overrides        *jsonBlock     `json:"overrides,omitempty"`
	Unset            []string       `json:"unset,omitempty"`
	Mode             string         `json:"mode,omitempty"`
	DenyFirst        bool           `json:"denyFirst,omitempty"`
	CreationTime     string         `json:"creationTime,omitempty"`
	ModificationTime string         `json:"modificationTime,omitempty"`
}

func document(r Resource) any {
	switch t := r.(type) {
	case *Mesh:
		m := jsonMesh{
			Kind: "Mesh", Name: t.Name, StrictTypes: t.StrictTypes,
			DefaultAction: t.DefaultAction.String(), UnenforcedAction: t.UnenforcedAction.String(),
			CreationTime: jsonTime(t.Meta.CreationTime), ModificationTime: jsonTime(t.Meta.ModificationTime),
		}
		m.TieBreak = t.TieBreak.String()
		m.ItemOrder = t.ItemOrder.String()
		m.Profile = t.Profile.String()
		if t.InvalidResources != InvalidDeny {
			m.InvalidResources = t.InvalidResources.String()
		}
		if len(t.Types) > 0 {
			m.Types = make(map[string]jsonTypeSettings, len(t.Types))
			for k, ts := range t.Types {
				j := jsonTypeSettings{DefaultAction: ts.DefaultAction.String(), UnenforcedAction: ts.UnenforcedAction.String(),
					Select: ts.Select.String(), TieBreak: ts.TieBreak.String()}
				if ts.Combine != FirstMatch {
					j.Combine = ts.Combine.String()
				}
				m.Types[k] = j
			}
		}
		return m
	case *Scope:
		s := jsonScope{
			Kind: "Scope", Mesh: t.Mesh, Name: t.Name, Parent: t.Parent, Priority: t.Priority,
			Selectors: jsonSelectors(t.Selectors), CatchAll: t.CatchAll.String(),
			CreationTime: jsonTime(t.Meta.CreationTime), ModificationTime: jsonTime(t.Meta.ModificationTime),
		}
		if t.CatchAllTypes != nil {
			l := append([]string{}, t.CatchAllTypes...)
			s.CatchAllTypes = &l
		}
		if !t.Enforced {
			f := false
			s.Enforced = &f
		}
		if t.Mode == ModeAudit {
			s.Mode = t.Mode.String()
		}
		return s
	case *Policy:
		p := jsonPolicy{
			Kind: "Policy", Mesh: t.Mesh, Name: t.Name, Type: t.Type, Scope: t.Scope, Priority: t.Priority,
			Sources: jsonSelectors(t.Sources), Destinations: jsonSelectors(t.Destinations),
			Action: t.Action.String(), Conf: t.Conf, Unset: t.Unset, DenyFirst: t.DenyFirst,
			CreationTime: jsonTime(t.Meta.CreationTime), ModificationTime: jsonTime(t.Meta.ModificationTime),
		}
		if t.Rank == RankAbsolute {
			p.Rank = "Absolute"
		}
		if t.Mode == ModeAudit {
			p.Mode = t.Mode.String()
		}
		for _, pe := range t.Ports {
			p.Ports = append(p.Ports, jsonPort{Protocol: ProtocolText(pe.Protocol), Ports: pe.Ports})
		}
		if t.TargetRef != nil {
			tr := jsonTarget(*t.TargetRef)
			p.TargetRef = &tr
		}
		p.From = jsonItems(t.From)
		p.To = jsonItems(t.To)
		p.Defaults = jsonBlockOf(t.Defaults)
		p.Overrides = jsonBlockOf(t.Overrides)
		return p
	case *Workload:
		return workloadDocument(t)
	}
	return nil
}

func ProtocolText(p Protocol) string {
	if p == ProtocolAny {
		return "ANY"
	}
	return p.String()
}

func jsonSelectors(sels []Selector) []jsonSelector {
	if sels == nil {
		return nil
	}
	out := make([]jsonSelector, len(sels))
	for i, s := range sels {
		out[i].Match = s.Match
		for _, e := range s.Expressions {
			out[i].Expressions = append(out[i].Expressions, jsonExpression{Key: e.Key, Operator: e.Operator.String(), Values: e.Values})
		}
	}
	return out
}

func jsonTarget(t TargetRef) jsonTargetRef {
	j := jsonTargetRef{Kind: t.Kind.String(), Name: t.Name, Tags: t.Tags}
	for _, e := range t.Expressions {
		j.Expressions = append(j.Expressions, jsonExpression{Key: e.Key, Operator: e.Operator.String(), Values: e.Values})
	}
	return j
}

func jsonItems(items []Item) []jsonItem {
	if items == nil {
		return nil
	}
	out := make([]jsonItem, len(items))
	for i, it := range items {
		out[i] = jsonItem{TargetRef: jsonTarget(it.TargetRef), Action: it.ItemActionText(), Conf: it.Conf}
	}
	return out
}

func jsonBlockOf(b *Block) *jsonBlock {
	if b == nil {
		return nil
	}
	rules := b.Rules
	if rules == nil {
		rules = Object{}
	}
	return &jsonBlock{Strategy: b.Strategy.String(), When: b.When, Rules: rules}
}

func jsonTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
