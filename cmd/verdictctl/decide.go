package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// flowFlags are the flags that describe a flow.
type flowFlags struct {
	mesh, typ, src, dst, proto string
	port                       uint
	minRev                     int64
	output                     string
}

func (f *flowFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mesh, "mesh", "", "mesh (default \"default\")")
	fs.StringVar(&f.typ, "type", "", "policy type (default TrafficPermission)")
	fs.StringVar(&f.src, "src", "", "source workload tags: k=v,k2=v2")
	fs.StringVar(&f.dst, "dst", "", "destination workload tags: k=v,k2=v2")
	fs.StringVar(&f.proto, "proto", "", "TCP, UDP or ICMP (default: not given)")
	fs.UintVar(&f.port, "port", 0, "destination port (default: not given)")
	fs.Int64Var(&f.minRev, "min-revision", 0, "answer from a snapshot at or after this revision")
	fs.StringVar(&f.output, "o", "text", "text or json")
}

func (f *flowFlags) workloads() (src, dst *verdictv1.Endpoint, err error) {
	s, err := parseTags(f.src)
	if err != nil {
		return nil, nil, fmt.Errorf("--src: %w", err)
	}
	d, err := parseTags(f.dst)
	if err != nil {
		return nil, nil, fmt.Errorf("--dst: %w", err)
	}
	return &verdictv1.Endpoint{Tags: s}, &verdictv1.Endpoint{Tags: d}, nil
}

func (f *flowFlags) decideRequest(explain bool) (*verdictv1.DecideRequest, error) {
	src, dst, err := f.workloads()
	if err != nil {
		return nil, err
	}
	return &verdictv1.DecideRequest{Mesh: f.mesh, Type: f.typ, Source: src, Destination: dst, Protocol: f.proto,
		Port: uint32(f.port), Explain: explain, MinRevision: f.minRev}, nil
}

func runDecide(ctx context.Context, args []string, e *env) int {
	return decideCmd(ctx, "decide", args, e)
}

func runExplain(ctx context.Context, args []string, e *env) int {
	return decideCmd(ctx, "explain", args, e)
}

func decideCmd(ctx context.Context, name string, args []string, e *env) int {
	about := "Decides a flow. Exit code 0 when it is allowed, 1 when it is denied."
	if name == "explain" {
		about = "Decides a flow and shows, per side, the candidate rules in order, which matched,\n" +
			"which decided and why the others did not, then the policies that were not candidates.\n" +
			"Exit code 0 when the flow is allowed, 1 when it is denied."
	}
	fs := newFlags(name, "--src k=v,.. --dst k=v,.. [--proto TCP --port 443]", about, e.stderr)
	var ff flowFlags
	ff.register(fs)
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) > 0 {
		fmt.Fprintf(e.stderr, "verdictctl %s: unexpected argument %q\n", name, rest[0])
		return exitUsage
	}
	req, err := ff.decideRequest(name == "explain")
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl %s: %v\n", name, err)
		return exitUsage
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
	if ff.output == "json" {
		err = printJSON(e.stdout, resp)
	} else {
		printDecision(e.stdout, resp)
		if name == "explain" {
			printExplanation(e.stdout, req, resp.GetExplanation())
		}
	}
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
		fmt.Fprintf(w, "\n%s side (at the %s, %s): %s\n", s.name, s.end, tagsText(s.wl), reasonText(s.t.GetReason()))
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
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", i+1, c.GetPhase(), orDash(c.GetScope()), orDash(c.GetPolicy()),
					c.GetRule(), c.GetRank(), c.GetPriority(), actionText(c.GetAction()), result)
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
	fs := newFlags("resolve", "--type T --dst k=v,.. [--src k=v,..]",
		"Shows the effective configuration of a type for a flow, or for one workload (--src alone):\n"+
			"each rule with the policy it came from, and each policy's status.", e.stderr)
	var ff flowFlags
	ff.register(fs)
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) > 0 {
		fmt.Fprintf(e.stderr, "verdictctl resolve: unexpected argument %q\n", rest[0])
		return exitUsage
	}
	src, dst, err := ff.workloads()
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl resolve: %v\n", err)
		return exitUsage
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "resolve", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewDecisionServiceClient(conn).Resolve(cctx, &verdictv1.ResolveRequest{Mesh: ff.mesh, Type: ff.typ,
		Source: src, Destination: dst, Protocol: ff.proto, Port: uint32(ff.port), MinRevision: ff.minRev})
	if err != nil {
		return fail(e, "resolve", err, nil)
	}
	if ff.output == "json" {
		if err := printJSON(e.stdout, resp); err != nil {
			return fail(e, "resolve", err, nil)
		}
		return exitOK
	}
	printResolution(e.stdout, &verdictv1.Resolution{Side: resp.GetSide(), Rules: resp.GetRules(), Status: resp.GetStatus()})
	if resp.GetOutbound() != nil {
		fmt.Fprintln(e.stdout)
		printResolution(e.stdout, resp.GetOutbound())
	}
	fmt.Fprintf(e.stdout, "(revision %d)\n", resp.GetRevision())
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
		fmt.Fprintf(w, "  policy %s: %s\n", st.GetPolicy(), strings.TrimPrefix(st.GetState().String(), "POLICY_STATE_"))
		for _, m := range st.GetMissing() {
			by := ""
			if m.GetBy() != "" {
				by = " by " + m.GetBy()
			}
			fmt.Fprintf(w, "    %s: %s%s\n", m.GetRule(), m.GetWhy(), by)
		}
		for _, s := range st.GetSkipped() {
			fmt.Fprintf(w, "    skipped %s\n", s)
		}
	}
}
