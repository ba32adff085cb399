package main

// lint: the rules that never decide, the redundant ones, ties, dead
// policies, overlapping scopes (docs/lint.md); and the lint step of apply.

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// runLint is `verdictctl lint`: the server's store, or -f documents
// offline. Exit 1 when an error-level finding exists.
func runLint(ctx context.Context, args []string, e *env) int {
	fs := newFlags("lint", e)
	var files fileList
	fs.Var(&files, "f", "lint these documents offline (`FILE`, directory or -), not the server's store; repeatable")
	mesh := fs.String("mesh", "", "only this `MESH` (default: every mesh)")
	typ := fs.String("type", "", "only this policy `TYPE` (default: every type)")
	minRev := fs.Int64("min-revision", 0, "answer from a snapshot at or after this revision")
	var past pastFlags
	past.register(fs, true)
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	if err := past.check(*minRev); err != nil {
		return fs.usage("%v", err)
	}
	if len(files) > 0 && (past.rev != 0 || !past.at.IsZero() || *minRev != 0) {
		return fs.usage("-f lints documents offline: --at-revision, --at and --min-revision read the server's store")
	}
	var resp *verdictv1.LintResponse
	if len(files) > 0 {
		items, code := readInput(e, "lint", files, exitFailed)
		if code != exitOK {
			return code
		}
		var docs []resource.Resource
		for _, it := range items {
			docs = append(docs, it.res)
		}
		_, waited := working(e, output.printer(e.stdout), "lint")
		snap := engine.Build(1, docs)
		ans, err := analysis.Lint(snap, &analysis.LintRequest{Mesh: *mesh, Type: *typ})
		waited()
		if err != nil {
			return fail(e, "lint", err, nil)
		}
		resp = apiconv.LintResponse(ans)
		resp.Revision = 0
	} else {
		conn, err := cf.dial()
		if err != nil {
			return fail(e, "lint", err, nil)
		}
		defer conn.Close()
		cctx, cancel := cf.ctx(ctx)
		defer cancel()
		_, waited := working(e, output.printer(e.stdout), "lint")
		resp, err = verdictv1.NewAnalysisServiceClient(conn).Lint(cctx, &verdictv1.LintRequest{Mesh: *mesh, Type: *typ,
			MinRevision: *minRev, AtRevision: past.rev, AtTime: past.atTime()})
		waited()
		if err != nil {
			return fail(e, "lint", err, nil)
		}
	}
	err := output.printer(e.stdout).print(resp, func(w io.Writer, wide bool) error {
		printLint(w, resp, wide, false)
		return nil
	})
	if err != nil {
		return fail(e, "lint", err, nil)
	}
	if lintErrors(resp.GetFindings(), false) > 0 {
		return exitFailed
	}
	return exitOK
}

// lintErrors counts the error-level findings (introduced: only those a
// change brings).
func lintErrors(fs []*verdictv1.LintFinding, introduced bool) int {
	n := 0
	for _, f := range fs {
		if f.GetSeverity() == verdictv1.Severity_SEVERITY_ERROR && (!introduced || f.GetIntroduced()) {
			n++
		}
	}
	return n
}

var kindNames = map[verdictv1.FindingKind]string{
	verdictv1.FindingKind_FINDING_KIND_SHADOWED:            "shadowed",
	verdictv1.FindingKind_FINDING_KIND_REDUNDANT:           "redundant",
	verdictv1.FindingKind_FINDING_KIND_CONFLICTING_TIE:     "conflicting tie",
	verdictv1.FindingKind_FINDING_KIND_DEAD:                "dead",
	verdictv1.FindingKind_FINDING_KIND_OVERLAPPING_SCOPES:  "overlapping scopes",
	verdictv1.FindingKind_FINDING_KIND_AUDIT_NEVER_DIFFERS: "audit never differs",
}

var severityWords = map[verdictv1.Severity]string{
	verdictv1.Severity_SEVERITY_ERROR:   "error",
	verdictv1.Severity_SEVERITY_WARNING: "warning",
	verdictv1.Severity_SEVERITY_INFO:    "info",
}

// findingWhere is what a finding is about: "default/TrafficPermission
// web-to-db sources[0]/destinations[0]", "default scope Apps".
func findingWhere(f *verdictv1.LintFinding) string {
	if f.GetPolicy() == "" {
		return fmt.Sprintf("%s scope %s", f.GetMesh(), f.GetScope())
	}
	s := fmt.Sprintf("%s/%s %s", f.GetMesh(), f.GetType(), f.GetPolicy())
	if f.GetRule() != "" {
		s += " " + f.GetRule()
	}
	return s
}

// witnessText is a witness flow on one line.
func witnessText(w *verdictv1.LintWitness) string {
	if w == nil {
		return ""
	}
	if w.GetSide() == "" {
		s := "tags " + peerTagsText(w.GetSource())
		if len(w.GetWorkloads()) > 0 {
			s += "; workloads " + strings.Join(w.GetWorkloads(), ", ")
		}
		return s
	}
	return fmt.Sprintf("%s -> %s %s: %s %s", peerTagsText(w.GetSource()), peerTagsText(w.GetDestination()),
		strings.TrimPrefix(flowText(w.GetProtocol(), w.GetPort()), "on "), w.GetSide(), sideAnswer(w.GetDecided()))
}

