package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// flowFlags are the flags that describe a flow.
type flowFlags struct {
	mesh, typ, proto string
	src, dst         endpointFlags
	port             uint32
	minRev           int64
	past             pastFlags
	output           outputFlag
}

func (f *flowFlags) register(fs *flagSet) {
	fs.StringVar(&f.mesh, "mesh", "", "the `MESH` (default \"default\")")
	fs.StringVar(&f.typ, "type", "", "policy `TYPE` (default TrafficPermission)")
	f.src.register(fs, "src", "source")
	f.dst.register(fs, "dst", "destination")
	fs.Func("proto", "`PROTOCOL`: TCP, UDP or ICMP (default: not given)", func(s string) error {
		if _, err := resource.ParseProtocol(s); err != nil || s == "" {
			return errors.New("not TCP, UDP or ICMP")
		}
		f.proto = strings.ToUpper(s)
		return nil
	})
	fs.Func("port", "destination `PORT`, 1-65535, with --proto (default: not given)", func(s string) error {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return errors.New("not a port (1-65535)")
		}
		f.port = uint32(n)
		return nil
	})
	fs.Int64Var(&f.minRev, "min-revision", 0, "answer from a snapshot at or after this revision")
	f.past.register(fs, true)
	f.output.register(fs, "text", "wide", "json", "yaml")
}

// check finds the flow's usage errors before any call: a port needs its
// protocol (a port alone would decide a flow of no protocol, which no rule
// with ports matches).
func (f *flowFlags) check() error {
	if f.port != 0 && f.proto == "" {
		return errors.New("--port needs --proto (TCP, UDP or ICMP)")
	}
	return f.past.check(f.minRev)
}

// endpointFlags give one end of a flow in exactly one form: --src k=v,..
// (tags), --src-workload NAME, --src-address IP, --src-principal ID,
// --src-identity N, or --src-any (no tags: any workload).
type endpointFlags struct {
	flag                               string // "src" or "dst"
	tags, workload, address, principal string
	identity                           uint64
	any                                bool
	tagsSet                            bool
}

func (p *endpointFlags) register(fs *flagSet, name, end string) {
	p.flag = name
	fs.Func(name, end+" workload `TAGS`: k=v,k2=v2", func(s string) error { p.tags, p.tagsSet = s, true; return nil })
	fs.StringVar(&p.workload, name+"-workload", "", end+" by workload `NAME`")
	fs.StringVar(&p.address, name+"-address", "", end+" by `IP` address")
	fs.StringVar(&p.principal, name+"-principal", "", end+" by certificate identity (a SPIFFE `ID`)")
	fs.Uint64Var(&p.identity, name+"-identity", 0, end+" by numeric identity")
	fs.BoolVar(&p.any, name+"-any", false, end+" with no tags: what any workload gets")
}

// endpoint returns the endpoint; given is false when no form was given.
func (p *endpointFlags) endpoint() (ep *verdictv1.Endpoint, given bool, err error) {
	forms := 0
	for _, set := range []bool{p.tagsSet, p.workload != "", p.address != "", p.principal != "", p.identity != 0, p.any} {
		if set {
			forms++
		}
	}
	if forms > 1 {
		return nil, true, fmt.Errorf("--%s, --%s-workload, --%s-address, --%s-principal, --%s-identity and --%s-any exclude each other",
			p.flag, p.flag, p.flag, p.flag, p.flag, p.flag)
	}
	switch {
	case p.workload != "":
		return &verdictv1.Endpoint{Workload: p.workload}, true, nil
	case p.address != "":
		return &verdictv1.Endpoint{Address: p.address}, true, nil
	case p.principal != "":
		return &verdictv1.Endpoint{Principal: p.principal}, true, nil
	case p.identity != 0:
		return &verdictv1.Endpoint{Identity: p.identity}, true, nil
	}
	tags, err := parseTags(p.tags)
	if err != nil {
		return nil, true, fmt.Errorf("--%s: %w", p.flag, err)
	}
	if p.tagsSet && len(tags) == 0 {
		return nil, true, fmt.Errorf("--%s is empty: give tags, or --%s-any for no tags", p.flag, p.flag)
	}
	return &verdictv1.Endpoint{Tags: tags}, forms == 1, nil
}

