package conditions

// Quick witnesses: before a changed or affected policy is linted, each of
// its rules is tried on its simplest flow — the tags its ends require and
// nothing else, a protocol and port its ports admit — and Decide says
// whether the rule decides it. A rule that does is not shadowed, and the
// flow is kept as its witness; a policy whose every rule has one needs no
// lint. Decide is the decision itself, so a quick witness is exact; a rule
// it does not settle goes to lint.

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// simplest returns the tags a matcher requires and nothing else (a present
// key, or Exists, with a value of its own; In with its first value); false
// when the matcher asks more (NotIn, a CIDR, a prefix) or never holds.
func simplest(m *index.Matcher) (resource.Tags, bool) {
	t := resource.Tags{}
	if m == nil {
		return t, true
	}
	if m.Sel == nil {
		return t, m.Matches(t)
	}
	for k, v := range m.Sel.Match {
		if v == "*" {
			v = "x"
		}
		t[k] = v
	}
	for _, e := range m.Sel.Expressions {
		switch {
		case e.Operator == resource.OpIn && len(e.Values) > 0:
			if _, ok := t[e.Key]; !ok {
				t[e.Key] = e.Values[0]
			}
		case e.Operator == resource.OpExists:
			if _, ok := t[e.Key]; !ok {
				t[e.Key] = "x"
			}
		case e.Operator == resource.OpDoesNotExist:
		default:
			return nil, false
		}
	}
	return t, m.Matches(t)
}

// quickWitness returns a flow r decides, found by Decide on its simplest
// flow; nil when that flow is decided otherwise.
func (j *judgement) quickWitness(r *index.Rule) *flow {
	src, ok1 := simplest(r.Src)
	dst, ok2 := simplest(r.Dst)
	if !ok1 || !ok2 {
		return nil
	}
	req := &engine.Request{Mesh: j.st.mesh, Type: j.st.typ, Source: src, Destination: dst, NoCache: true}
	if len(r.Ports) > 0 {
		e := r.Ports[0]
		req.Protocol = e.Protocol
		if req.Protocol == resource.ProtocolAny {
			req.Protocol = resource.TCP
		}
		if len(e.Ranges) > 0 && req.Protocol != resource.ICMP {
			req.Port = uint32(e.Ranges[0].Lo)
		}
	}
	d, err := j.s.Decide(req)
	if err != nil {
		return nil
	}
	for side, sd := range [2]engine.SideDecision{d.Outbound, d.Inbound} {
		if sd.Reason == engine.ReasonMatched && sd.Policy == r.PolicyName() && sd.Rule == r.ID {
			return &flow{src: pairsOf(src), dst: pairsOf(dst), proto: req.Protocol, port: req.Port, side: side}
		}
	}
	return nil
}

func pairsOf(t resource.Tags) []index.TagKV {
	out := make([]index.TagKV, 0, len(t))
	for k, v := range t {
		out = append(out, index.TagKV{K: k, V: v})
	}
	return out
}

// settleQuickly gives the policy its rules' quick witnesses when each of
// them has one (none of them is then shadowed); false, and nothing
// changed, when one has none.
func (j *judgement) settleQuickly(name string) bool {
	ps, ok := j.b.Get(name)
	if !ok || !ps.judging() {
		return false
	}
	decided := map[string]*flow{}
	for _, r := range ps.rules {
		if r.Audit {
			continue
		}
		f := j.quickWitness(r)
		if f == nil {
			return false
		}
		decided[r.ID] = f
	}
	ps = j.edit(name)
	ps.shadowed, ps.unproven, ps.covers, ps.decided = nil, false, nil, decided
	return true
}
