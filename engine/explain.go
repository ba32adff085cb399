package engine

import (
	"fmt"
	"sort"
	"strings"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/resource"
)

// MaxExplainEntries bounds each list of an explanation.
const MaxExplainEntries = 1000

// Explanation is the trace of one decision (docs/explain.md): per side, the
// candidate rules in order and the policies that were not candidates.
type Explanation struct {
	Outbound SideTrace
	Inbound  SideTrace
}

// SideTrace explains one side.
type SideTrace struct {
	Members           []string // the workload's member scopes, in scope order
	MostSpecificScope string
	Reason            Reason
	Candidates        []CandidateTrace
	NotCandidates     []NonCandidate
	Truncated         bool // a list was cut at MaxExplainEntries
}

// CandidateTrace is one candidate rule as the side examined it.
type CandidateTrace struct {
	Policy   string
	Scope    string
	Phase    string // Absolute, Default, CatchAll
	Priority int32
	Rank     string // "exact 2, wildcard 1" for S&D rules; the targetRef level otherwise
	Rule     string // "sources[0]/destinations[0]", "from[1]", "catchAll"
	Action   resource.Action
	Matched  bool
	Decided  bool
	Why      string // why it did not match, or why it was not reached
	// Audit: the rule decides only the shadow decision (docs/audit.md).
	Audit bool
}

// NonCandidate is a policy of the type that has no candidate rule on the side.
type NonCandidate struct {
	Policy string
	Why    string
}

func (ms *meshState) explain(typ string, f *index.Flow, d *Decision) *Explanation {
	sc := &scratch{}
	sc.reset(ms.scopes.size())
	if ms.scopes.size() > 0 {
		sc.computeMembers(ms.scopes, 0, f.Src)
		sc.computeMembers(ms.scopes, 1, f.Dst)
	}
	ts, _ := ms.types.Get(typ)
	return &Explanation{
		Outbound: ms.traceSide(ts, typ, f, sc, 0, &d.Outbound),
		Inbound:  ms.traceSide(ts, typ, f, sc, 1, &d.Inbound),
	}
}

// candidates returns the rules of a type that are candidates on a side, in
// order, and the policies that have none, with the reason.
func (ms *meshState) candidates(ts *typeState, typ string, f *index.Flow, sc *scratch, side int) ([]*index.Rule, []NonCandidate) {
	var out []*index.Rule
	var non []NonCandidate
	workload, end := f.Src, "source"
	if side == 1 {
		workload, end = f.Dst, "destination"
	}
	if ts != nil {
		var names []string
		ts.policies.Range(func(name string, _ *compiledPolicy) bool {
			names = append(names, name)
			return true
		})
		sort.Strings(names)
		for _, name := range names {
			cp, _ := ts.policies.Get(name)
			if cp.err != "" {
				non = append(non, NonCandidate{Policy: name, Why: "invalid: " + cp.err})
				continue
			}
			before := len(out)
			for _, r := range cp.rules {
				if r.Sides&index.SideBits[side] == 0 || !sc.IsMember(side, r.Scope) {
					continue
				}
				if cp.p.TargetRef != nil {
					top := r.Dst
					if side == 0 {
						top = r.Src
					}
					if !top.Matches(workload) {
						continue
					}
				}
				out = append(out, r)
			}
			if len(out) > before {
				continue
			}
			non = append(non, NonCandidate{Policy: name, Why: ms.whyNotCandidate(cp, side, workload, end)})
		}
	}
	for _, c := range ms.scopes.catchAlls[typ] {
		if sc.IsMember(side, c.Scope) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.Less(&out[j].Key) })
	return out, non
}

func (ms *meshState) whyNotCandidate(cp *compiledPolicy, side int, workload resource.Tags, end string) string {
	p := cp.p
	if p.TargetRef == nil {
		si := cp.scope
		if si == nil {
			return "no rule" // unreachable: unscoped S&D rules are candidates on both sides
		}
		return fmt.Sprintf("the %s is not a member of scope %s (%s)", end, si.doc.Name, ms.whyNotMember(si, workload))
	}
	items := p.From
	if side == 0 {
		items = p.To
	}
	if len(items) == 0 {
		if side == 0 {
			return "it has no to items: targetRef policies are candidates on the outbound side through to items only"
		}
		return "it has no from items: targetRef policies are candidates on the inbound side through from items only"
	}
	top := index.CompileSelector(resource.TargetSelector(*p.TargetRef))
	return fmt.Sprintf("its targetRef %s does not select the %s: %s", targetText(*p.TargetRef), end, top.WhyNot(workload))
}

