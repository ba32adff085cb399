package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// logFilterHeader is the header naming the daemon's decision-log filter
// (decisionlog.FilterHeader; verdictctl does not link the logger).
const logFilterHeader = "verdict-decision-log-filter"

// runLogs follows the decision log of a running verdictd
// (DecisionLogService.Follow, docs/logs.md).
func runLogs(ctx context.Context, args []string, e *env) int {
	fs := newFlags("logs", e)
	action := fs.String("action", "", "only `ALLOW` or DENY")
	policy := fs.String("policy", "", "only decisions by this `POLICY` (top level or either side)")
	workload := fs.String("workload", "", "only flows with this end: a workload `NAME`, an address, a principal or a tag value")
	mesh := fs.String("mesh", "", "only this `MESH`")
	typ := fs.String("type", "", "only this policy `TYPE`")
	auditOnly := fs.Bool("audit-only", false, "only decisions whose audit (shadow) result differs")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	act := strings.ToUpper(*action)
	if act != "" && act != "ALLOW" && act != "DENY" {
		return fs.usage("--action %q: ALLOW or DENY", *action)
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "logs", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewDecisionLogServiceClient(conn)
	req := &verdictv1.FollowRequest{Action: act, Policy: *policy, Workload: *workload, Mesh: *mesh, Type: *typ, AuditOnly: *auditOnly}
	out := output.printer(e.stdout)
	hinted := false
	return follow(ctx, e, "logs", func(ctx context.Context, got func()) error {
		s, err := client.Follow(ctx, req)
		if err != nil {
			return err
		}
		if h, err := s.Header(); err == nil && !hinted {
			hinted = true
			logsHint(e.stderr, h.Get(logFilterHeader), req)
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return err
			}
			got()
			r := m.GetRecord()
			if err := out.record(r, func(w io.Writer, wide bool) error { printRecord(w, r, wide); return nil }); err != nil {
				return err
			}
		}
	}, func() string { return "; the records in between are not replayed" })
}

// logsHint says on stderr when the daemon's own filter keeps the records
// asked for from ever being logged.
func logsHint(w io.Writer, filter []string, req *verdictv1.FollowRequest) {
	if len(filter) == 0 {
		return // a daemon older than the header
	}
	switch {
	case filter[0] == "denies" && req.GetAuditOnly():
		fmt.Fprintln(w, "hint: the server logs denied decisions only (--decision-log-filter denies): an allowed flow an audit "+
			"policy would deny is never logged; run verdictd with --decision-log-filter audit (or all) to follow them")
	case filter[0] == "denies" && req.GetAction() == "ALLOW":
		fmt.Fprintln(w, "hint: the server logs denied decisions only (--decision-log-filter denies): no ALLOW record will come")
	case filter[0] == "audit" && !req.GetAuditOnly():
		fmt.Fprintln(w, "hint: the server logs only decisions whose audit result differs (--decision-log-filter audit)")
	}
}

// printRecord is one decision on one line:
// "06:12:01.123 DENY default/TrafficPermission app=web -> app=db TCP/5432 by deny-db (inbound MATCHED) rev 12".
func printRecord(w io.Writer, r *verdictv1.DecisionRecord, wide bool) {
	var b strings.Builder
	ts := r.GetTime().AsTime().Local().Format("15:04:05.000")
	if wide {
		ts = r.GetTime().AsTime().Format(time.RFC3339Nano)
	}
	if ds := r.GetDropped(); ds != nil { // a summary of the records dropped
		fmt.Fprintf(&b, "%s DROPPED", ts)
		for _, d := range ds {
			fmt.Fprintf(&b, " %s/%s %d", d.GetMesh(), d.GetReason(), d.GetCount())
		}
		fmt.Fprintln(w, b.String())
		return
	}
	fmt.Fprintf(&b, "%s %s %s/%s %s -> %s", ts, orDash(r.GetAction()), r.GetMesh(), r.GetType(),
		recordEndpoint(r.GetSource()), recordEndpoint(r.GetDestination()))
	if r.GetProtocol() != "" || r.GetPort() != 0 {
		fmt.Fprintf(&b, " %s/%d", orDash(r.GetProtocol()), r.GetPort())
	}
	if r.GetPolicy() != "" {
		fmt.Fprintf(&b, " by %s", r.GetPolicy())
	}
	for _, s := range []struct {
		name string
		s    *verdictv1.RecordSide
	}{{"outbound", r.GetOutbound()}, {"inbound", r.GetInbound()}} {
		if s.s != nil && (wide || s.s.GetAction() == "DENY") {
			fmt.Fprintf(&b, " (%s %s %s", s.name, s.s.GetAction(), s.s.GetReason())
			if s.s.GetPolicy() != "" {
				fmt.Fprintf(&b, " %s", s.s.GetPolicy())
			}
			b.WriteString(")")
		}
	}
	if a := r.GetAudit(); a != nil {
		fmt.Fprintf(&b, " [audit: would be %s by %s, %s]", a.GetAction(), orDash(a.GetPolicy()), orDash(a.GetSide()))
	}
	fmt.Fprintf(&b, " rev %d", r.GetRevision())
	if n := r.GetRepeats(); n > 0 {
		fmt.Fprintf(&b, " (%d more)", n)
	}
	if wide {
		fmt.Fprintf(&b, " rpc %s caller %s", r.GetRpc(), orDash(r.GetCaller().GetAddress()))
		if r.GetCaller().GetIdentity() != "" {
			fmt.Fprintf(&b, " (%s)", r.GetCaller().GetIdentity())
		}
		fmt.Fprintf(&b, " %v", time.Duration(r.GetLatencyNs()))
	}
	fmt.Fprintln(w, b.String())
}

func recordEndpoint(ep *verdictv1.RecordEndpoint) string {
	return endpointText(&verdictv1.Endpoint{Tags: ep.GetTags(), Workload: ep.GetWorkload(), Address: ep.GetAddress(),
		Principal: ep.GetPrincipal(), Identity: ep.GetIdentity()})
}
