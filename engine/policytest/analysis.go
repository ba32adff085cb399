package policytest

// reach and impact cases (docs/suites.md): the analysis answers of the
// engine (docs/analysis.md), checked offline like decide cases.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// reachOf makes a reach request of a case's request: exactly one of source
// (what it can reach) and destination (who can reach it).
func reachOf(r request) (*analysis.ReachRequest, error) {
	src := r.Source != nil || r.SourceEndpoint != nil
	dst := r.Destination != nil || r.DestinationEndpoint != nil
	if src == dst {
		return nil, errors.New("give exactly one of source (what it can reach) and destination (who can reach it)")
	}
	out := &analysis.ReachRequest{Mesh: r.Mesh, Type: r.Type, Protocol: r.Protocol, Port: r.Port, Destination: dst}
	tags, ep := r.Source, r.SourceEndpoint
	if dst {
		tags, ep = r.Destination, r.DestinationEndpoint
	}
	if ep != nil {
		out.Endpoint = *ep
	} else {
		out.Endpoint = inventory.Endpoint{Tags: tags}
	}
	return out, nil
}

// parseImpact reads an impact case: apply (documents), delete (keys) and
// flows (requests as decide cases write them, observed once each).
func parseImpact(v any) (*impactCase, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("an object with apply, delete and flows is required")
	}
	ic := &impactCase{}
	for k, val := range m {
		switch k {
		case "apply":
			l, ok := val.([]any)
			if !ok {
				return nil, errors.New("apply: a list of documents is required")
			}
			ic.apply = l
		case "delete":
			l, ok := val.([]any)
			if !ok {
				return nil, errors.New("delete: a list of keys is required")
			}
			for i, x := range l {
				s, _ := x.(string)
				key, err := resource.ParseKey(s)
				if err != nil {
					return nil, fmt.Errorf("delete[%d]: %w", i, err)
				}
				ic.delete = append(ic.delete, key)
			}
		case "flows":
			l, ok := val.([]any)
			if !ok {
				return nil, errors.New("flows: a list of flows is required")
			}
			for i, x := range l {
				r, err := parseRequest(x, false)
				if err != nil {
					return nil, fmt.Errorf("flows[%d]: %w", i, err)
				}
				f := analysis.ObservedFlow{Mesh: r.Mesh, Type: r.Type, Protocol: r.Protocol, Port: r.Port, Count: 1}
				f.Source, f.Destination = endpointOf(r.Source, r.SourceEndpoint), endpointOf(r.Destination, r.DestinationEndpoint)
				ic.flows = append(ic.flows, f)
			}
		default:
			return nil, fmt.Errorf("unknown field %q (an impact case has apply, delete and flows)", k)
		}
	}
	if len(ic.apply)+len(ic.delete) == 0 {
		return nil, errors.New("give the change: apply and/or delete")
	}
	return ic, nil
}

func endpointOf(tags resource.Tags, ep *inventory.Endpoint) inventory.Endpoint {
	if ep != nil {
		return *ep
	}
	return inventory.Endpoint{Tags: tags}
}

// runReach checks expect.workloads (the allowed workloads' names, in any
// order) and expect.outside (the allowed classes outside the inventory, as
// text: "any address", "10.0.0.0/8", "principal spiffe://m/web*").
func (s *Suite) runReach(c Case) []string {
	ans, err := analysis.Reach(s.Snapshot, c.Reach)
	if p, done := checkError(c.Expect, err); done {
		return p
	}
	var workloads, outside []string
	for _, e := range ans.Entries {
		if e.Workload != "" {
			workloads = append(workloads, e.Workload)
		} else {
			outside = append(outside, e.Outside.String())
		}
	}
	var problems []string
	for k, want := range c.Expect {
		switch k {
		case "workloads":
			problems = compareSet(problems, k, want, workloads)
		case "outside":
			problems = compareSet(problems, k, want, outside)
		default:
			problems = append(problems, fmt.Sprintf("expect.%s does not apply to a reach case", k))
		}
	}
	slices.Sort(problems)
	return problems
}

// runImpact checks expect.changes (how many flows change, their deciding
// policy or their action) and expect.flows (the flows whose action changes,
// as "SRC -> DST PORTS: BEFORE -> AFTER", in any order).
func (s *Suite) runImpact(c Case) []string {
	var puts []resource.Resource
	for i, v := range c.Impact.apply {
		r, err := resource.DecodeValue(v)
		if err != nil {
			var ve *resource.ValidationError
			if errors.As(err, &ve) {
				err = ve.Prefixed(fmt.Sprintf("impact.apply[%d]", i))
			}
			p, _ := checkError(c.Expect, err)
			return p
		}
		puts = append(puts, r)
	}
	ans, err := analysis.Impact(s.Snapshot, &analysis.ImpactRequest{Puts: puts, Deletes: c.Impact.delete, Flows: c.Impact.flows})
	if p, done := checkError(c.Expect, err); done {
		return p
	}
	var flows []string
	for _, ch := range ans.Changes {
		if ch.Before.Action != ch.After.Action || ch.BeforeErr != "" || ch.AfterErr != "" {
			flows = append(flows, ChangeText(ch))
		}
	}
	var problems []string
	for k, want := range c.Expect {
		switch k {
		case "changes":
			problems = compareField(problems, k, want, fmt.Sprint(len(ans.Changes)))
		case "flows":
			problems = compareSet(problems, k, want, flows)
		default:
			problems = append(problems, fmt.Sprintf("expect.%s does not apply to an impact case", k))
		}
	}
	slices.Sort(problems)
	return problems
}

// ChangeText is a changed flow as one line: "backend-1 -> db-1 TCP 5432:
// ALLOW -> DENY".
func ChangeText(ch analysis.ImpactChange) string {
	action := func(d engine.Decision, errText string) string {
		if errText != "" {
			return "NONE"
		}
		return d.Action.String()
	}
	return fmt.Sprintf("%s -> %s %s: %s -> %s", endText(ch.Source), endText(ch.Destination), ch.Class,
		action(ch.Before, ch.BeforeErr), action(ch.After, ch.AfterErr))
}

func endText(e inventory.Endpoint) string {
	switch {
	case e.Workload != "":
		return e.Workload
	case e.Address != "":
		return e.Address
	case e.Principal != "":
		return e.Principal
	case e.Identity != 0:
		return fmt.Sprint(e.Identity)
	}
	keys := make([]string, 0, len(e.Tags))
	for k, v := range e.Tags {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	return "{" + strings.Join(keys, ",") + "}"
}

// compareSet compares a list of strings as a set.
func compareSet(problems []string, name string, want any, got []string) []string {
	l, ok := want.([]any)
	if !ok {
		return append(problems, fmt.Sprintf("expect.%s: a list is required", name))
	}
	var w []string
	for _, x := range l {
		t, err := text(x)
		if err != nil {
			return append(problems, fmt.Sprintf("expect.%s: %v", name, err))
		}
		w = append(w, t)
	}
	slices.Sort(w)
	g := slices.Clone(got)
	slices.Sort(g)
	if !slices.Equal(w, g) {
		return append(problems, fmt.Sprintf("%s: expected %v, got %v", name, w, g))
	}
	return problems
}
