package analysis

// Lint (docs/lint.md): the rules that can never decide a flow, the rules
// whose removal changes no answer, the ties only the tie-break orders, the
// policies that select no workload, the sibling scopes that overlap and the
// audit policies that never change an answer — each with a witness flow
// that Decide confirms, or with the proof that none exists. The reasoning is
// over every flow, not only the inventory's (lintspace.go): a finding holds
// for every tag set a request could carry.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Severity orders findings: an error-level finding fails `verdictctl lint`.
type Severity uint8

// Severities.
const (
	SeverityInfo Severity = iota + 1
	SeverityWarning
	SeverityError
)

var severityNames = []string{"", "info", "warning", "error"}

func (s Severity) String() string { return severityNames[s] }

// FindingKind names what a finding found.
type FindingKind uint8

// Finding kinds (docs/lint.md).
const (
	// Shadowed: the rule can never decide a flow; earlier rules decide
	// every flow it matches (error).
	FindingShadowed FindingKind = iota + 1
	// Redundant: removing the rule changes no answer (warning).
	FindingRedundant
	// ConflictingTie: two rules of one rank with opposite actions, ordered
	// only by the tie-break, both matching a flow they decide (warning).
	FindingConflictingTie
	// Dead: the policy selects no workload of the inventory (info).
	FindingDead
	// OverlappingScopes: two sibling scopes hold a workload in common
	// (warning).
	FindingOverlappingScopes
	// AuditNeverDiffers: the audit policy's shadow answer never differs
	// from the enforced one on the flows checked (info).
	FindingAuditNeverDiffers
)

var findingNames = []string{"", "Shadowed", "Redundant", "ConflictingTie", "Dead", "OverlappingScopes", "AuditNeverDiffers"}

func (k FindingKind) String() string { return findingNames[k] }

// Severity is the kind's severity.
func (k FindingKind) Severity() Severity {
	switch k {
	case FindingShadowed:
		return SeverityError
	case FindingDead, FindingAuditNeverDiffers:
		return SeverityInfo
	}
	return SeverityWarning
}

// RuleRef names a rule of a partition: its policy and rule ("" for a
// catch-all's policy, or a fallback's), its scope and action.
type RuleRef struct {
	Policy string
	Rule   string // "sources[0]/destinations[1]", "from[2]", "catchAll", or a fallback: "defaultAction", "unenforcedAction"
	Scope  string
	Action resource.Action
}

func (r RuleRef) String() string {
	switch {
	case r.Policy != "":
		return r.Policy + " " + r.Rule
	case r.Scope != "":
		return "scope " + r.Scope + " " + r.Rule
	}
	return r.Rule
}

// Witness is a flow that shows a finding, as Decide answered it.
type Witness struct {
	Source, Destination resource.Tags
	Protocol            resource.Protocol
	Port                uint32
	// Side is the side the finding concerns: "outbound" or "inbound".
	Side string
	// Decided is Decide's answer on that side.
	Decided engine.SideDecision
	// Workloads are inventory workloads the witness stands for (overlapping
	// scopes: the workloads in both), when there are some.
	Workloads []string
}

// Finding is one thing lint found.
type Finding struct {
	Kind     FindingKind
	Severity Severity
	Mesh     string
	Type     string // "" for a scope finding
	Policy   string // "" for a scope finding
	Rule     string // "" for a policy-level finding
	Scope    string // the policy's scope, or the scope found
	// Related are the covering rules (Shadowed), the rule that decides in
	// its place (Redundant), the other rule of the tie (ConflictingTie), the
	// sibling scope (OverlappingScopes).
	Related []RuleRef
	Message string
	Witness *Witness
	// Introduced: the finding comes with the change linted (LintRequest's
	// Puts and Deletes); it is not there before.
	Introduced bool
}

// Unproven is a rule lint could not settle within its budget: it may be
// shadowed or redundant, it is not reported as such.
type Unproven struct {
	Kind   FindingKind
	Mesh   string
	Type   string
	Policy string
	Rule   string
	Why    string
}

// LintRequest asks for the findings of a mesh ("" = every mesh) and a type
// ("" = every type), of the snapshot as it is or, with Puts or Deletes, as
// the change would make it (validated as Apply's dry run).
type LintRequest struct {
	Mesh    string
	Type    string
	Puts    []resource.Resource
	Deletes []resource.Key
	// Budget bounds the search per rule (0: the default); past it a rule is
	// Unproven.
	Budget int
	// ShadowedOf, when not nil, asks only whether the rules of the named
	// policies are shadowed (every rule of the partition still covers):
	// no other finding is looked for. The standing conditions ask so
	// (engine/conditions).
	ShadowedOf map[string]bool
	proofs     *[]LintProof // the tests' (export_test.go)
}

// LintAnswer is Lint's answer.
type LintAnswer struct {
	Revision int64 // the revision linted (before the change, with one)
	Findings []Finding
	Unproven []Unproven
	// Notes say what was not analyzed, and why.
	Notes []string
	// Rules analyzed.
	Rules int
	// Decided lists, when ShadowedOf asks, a flow that each rule it asks
	// about and found not shadowed decides (none where a key's classes are
	// not exact): a judgement that keeps it can check whether a change
	// takes that flow from the rule instead of linting it again.
	Decided []DecidedFlow
}

