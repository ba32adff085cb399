package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// OPA is OPA, in process, deciding with a prepared query. Its input is
// {source: {tags}, destination: {tags}, protocol: "TCP" | "", port: n}, built as
// an AST value per flow (what an in-process caller would do; it saves OPA the
// conversion from Go maps).
type OPA struct {
	query rego.PreparedEvalQuery
}

// opaGeneric is the data formulation: one generic module that matches the input
// against every rule in data.policies.rules and takes the smallest position.
const opaGeneric = `package verdict

default decision := {"action": %q, "policy": ""}

decision := {"action": r.action, "policy": r.name} if {
	r := data.policies.rules[min(matching)]
}

# The concrete values are checked first: they reject most rules.
matching contains i if {
	some i, r in data.policies.rules
	object.subset(input.source, r.src.exact)
	object.subset(input.destination, r.dst.exact)
	selects(r.src, input.source)
	selects(r.dst, input.destination)
	ports_match(r.ports)
}

selects(sel, tags) if {
	every k in sel.present {
		tags[k]
	}
	every e in sel.expressions {
		holds(e, tags)
	}
}

holds(e, tags) if {
	e.op == "In"
	tags[e.key] in e.values
}

# "not tags[e.key] in e.values" would be false, not true, for a missing key:
# OPA evaluates the arguments of a negated call outside the negation.
holds(e, tags) if {
	e.op == "NotIn"
	not tag_in(tags, e.key, e.values)
}

tag_in(tags, key, values) if tags[key] in values

holds(e, tags) if {
	e.op == "Exists"
	tags[e.key]
}

holds(e, tags) if {
	e.op == "DoesNotExist"
	not tags[e.key]
}

ports_match(ports) if count(ports) == 0

ports_match(ports) if {
	some e in ports
	protocol_is(e.protocol)
	port_in(e)
}

protocol_is("")

protocol_is(p) if p == input.protocol

port_in(e) if count(e.ranges) == 0

port_in(_) if input.protocol == "ICMP"

port_in(e) if {
	some r in e.ranges
	r[0] <= input.port
	input.port <= r[1]
}
`

// NewOPAData loads the program as JSON data under one generic Rego rule.
func NewOPAData(ctx context.Context, p *Program) (*OPA, error) {
	rules := make([]any, len(p.Rules))
	for i := range p.Rules {
		r := &p.Rules[i]
		ports := make([]any, len(r.Ports))
		for j, e := range r.Ports {
			ranges := make([]any, len(e.Ranges))
			for k, rg := range e.Ranges {
				ranges[k] = []any{rg[0], rg[1]}
			}
			ports[j] = map[string]any{"protocol": e.Protocol.String(), "ranges": ranges}
		}
		rules[i] = map[string]any{
			"name": r.Policy, "action": r.Action.String(),
			"src": selectorData(&r.Src), "dst": selectorData(&r.Dst), "ports": ports,
		}
	}
	// Round-tripping on write turns the Go values into JSON values; returning AST
	// values on read spares every evaluation the conversion (the OPA server's way).
	store := inmem.NewFromObjectWithOpts(map[string]any{"policies": map[string]any{"rules": rules}},
		inmem.OptRoundTripOnWrite(true), inmem.OptReturnASTValuesOnRead(true))
	return prepare(ctx, fmt.Sprintf(opaGeneric, p.DefaultAction), rego.Store(store))
}

// selectorData splits the match entries: concrete values in exact (checked with
// one object.subset), '*' keys in present.
func selectorData(s *resource.Selector) map[string]any {
	exact, present := map[string]any{}, []any{}
	for _, k := range sortedKeys(s.Match) {
		if v := s.Match[k]; v == "*" {
			present = append(present, k)
		} else {
			exact[k] = v
		}
	}
	exprs := make([]any, len(s.Expressions))
	for i, e := range s.Expressions {
		values := make([]any, len(e.Values))
		for j, v := range e.Values {
			values[j] = v
		}
		exprs[i] = map[string]any{"key": e.Key, "op": e.Operator.String(), "values": values}
	}
	return map[string]any{"exact": exact, "present": present, "expressions": exprs}
}

// NewOPARules compiles the program to one Rego rule per policy rule (one body
// per port range), each contributing [position, policy, action] to the set
// match when its conditions hold; decision takes the smallest.
func NewOPARules(ctx context.Context, p *Program) (*OPA, error) {
	src, err := OPARulesModule(p)
	if err != nil {
		return nil, err
	}
	return prepare(ctx, src)
}