// workloads returns both ends; required: a flow of decide and explain needs
// both given (--src-any says "no tags" explicitly).
func (f *flowFlags) workloads(required bool) (src, dst *verdictv1.Endpoint, err error) {
	src, srcGiven, err := f.src.endpoint()
	if err != nil {
		return nil, nil, err
	}
	dst, dstGiven, err := f.dst.endpoint()
	if err != nil {
		return nil, nil, err
	}
	if required {
		for _, m := range []struct {
			given bool
			p     *endpointFlags
			end   string
		}{{srcGiven, &f.src, "source"}, {dstGiven, &f.dst, "destination"}} {
			if !m.given {
				return nil, nil, fmt.Errorf("name the %s: --%s k=v,.., --%s-workload NAME, --%s-address IP, --%s-principal ID, --%s-identity N, or --%s-any",
					m.end, m.p.flag, m.p.flag, m.p.flag, m.p.flag, m.p.flag, m.p.flag)
			}
		}
	}
	return src, dst, nil
}

func (f *flowFlags) decideRequest(explain bool) (*verdictv1.DecideRequest, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	src, dst, err := f.workloads(true)
	if err != nil {
		return nil, err
	}
	return &verdictv1.DecideRequest{Mesh: f.mesh, Type: f.typ, Source: src, Destination: dst, Protocol: f.proto,
		Port: f.port, Explain: explain, MinRevision: f.minRev, AtRevision: f.past.rev, AtTime: f.past.atTime()}, nil
}

func runDecide(ctx context.Context, args []string, e *env) int {
	return decideCmd(ctx, "decide", args, e)
}

func runExplain(ctx context.Context, args []string, e *env) int {
	return decideCmd(ctx, "explain", args, e)
}

func decideCmd(ctx context.Context, name string, args []string, e *env) int {
	fs := newFlags(name, e)
	var ff flowFlags
	ff.register(fs)
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	req, err := ff.decideRequest(name == "explain")
	if err != nil {
		return fs.usage("%v", err)
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, name, err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewDecisionServiceClient(conn).Decide(cctx, req)
	if err != nil {
		return fail(e, name, err, nil)
	}
	err = ff.output.printer(e.stdout).print(resp, func(w io.Writer, wide bool) error {
		printDecision(w, resp)
		printResolutions(w, req, resp, wide)
		if name == "explain" {
			printExplanation(w, req, resp.GetExplanation())
		}
		return nil
	})
	if err != nil {
		return fail(e, name, err, nil)
	}
	if resp.GetAction() == verdictv1.Action_ACTION_DENY {
		return exitFailed
	}
	return exitOK
}

func actionText(a verdictv1.Action) string { return strings.TrimPrefix(a.String(), "ACTION_") }

func reasonText(r verdictv1.Reason) string { return strings.TrimPrefix(r.String(), "REASON_") }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printDecision(w io.Writer, d *verdictv1.DecideResponse) {
	fmt.Fprintf(w, "%s", actionText(d.GetAction()))
	if d.GetPolicy() != "" {
		fmt.Fprintf(w, " by policy %s", d.GetPolicy())
	}
	fmt.Fprintf(w, " (revision %d)\n", d.GetRevision())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SIDE\tACTION\tREASON\tPOLICY\tSCOPE\tRULE")
	for _, s := range []struct {
		name string
		d    *verdictv1.SideDecision
	}{{"outbound", d.GetOutbound()}, {"inbound", d.GetInbound()}} {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", s.name, actionText(s.d.GetAction()), reasonText(s.d.GetReason()),
			orDash(s.d.GetPolicy()), orDash(s.d.GetScope()), orDash(s.d.GetRule()))
	}
	tw.Flush()
	if len(d.GetConf().GetFields()) > 0 {
		fmt.Fprintf(w, "  conf: %s\n", compactJSON(d.GetConf()))
	}
	if a := d.GetAudit(); a != nil {
		fmt.Fprintf(w, "  audit: would be %s by policy %s (%s side, rule %s)\n", actionText(a.GetAction()), orDash(a.GetPolicy()), orDash(a.GetSide()), orDash(a.GetRule()))
	}
}