// DecidedFlow is a flow a rule decides on one side.
type DecidedFlow struct {
	Policy, Rule        string
	Source, Destination resource.Tags
	Protocol            resource.Protocol
	Port                uint32
	Side                int // 0 outbound, 1 inbound
}

// Errors reports whether an error-level finding exists.
func (a *LintAnswer) Errors() bool {
	for i := range a.Findings {
		if a.Findings[i].Severity == SeverityError {
			return true
		}
	}
	return false
}

// defaultLintBudget is how many boxes the search of one rule may visit.
const defaultLintBudget = 4096

// Lint answers req on s (see the file comment). It fails with
// engine.ErrMeshNotFound for a named mesh that holds no resource,
// engine.ErrTypeNotFound for a named type the mesh does not know, and with
// CheckApply's validation error for a change Apply would refuse.
func Lint(s *engine.Snapshot, req *LintRequest) (*LintAnswer, error) {
	if len(req.Puts) == 0 && len(req.Deletes) == 0 {
		return lint(s, req)
	}
	after, _, err := s.Preview(req.Puts, req.Deletes)
	if err != nil {
		return nil, err
	}
	ans, err := lint(after, req)
	if err != nil {
		return nil, err
	}
	before, err := lint(s, req)
	if err != nil {
		before = &LintAnswer{} // the change creates the mesh or the type
	}
	had := map[string]bool{}
	for i := range before.Findings {
		had[before.Findings[i].identity()] = true
	}
	for i := range ans.Findings {
		ans.Findings[i].Introduced = !had[ans.Findings[i].identity()]
	}
	ans.Revision = s.Revision()
	return ans, nil
}

// identity is what makes two findings the same across a change: the kind,
// where, and the rules named (not the witness, which may move).
func (f *Finding) identity() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\x00%s\x00%s\x00%s\x00%s\x00%s", f.Kind, f.Mesh, f.Type, f.Policy, f.Rule, f.Scope)
	if f.Kind != FindingRedundant { // the rule deciding in its place may change
		for _, r := range f.Related {
			fmt.Fprintf(&b, "\x00%s/%s/%s", r.Policy, r.Rule, r.Scope)
		}
	}
	return b.String()
}

func lint(s *engine.Snapshot, req *LintRequest) (*LintAnswer, error) {
	ans := &LintAnswer{Revision: s.Revision()}
	meshes := s.Meshes()
	if req.Mesh != "" {
		if !slices.Contains(meshes, req.Mesh) {
			return nil, fmt.Errorf("%w: %q holds no resource", engine.ErrMeshNotFound, req.Mesh)
		}
		meshes = []string{req.Mesh}
	}
	budget := req.Budget
	if budget <= 0 {
		budget = defaultLintBudget
	}
	for _, mesh := range meshes {
		types := s.KnownTypes(mesh)
		if req.Type != "" {
			types = []string{req.Type}
		}
		if req.Type == "" && req.ShadowedOf == nil {
			// The scopes are the mesh's: any partition of it shows them.
			if p, err := s.Partition(mesh, resource.DefaultType); err == nil {
				lintScopes(p, ans)
			}
		}
		for _, typ := range types {
			p, err := s.Partition(mesh, typ)
			if err != nil {
				if req.Mesh != "" {
					return nil, err
				}
				continue
			}
			lintPartition(p, budget, req.proofs, req.ShadowedOf, ans)
		}
	}
	slices.SortStableFunc(ans.Findings, func(a, b Finding) int {
		if c := cmp.Compare(b.Severity, a.Severity); c != 0 {
			return c
		}
		for _, c := range []int{strings.Compare(a.Mesh, b.Mesh), strings.Compare(a.Type, b.Type), strings.Compare(a.Policy, b.Policy),
			strings.Compare(a.Rule, b.Rule), strings.Compare(a.Scope, b.Scope), cmp.Compare(a.Kind, b.Kind)} {
			if c != 0 {
				return c
			}
		}
		return 0
	})
	return ans, nil
}

// lintPartition adds the findings of one (mesh, type).
func lintPartition(p *engine.Partition, budget int, proofs *[]LintProof, only map[string]bool, ans *LintAnswer) {
	where := p.Mesh() + "/" + p.Type()
	if p.Closed() {
		ans.Notes = append(ans.Notes, where+": not analyzed: an invalid stored resource closes it")
		return
	}
	rules := p.Rules(false)
	if rules == nil {
		return // no policy of the type
	}
	if only == nil {
		lintDead(p, ans)
		lintAudit(p, ans)
	}
	if rules.Size == 0 {
		return
	}
	if p.Settings().PerDestination {
		ans.Notes = append(ans.Notes, where+": rules not analyzed: select PerDestination chooses one policy per inbound (docs/lint.md)")
		return
	}
	lp := newLintPart(p, budget)
	lp.proofs = proofs
	lp.only = only
	lp.run(ans)
}