// OPARulesModule returns the Rego module of the rules formulation.
func OPARulesModule(p *Program) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "package verdict\n\ndefault decision := {\"action\": %q, \"policy\": \"\"}\n\n", p.DefaultAction)
	if len(p.Rules) == 0 { // match would be undefined
		return b.String(), nil
	}
	b.WriteString("decision := {\"action\": m[2], \"policy\": m[1]} if m := min(match)\n\n")
	b.WriteString("tag_in(tags, key, values) if tags[key] in values\n")
	for i := range p.Rules {
		r := &p.Rules[i]
		var conds []string
		if err := selectorRego(&conds, "input.source", &r.Src); err != nil {
			return "", err
		}
		if err := selectorRego(&conds, "input.destination", &r.Dst); err != nil {
			return "", err
		}
		head := fmt.Sprintf("\nmatch contains [%d, %s, %q] if {\n", r.Order, quote(r.Policy), r.Action)
		for _, ports := range portsRego(r.Ports) {
			b.WriteString(head)
			body := append(conds[:len(conds):len(conds)], ports...)
			if len(body) == 0 {
				body = []string{"true"}
			}
			for _, c := range body {
				b.WriteString("\t" + c + "\n")
			}
			b.WriteString("}\n")
		}
	}
	return b.String(), nil
}

// selectorRego appends one condition per part of the selector.
func selectorRego(conds *[]string, ref string, s *resource.Selector) error {
	for _, k := range sortedKeys(s.Match) {
		tag := ref + "[" + quote(k) + "]"
		if v := s.Match[k]; v == "*" {
			*conds = append(*conds, tag)
		} else {
			*conds = append(*conds, tag+" == "+quote(v))
		}
	}
	for _, e := range s.Expressions {
		tag := ref + "[" + quote(e.Key) + "]"
		set := make([]string, len(e.Values))
		for i, v := range e.Values {
			set[i] = quote(v)
		}
		values := "{" + strings.Join(set, ", ") + "}"
		switch e.Operator {
		case resource.OpIn:
			*conds = append(*conds, tag+" in "+values)
		case resource.OpNotIn: // "not tag in values" is false, not true, for a missing tag
			*conds = append(*conds, "not tag_in("+ref+", "+quote(e.Key)+", "+values+")")
		case resource.OpExists:
			*conds = append(*conds, tag)
		case resource.OpDoesNotExist:
			*conds = append(*conds, "not "+tag)
		default:
			return fmt.Errorf("%w: operator %s", ErrNotTranslated, e.Operator)
		}
	}
	return nil
}

// portsRego returns the alternatives of the port entries: one list of
// conditions per body. No entries: one empty alternative.
func portsRego(entries []Ports) [][]string {
	if len(entries) == 0 {
		return [][]string{nil}
	}
	var alts [][]string
	for _, e := range entries {
		var proto []string
		if e.Protocol != resource.ProtocolAny {
			proto = []string{"input.protocol == " + quote(e.Protocol.String())}
		}
		if len(e.Ranges) == 0 || e.Protocol == resource.ICMP {
			alts = append(alts, proto)
			continue
		}
		for _, r := range e.Ranges {
			c := append(proto[:len(proto):len(proto)], fmt.Sprintf("input.port >= %d", r[0]), fmt.Sprintf("input.port <= %d", r[1]))
			if r[0] == r[1] {
				c = append(proto[:len(proto):len(proto)], fmt.Sprintf("input.port == %d", r[0]))
			}
			alts = append(alts, c)
		}
		if e.Protocol == resource.ProtocolAny { // ICMP ignores ports
			alts = append(alts, []string{`input.protocol == "ICMP"`})
		}
	}
	return alts
}

func prepare(ctx context.Context, module string, opts ...func(*rego.Rego)) (*OPA, error) {
	opts = append(opts, rego.Query("data.verdict.decision"), rego.Module("verdict.rego", module))
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("opa: %w", err)
	}
	return &OPA{query: pq}, nil
}

// Decide implements Decider.
func (o *OPA) Decide(req *engine.Request) (Outcome, error) {
	rs, err := o.query.Eval(context.Background(), rego.EvalParsedInput(opaInput(req)))
	if err != nil {
		return Outcome{}, err
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return Outcome{}, fmt.Errorf("opa: %d results", len(rs))
	}
	d, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return Outcome{}, fmt.Errorf("opa: decision is %T", rs[0].Expressions[0].Value)
	}
	out := Outcome{Action: resource.Deny}
	if d["action"] == "ALLOW" {
		out.Action = resource.Allow
	}
	out.Policy, _ = d["policy"].(string)
	return out, nil
}

func opaInput(req *engine.Request) ast.Value {
	return ast.NewObject(
		ast.Item(ast.InternedTerm("source"), tagsTerm(req.Source)),
		ast.Item(ast.InternedTerm("destination"), tagsTerm(req.Destination)),
		ast.Item(ast.InternedTerm("protocol"), ast.StringTerm(req.Protocol.String())),
		ast.Item(ast.InternedTerm("port"), ast.IntNumberTerm(int(req.Port))),
	)
}

func tagsTerm(tags resource.Tags) *ast.Term {
	items := make([][2]*ast.Term, 0, len(tags))
	for k, v := range tags {
		items = append(items, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
	}
	return ast.NewTerm(ast.NewObject(items...))
}

// quote writes s as a Rego (JSON) string literal.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