// printResolutions says how the ends of a flow were resolved: always for an
// end not given as tags, for every end with wide.
func printResolutions(w io.Writer, req *verdictv1.DecideRequest, resp *verdictv1.DecideResponse, wide bool) {
	for _, r := range []struct {
		end   string
		given *verdictv1.Endpoint
		r     *verdictv1.EndpointResolution
	}{{"source", req.GetSource(), resp.GetSourceResolution()}, {"destination", req.GetDestination(), resp.GetDestinationResolution()}} {
		switch {
		case r.r != nil && (wide || r.r.GetForm() > verdictv1.EndpointForm_ENDPOINT_FORM_TAGS):
			fmt.Fprintf(w, "  %s: %s\n", r.end, resolutionText(r.r))
		case wide:
			fmt.Fprintf(w, "  %s: %s\n", r.end, endpointText(r.given))
		}
	}
}

// resolutionText: "address → workload web-1 (identity 42): app=web,ip=10.0.0.1".
func resolutionText(r *verdictv1.EndpointResolution) string {
	form := strings.ToLower(strings.TrimPrefix(r.GetForm().String(), "ENDPOINT_FORM_"))
	as := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(r.GetResolvedAs().String(), "RESOLVED_AS_"), "_", " "))
	s := form + " → " + as
	if r.GetWorkload() != "" {
		s += " " + r.GetWorkload()
	}
	var notes []string
	if r.GetResolvedAs() == verdictv1.ResolvedAs_RESOLVED_AS_PRINCIPAL_HOLDERS {
		notes = append(notes, count(int(r.GetHolders()), "holder", "holders"))
	}
	if r.GetIdentity() != 0 {
		notes = append(notes, fmt.Sprintf("identity %d", r.GetIdentity()))
	}
	if len(notes) > 0 {
		s += " (" + strings.Join(notes, ", ") + ")"
	}
	if len(r.GetTags()) > 0 {
		s += ": " + tagsText(&verdictv1.Endpoint{Tags: r.GetTags()})
	}
	return s
}

// endpointText names an endpoint as it was given.
func endpointText(w *verdictv1.Endpoint) string {
	switch {
	case w.GetWorkload() != "":
		return "workload " + w.GetWorkload()
	case w.GetAddress() != "":
		return "address " + w.GetAddress()
	case w.GetPrincipal() != "":
		return "principal " + w.GetPrincipal()
	case w.GetIdentity() != 0:
		return fmt.Sprintf("identity %d", w.GetIdentity())
	}
	return tagsText(w)
}

func tagsText(w *verdictv1.Endpoint) string {
	keys := make([]string, 0, len(w.GetTags()))
	for k := range w.GetTags() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + w.GetTags()[k]
	}
	if len(parts) == 0 {
		return "no tags"
	}
	return strings.Join(parts, ",")
}

func printExplanation(w io.Writer, req *verdictv1.DecideRequest, ex *verdictv1.Explanation) {
	for _, s := range []struct {
		name, end string
		wl        *verdictv1.Endpoint
		t         *verdictv1.SideTrace
	}{{"outbound", "source", req.GetSource(), ex.GetOutbound()}, {"inbound", "destination", req.GetDestination(), ex.GetInbound()}} {
		fmt.Fprintf(w, "\n%s side (at the %s, %s): %s\n", s.name, s.end, endpointText(s.wl), reasonText(s.t.GetReason()))
		if len(s.t.GetMembers()) > 0 {
			fmt.Fprintf(w, "  member scopes: %s (most specific: %s)\n", strings.Join(s.t.GetMembers(), ", "), s.t.GetMostSpecificScope())
		}
		if len(s.t.GetCandidates()) == 0 {
			fmt.Fprintln(w, "  no candidate rule")
		} else {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  #\tPHASE\tSCOPE\tPOLICY\tRULE\tRANK\tPRIO\tACTION\tRESULT")
			for i, c := range s.t.GetCandidates() {
				result := "no match: " + c.GetWhy()
				switch {
				case c.GetDecided():
					result = "MATCHED, DECIDED"
				case c.GetMatched():
					result = "matched: " + c.GetWhy()
				}
				action := actionText(c.GetAction())
				if c.GetAudit() {
					action += " (audit)" // decides only the shadow decision
				}
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", i+1, c.GetPhase(), orDash(c.GetScope()), orDash(c.GetPolicy()),
					c.GetRule(), c.GetRank(), c.GetPriority(), action, result)
			}
			tw.Flush()
		}
		if len(s.t.GetNotCandidates()) > 0 {
			fmt.Fprintln(w, "  not candidates:")
			for _, n := range s.t.GetNotCandidates() {
				fmt.Fprintf(w, "    %s: %s\n", n.GetPolicy(), n.GetWhy())
			}
		}
		if s.t.GetTruncated() {
			fmt.Fprintln(w, "  (lists cut at 1000 entries)")
		}
	}
}

