package peers

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cedar-policy/cedar-go"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Cedar is cedar-go. Each rule is a permit (ALLOW) or forbid (DENY) policy with
// its conditions in a when clause; the principal is the source workload and the
// resource the destination, both Workload entities with a record attribute
// tags; the context is {protocol, port}.
//
// Cedar has no order: forbid wins over permit, and nothing matching denies. That
// is verdict's DenyOverrides (docs/order.md) with the default DENY, so Cedar
// is compared on sets generated with combine DenyOverrides. Cedar reports every
// policy that matched with the winning effect; Outcome.Policy is the first of
// them in verdict's order, as verdict reports it.
type Cedar struct {
	ps       *cedar.PolicySet
	policies []string // policy name by rule position (= policy ID)
}

var (
	workload      = cedar.EntityType("Workload")
	connect       = cedar.NewEntityUID("Action", "connect")
	sourceUID     = cedar.NewEntityUID(workload, "source")
	destinationID = cedar.NewEntityUID(workload, "destination")
)

// NewCedar parses the program's Cedar translation. Only DenyOverrides with a
// DENY default has Cedar's semantics; anything else is ErrNotTranslated.
func NewCedar(p *Program) (*Cedar, error) {
	if p.Combine != resource.DenyOverrides || p.DefaultAction != resource.Deny {
		return nil, fmt.Errorf("%w: cedar decides as DenyOverrides with default DENY, the set is %s with default %s",
			ErrNotTranslated, p.Combine, p.DefaultAction)
	}
	text, err := CedarPolicies(p)
	if err != nil {
		return nil, err
	}
	list, err := cedar.NewPolicyListFromBytes("verdict.cedar", []byte(text))
	if err != nil {
		return nil, fmt.Errorf("cedar: %w", err)
	}
	if len(list) != len(p.Rules) {
		return nil, fmt.Errorf("cedar: parsed %d policies from %d rules", len(list), len(p.Rules))
	}
	c := &Cedar{ps: cedar.NewPolicySet(), policies: make([]string, len(p.Rules))}
	for i, pol := range list {
		c.ps.Add(cedar.PolicyID(strconv.Itoa(i)), pol)
		c.policies[i] = p.Rules[i].Policy
	}
	return c, nil
}

// CedarPolicies returns the Cedar text of the program: one policy per rule, in
// order.
func CedarPolicies(p *Program) (string, error) {
	var b strings.Builder
	for i := range p.Rules {
		r := &p.Rules[i]
		var conds []string
		if err := selectorCedar(&conds, "principal", &r.Src); err != nil {
			return "", err
		}
		if err := selectorCedar(&conds, "resource", &r.Dst); err != nil {
			return "", err
		}
		if c := portsCedar(r.Ports); c != "" {
			conds = append(conds, c)
		}
		if len(conds) == 0 {
			conds = []string{"true"}
		}
		effect := "permit"
		if r.Action == resource.Deny {
			effect = "forbid"
		}
		fmt.Fprintf(&b, "// %s\n%s (principal, action == Action::\"connect\", resource)\nwhen {\n  %s\n};\n\n",
			r.Policy, effect, strings.Join(conds, " &&\n  "))
	}
	return b.String(), nil
}

func selectorCedar(conds *[]string, entity string, s *resource.Selector) error {
	tags := entity + ".tags"
	for _, k := range sortedKeys(s.Match) {
		has := tags + " has " + quote(k)
		if v := s.Match[k]; v == "*" {
			*conds = append(*conds, has)
		} else {
			*conds = append(*conds, has, tags+"["+quote(k)+"] == "+quote(v))
		}
	}
	for _, e := range s.Expressions {
		has := tags + " has " + quote(e.Key)
		set := make([]string, len(e.Values))
		for i, v := range e.Values {
			set[i] = quote(v)
		}
		in := "[" + strings.Join(set, ", ") + "].contains(" + tags + "[" + quote(e.Key) + "])"
		switch e.Operator {
		case resource.OpIn:
			*conds = append(*conds, has, in)
		case resource.OpNotIn:
			*conds = append(*conds, "(!("+has+") || !"+in+")")
		case resource.OpExists:
			*conds = append(*conds, has)
		case resource.OpDoesNotExist:
			*conds = append(*conds, "!("+has+")")
		default:
			return fmt.Errorf("%w: operator %s", ErrNotTranslated, e.Operator)
		}
	}
	return nil
}

// portsCedar returns the condition of the port entries, "" for all traffic.
func portsCedar(entries []Ports) string {
	if len(entries) == 0 {
		return ""
	}
	var alts []string
	for _, e := range entries {
		var parts []string
		if e.Protocol != resource.ProtocolAny {
			parts = append(parts, "context.protocol == "+quote(e.Protocol.String()))
		}
		if len(e.Ranges) > 0 && e.Protocol != resource.ICMP {
			var ranges []string
			for _, r := range e.Ranges {
				if r[0] == r[1] {
					ranges = append(ranges, fmt.Sprintf("context.port == %d", r[0]))
				} else {
					ranges = append(ranges, fmt.Sprintf("(context.port >= %d && context.port <= %d)", r[0], r[1]))
				}
			}
			if e.Protocol == resource.ProtocolAny { // ICMP ignores ports
				ranges = append(ranges, `context.protocol == "ICMP"`)
			}
			parts = append(parts, "("+strings.Join(ranges, " || ")+")")
		}
		if len(parts) == 0 {
			return ""
		}
		alts = append(alts, strings.Join(parts, " && "))
	}
	return "(" + strings.Join(alts, " || ") + ")"
}

// Decide implements Decider.
func (c *Cedar) Decide(req *engine.Request) (Outcome, error) {
	entities := cedar.EntityMap{
		sourceUID:     {UID: sourceUID, Attributes: tagsRecord(req.Source)},
		destinationID: {UID: destinationID, Attributes: tagsRecord(req.Destination)},
	}
	dec, diag := cedar.Authorize(c.ps, entities, cedar.Request{
		Principal: sourceUID, Action: connect, Resource: destinationID,
		Context: cedar.NewRecord(cedar.RecordMap{
			"protocol": cedar.String(req.Protocol.String()),
			"port":     cedar.Long(req.Port),
		}),
	})
	if len(diag.Errors) > 0 {
		return Outcome{}, fmt.Errorf("cedar: %s", diag.Errors[0])
	}
	out := Outcome{Action: resource.Deny}
	if dec == cedar.Allow {
		out.Action = resource.Allow
	}
	first := -1
	for _, r := range diag.Reasons {
		i, err := strconv.Atoi(string(r.PolicyID))
		if err != nil {
			return Outcome{}, fmt.Errorf("cedar: policy id %q", r.PolicyID)
		}
		if first < 0 || i < first {
			first = i
		}
	}
	if first >= 0 {
		out.Policy = c.policies[first]
	}
	return out, nil
}

func tagsRecord(tags resource.Tags) cedar.Record {
	m := make(cedar.RecordMap, len(tags))
	for k, v := range tags {
		m[cedar.String(k)] = cedar.String(v)
	}
	return cedar.NewRecord(cedar.RecordMap{"tags": cedar.NewRecord(m)})
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
