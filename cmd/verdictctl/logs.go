package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// runLogs follows the decision log of a running verdictd
// (DecisionLogService.Follow, docs/logs.md).
func runLogs(ctx context.Context, args []string, e *env) int {
	fs := newFlags("logs", "[--action DENY] [--policy P] [--workload W] [flags]",
		"Follows the decision records of the replica at --server, from now on, until Ctrl-C: one line\n"+
			"per decision (-o json: one record per line). Needs an authorized caller and the daemon's\n"+
			"decision log on (--decision-log). A follower that falls behind is ended by the server;\n"+
			"verdictctl reconnects and says so (the records in between are not replayed).", e.stderr)
	action := fs.String("action", "", "only ALLOW or DENY")
	policy := fs.String("policy", "", "only decisions by this policy (top level or either side)")
	workload := fs.String("workload", "", "only flows with this end: a workload name, an address, a principal or a tag value")
	mesh := fs.String("mesh", "", "only this mesh")
	typ := fs.String("type", "", "only this policy type")
	auditOnly := fs.Bool("audit-only", false, "only decisions whose audit (shadow) result differs")
	var output outputFlag
	output.register(fs, "text", "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) > 0 {
		fmt.Fprintf(e.stderr, "verdictctl logs: unexpected argument %q\n", rest[0])
		return exitUsage
	}
	act := strings.ToUpper(*action)
	if act != "" && act != "ALLOW" && act != "DENY" {
		fmt.Fprintf(e.stderr, "verdictctl logs: --action %q: ALLOW or DENY\n", *action)
		return exitUsage
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "logs", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewDecisionLogServiceClient(conn)
	req := &verdictv1.FollowRequest{Action: act, Policy: *policy, Workload: *workload, Mesh: *mesh, Type: *typ, AuditOnly: *auditOnly}
	return follow(ctx, e, "logs", func(ctx context.Context, got func()) error {
		s, err := client.Follow(ctx, req)
		if err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return err
			}
			got()
			if output.structured() {
				printStreamed(e.stdout, output.value, m.GetRecord())
				continue
			}
			printRecord(e.stdout, m.GetRecord(), output.value == "wide")
		}
	}, func() string { return "; the records in between are not replayed" })
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