func runResolve(ctx context.Context, args []string, e *env) int {
	fs := newFlags("resolve", e)
	var ff flowFlags
	ff.register(fs)
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	if err := ff.check(); err != nil {
		return fs.usage("%v", err)
	}
	src, dst, err := ff.workloads(false)
	if err != nil {
		return fs.usage("%v", err)
	}
	_, srcGiven, _ := ff.src.endpoint()
	_, dstGiven, _ := ff.dst.endpoint()
	if !srcGiven && !dstGiven {
		return fs.usage("name an end: --dst k=v,.. (or --dst-workload NAME, --dst-address IP, ...), --src, or both")
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "resolve", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewDecisionServiceClient(conn).Resolve(cctx, &verdictv1.ResolveRequest{Mesh: ff.mesh, Type: ff.typ,
		Source: src, Destination: dst, Protocol: ff.proto, Port: ff.port, MinRevision: ff.minRev,
		AtRevision: ff.past.rev, AtTime: ff.past.atTime()})
	if err != nil {
		return fail(e, "resolve", err, nil)
	}
	err = ff.output.printer(e.stdout).print(resp, func(w io.Writer, _ bool) error {
		printResolution(w, &verdictv1.Resolution{Side: resp.GetSide(), Rules: resp.GetRules(), Status: resp.GetStatus()})
		if resp.GetOutbound() != nil {
			fmt.Fprintln(w)
			printResolution(w, resp.GetOutbound())
		}
		_, err := fmt.Fprintf(w, "(revision %d)\n", resp.GetRevision())
		return err
	})
	if err != nil {
		return fail(e, "resolve", err, nil)
	}
	return exitOK
}

func printResolution(w io.Writer, r *verdictv1.Resolution) {
	fmt.Fprintf(w, "%s:\n", r.GetSide())
	if len(r.GetRules()) == 0 {
		fmt.Fprintln(w, "  no rule applies")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  RULE\tVALUE\tFROM POLICY")
		for _, rr := range r.GetRules() {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", rr.GetName(), compactJSON(rr.GetValue()), rr.GetPolicy())
		}
		tw.Flush()
	}
	for _, st := range r.GetStatus() {
		fmt.Fprintf(w, "  policy %s: %s\n", st.GetPolicy(), stateText(st))
		for _, m := range st.GetMissing() {
			by := ""
			if m.GetBy() != "" {
				by = " by " + m.GetBy()
			}
			fmt.Fprintf(w, "    %s: %s%s\n", m.GetRule(), m.GetWhy(), by)
		}
		for _, s := range st.GetSkipped() {
			fmt.Fprintf(w, "    block skipped: %s\n", s)
		}
	}
}

// stateText is a policy's state in a resolution. A policy none of whose rules
// is in the result because its blocks were skipped (when is false, or failed)
// reads SKIPPED: OVERRIDDEN would say another policy won.
func stateText(st *verdictv1.PolicyStatus) string {
	state := strings.TrimPrefix(st.GetState().String(), "POLICY_STATE_")
	if st.GetState() != verdictv1.PolicyState_POLICY_STATE_OVERRIDDEN || len(st.GetSkipped()) == 0 {
		return state
	}
	for _, m := range st.GetMissing() {
		if !strings.HasPrefix(m.GetWhy(), "skipped") && !strings.HasPrefix(m.GetWhy(), "when") {
			return state // some rule lost to another policy
		}
	}
	return "SKIPPED (no rule applied: its blocks were skipped)"
}