// sideAnswer is a side's action and what decided it.
func sideAnswer(s *verdictv1.SideDecision) string {
	by := sideText(s)
	if s.GetRule() != "" && s.GetPolicy() != "" {
		by += " " + s.GetRule()
	}
	return actionText(s.GetAction()) + " by " + by
}

// printLint prints findings, most severe first; onlyIntroduced prints the
// findings a change brings (apply).
func printLint(w io.Writer, r *verdictv1.LintResponse, wide, onlyIntroduced bool) {
	counts := map[verdictv1.Severity]int{}
	var shown []*verdictv1.LintFinding
	for _, f := range r.GetFindings() {
		if onlyIntroduced && !f.GetIntroduced() {
			continue
		}
		counts[f.GetSeverity()]++
		shown = append(shown, f)
	}
	sort.SliceStable(shown, func(i, j int) bool { return shown[i].GetSeverity() > shown[j].GetSeverity() })
	if !onlyIntroduced {
		at := ""
		if r.GetRevision() != 0 {
			at = fmt.Sprintf(" (revision %d)", r.GetRevision())
		}
		fmt.Fprintf(w, "Lint%s: %d rules analyzed; %s, %s, %s\n", at, r.GetRules(),
			count(counts[verdictv1.Severity_SEVERITY_ERROR], "error", "errors"),
			count(counts[verdictv1.Severity_SEVERITY_WARNING], "warning", "warnings"),
			count(counts[verdictv1.Severity_SEVERITY_INFO], "info", "infos"))
	}
	for _, f := range shown {
		fmt.Fprintf(w, "%s: %s %s: %s\n", severityWords[f.GetSeverity()], kindNames[f.GetKind()], findingWhere(f), f.GetMessage())
		if wt := witnessText(f.GetWitness()); wt != "" {
			fmt.Fprintf(w, "  witness: %s\n", wt)
		}
		if wide && len(f.GetRelated()) > 0 {
			var rel []string
			for _, x := range f.GetRelated() {
				rel = append(rel, strings.TrimSpace(x.GetPolicy()+" "+x.GetRule()+" "+x.GetScope()))
			}
			fmt.Fprintf(w, "  related: %s\n", strings.Join(rel, "; "))
		}
	}
	if onlyIntroduced {
		return
	}
	if n := len(r.GetUnproven()); n > 0 {
		fmt.Fprintf(w, "%s not settled within the search's budget (not reported)", count(n, "rule", "rules"))
		if wide {
			fmt.Fprintln(w, ":")
			for _, u := range r.GetUnproven() {
				fmt.Fprintf(w, "  %s/%s %s %s: %s\n", u.GetMesh(), u.GetType(), u.GetPolicy(), u.GetRule(), u.GetWhy())
			}
		} else {
			fmt.Fprintln(w, " (-o wide lists them)")
		}
	}
	for _, n := range r.GetNotes() {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// lintChange is apply's lint step: the server lints the store as the
// change would make it and marks what the change brings; those findings
// are printed as warnings. In mode error, an error-level one stops the
// apply before anything is written (exit 1). A server that cannot lint
// stops it only in mode error.
func lintChange(ctx context.Context, e *env, cf *connFlags, conn grpc.ClientConnInterface, ops []*op, mode string) int {
	if mode == "off" {
		return exitOK
	}
	req := &verdictv1.LintRequest{}
	for _, o := range ops {
		if o.pb != nil {
			req.Resources = append(req.Resources, o.pb)
		}
	}
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewAnalysisServiceClient(conn).Lint(cctx, req)
	if err != nil {
		if mode == "error" {
			return fail(e, "apply --lint=error", err, nil)
		}
		if status.Code(err) != codes.InvalidArgument { // the apply reports invalid documents itself
			fmt.Fprintf(e.stderr, "warning: lint did not run: %v\n", status.Convert(err).Message())
		}
		return exitOK
	}
	for _, f := range resp.GetFindings() {
		if !f.GetIntroduced() {
			continue
		}
		fmt.Fprintf(e.stderr, "warning: lint %s: %s %s: %s\n", severityWords[f.GetSeverity()], kindNames[f.GetKind()], findingWhere(f), f.GetMessage())
		if wt := witnessText(f.GetWitness()); wt != "" {
			fmt.Fprintf(e.stderr, "  witness: %s\n", wt)
		}
	}
	if n := lintErrors(resp.GetFindings(), true); n > 0 && mode == "error" {
		fmt.Fprintf(e.stderr, "verdictctl apply: the change brings %s (--lint=error): nothing was written\n",
			count(n, "error-level lint finding", "error-level lint findings"))
		return exitFailed
	}
	return exitOK
}