func (ms *meshState) whyNotMember(si *scopeInfo, tags resource.Tags) string {
	chain := append([]int32{si.ord}, si.ancestors...)
	for _, ord := range chain {
		s := ms.scopes.list[ord-1]
		matched := false
		var why []string
		for _, m := range s.selectors {
			if w := m.WhyNot(tags); w == "" {
				matched = true
				break
			} else {
				why = append(why, w)
			}
		}
		if !matched {
			if ord == si.ord {
				return "its selectors do not match: " + strings.Join(why, "; ")
			}
			return fmt.Sprintf("not a member of its ancestor %s: %s", s.doc.Name, strings.Join(why, "; "))
		}
	}
	return "member"
}

func targetText(t resource.TargetRef) string {
	s := t.Kind.String()
	if t.Name != "" {
		s += " " + t.Name
	}
	if len(t.Tags) > 0 {
		keys := make([]string, 0, len(t.Tags))
		for k := range t.Tags {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+"="+t.Tags[k])
		}
		s += " {" + strings.Join(parts, ",") + "}"
	}
	for _, e := range t.Expressions {
		s += fmt.Sprintf(" %s %s %v", e.Key, e.Operator, e.Values)
	}
	return s
}

func (ms *meshState) traceSide(ts *typeState, typ string, f *index.Flow, sc *scratch, side int, sd *SideDecision) SideTrace {
	tr := SideTrace{Reason: sd.Reason}
	for _, ord := range sortedOrds(sc.members[side]) {
		if !ms.scopes.list[ord-1].audit { // the enforced decision leaves audit scopes out
			tr.Members = append(tr.Members, ms.scopeName(ord))
		}
	}
	tr.MostSpecificScope = ms.scopeName(sc.specificEnf[side])
	cands, non := ms.candidates(ts, typ, f, sc, side)
	decided := false
	var chosen *compiledPolicy // select: PerDestination, the inbound side's policy
	perDest := side == 1 && ms.settings.forType(typ).perDestination
	if perDest {
		chosen = ms.chooseForDestination(ts, f.Dst, sc, false)
	}
	for _, r := range cands {
		ct := CandidateTrace{
			Policy: r.PolicyName(), Scope: ms.scopeName(r.Scope), Phase: index.PhaseNames[r.Key.Phase],
			Priority: r.Key.Priority, Rule: r.ID, Action: r.Action, Audit: r.Audit,
		}
		switch {
		case r.Policy == nil:
			ct.Rank = "catch-all"
		case r.Policy.TargetRef != nil:
			ct.Rank = r.Policy.TargetRef.Kind.String()
		default:
			ct.Rank = fmt.Sprintf("exact %d, wildcard %d", r.Key.Exact, r.Key.Total-r.Key.Exact)
		}
		ct.Why = whyRuleFails(r, f)
		ct.Matched = ct.Why == ""
		if r.Audit {
			if ct.Matched {
				ct.Why = "audit: left out of the enforced decision"
			}
		} else if !decided && sd.Reason.decidedByRule() && ct.Matched && ct.Policy == sd.Policy && ct.Rule == sd.Rule &&
			ct.Scope == sd.Scope {
			ct.Decided, decided = true, true
		} else if ct.Matched {
			switch {
			case sd.Reason == ReasonNotApplicable:
				ct.Why = "not examined: the side is not applicable"
			case sd.Reason == ReasonUnenforced:
				ct.Why = "not examined: the side is unenforced"
			case perDest && r.Policy != nil && (chosen == nil || r.Policy != chosen.p):
				ct.Why = "matches, but select: PerDestination chose " + chosenText(chosen) + " for this destination"
			case decided:
				ct.Why = "matches, but an earlier rule decided"
			default:
				ct.Why = fmt.Sprintf("matches, but the type combines with DenyOverrides and a %s rule decided", sd.Action)
			}
		}
		if len(tr.Candidates) == MaxExplainEntries {
			tr.Truncated = true
			break
		}
		tr.Candidates = append(tr.Candidates, ct)
	}
	if len(non) > MaxExplainEntries {
		non, tr.Truncated = non[:MaxExplainEntries], true
	}
	tr.NotCandidates = non
	return tr
}

func whyRuleFails(r *index.Rule, f *index.Flow) string {
	if r.Policy == nil {
		return ""
	}
	if !index.MatchesPorts(r.Ports, f.Proto, f.Port) {
		return fmt.Sprintf("%s outside ports %s", flowPortText(f), portsText(r.Ports))
	}
	if w := r.Src.WhyNot(f.Src); w != "" {
		return "source: " + w
	}
	if w := r.Dst.WhyNot(f.Dst); w != "" {
		return "destination: " + w
	}
	return ""
}

func flowPortText(f *index.Flow) string {
	p := f.Proto.String()
	if p == "" {
		p = "no protocol"
	}
	if f.Port == 0 {
		return p + ", no port"
	}
	return fmt.Sprintf("%s/%d", p, f.Port)
}

func portsText(entries []resource.PortEntry) string {
	var parts []string
	for _, e := range entries {
		s := resource.ProtocolText(e.Protocol)
		if e.Ports != "" {
			s += "/" + e.Ports
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func sortedOrds(ords []int32) []int32 {
	out := append([]int32(nil), ords...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
