package apiconv

import (
	"github.com/verdictpdp/verdict/engine/analysis"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// LintResponse is the API form of a lint answer.
func LintResponse(a *analysis.LintAnswer) *verdictv1.LintResponse {
	out := &verdictv1.LintResponse{Revision: a.Revision, Notes: a.Notes, Rules: uint64(a.Rules)}
	for i := range a.Findings {
		out.Findings = append(out.Findings, LintFinding(&a.Findings[i]))
	}
	for _, u := range a.Unproven {
		out.Unproven = append(out.Unproven, &verdictv1.LintUnproven{Kind: FindingKind(u.Kind), Mesh: u.Mesh, Type: u.Type,
			Policy: u.Policy, Rule: u.Rule, Why: u.Why})
	}
	return out
}

// FindingKind is the API form of a finding's kind.
func FindingKind(k analysis.FindingKind) verdictv1.FindingKind { return verdictv1.FindingKind(k) }

// LintFinding is the API form of a finding.
func LintFinding(f *analysis.Finding) *verdictv1.LintFinding {
	out := &verdictv1.LintFinding{Kind: FindingKind(f.Kind), Severity: verdictv1.Severity(f.Severity), Mesh: f.Mesh, Type: f.Type,
		Policy: f.Policy, Rule: f.Rule, Scope: f.Scope, Message: f.Message, Introduced: f.Introduced}
	for _, r := range f.Related {
		out.Related = append(out.Related, &verdictv1.LintRuleRef{Policy: r.Policy, Rule: r.Rule, Scope: r.Scope, Action: Action(r.Action)})
	}
	if w := f.Witness; w != nil {
		out.Witness = &verdictv1.LintWitness{Source: w.Source, Destination: w.Destination, Port: w.Port, Side: w.Side,
			Workloads: w.Workloads}
		if w.Side != "" {
			out.Witness.Protocol = w.Protocol.String()
			out.Witness.Decided = Side(&w.Decided)
		}
	}
	return out
}
