package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func runWatch(ctx context.Context, args []string, e *env) int {
	fs := newFlags("watch", e)
	prefix := fs.String("prefix", "", "resources: only keys with this `PREFIX`")
	from := fs.Int64("from-revision", 0, "resources: resume after this revision")
	mesh := fs.String("mesh", "", "rules: the `MESH` (default \"default\")")
	typ := fs.String("type", "", "rules: policy `TYPE` (default TrafficPermission)")
	workload := fs.String("workload", "", "rules: the workload's `TAGS` k=v,k2=v2")
	workloadName := fs.String("workload-name", "", "rules: the workload by `NAME`")
	workloadAddr := fs.String("workload-address", "", "rules: the workload by `IP` address")
	addrSets := fs.Bool("address-sets", false, "rules: peers as address sets, then their deltas (needs an authorized caller)")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	what := "resources"
	if len(rest) > 0 {
		what = rest[0]
	}
	if len(rest) > 1 || (what != "resources" && what != "rules") {
		return fs.usage("watch resources or rules")
	}
	var wl *verdictv1.Endpoint
	if what == "rules" {
		var err error
		if wl, err = workloadEndpoint(*workload, *workloadName, *workloadAddr); err != nil {
			return fs.usage("%v", err)
		}
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "watch", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewWatchServiceClient(conn)
	out := output.printer(e.stdout)
	if what == "rules" {
		req := &verdictv1.WatchRulesRequest{Mesh: *mesh, Type: *typ, Workload: wl, AddressSets: *addrSets, IncludeAudit: true}
		return follow(ctx, e, "watch", func(ctx context.Context, got func()) error {
			s, err := client.WatchRules(ctx, req)
			if err != nil {
				return err
			}
			for {
				m, err := s.Recv()
				if err != nil {
					return err
				}
				got()
				if err := out.record(m, func(w io.Writer, _ bool) error { printRules(w, m, true); return nil }); err != nil {
					return err
				}
			}
		}, func() string { return "; the rules come again in full" })
	}
	last := *from
	return follow(ctx, e, "watch", func(ctx context.Context, got func()) error {
		s, err := client.WatchResources(ctx, &verdictv1.WatchResourcesRequest{FromRevision: last, Prefix: *prefix})
		if err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return err
			}
			got()
			// A snapshot resumes only after its SYNCED marker; a change set
			// from its own revision.
			if m.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT {
				last = m.GetRevision()
			}
			if err := out.record(m, func(w io.Writer, _ bool) error { printWatchEvent(w, m); return nil }); err != nil {
				return err
			}
		}
	}, func() string {
		if last == 0 {
			return "; from a new snapshot"
		}
		return fmt.Sprintf(", resuming after revision %d", last)
	})
}

// follow runs a stream and, once it has delivered a message, reconnects
// when it ends for a reason that can pass (the server restarting, the
// follower falling behind), with a backoff from 0.5 s to 30 s, saying so on
// stderr. A stream that never delivered fails as any call does.
func follow(ctx context.Context, e *env, cmd string, attempt func(ctx context.Context, got func()) error, resume func() string) int {
	const first, most = 500 * time.Millisecond, 30 * time.Second
	backoff := first
	connected := false
	for {
		progressed := false
		err := attempt(ctx, func() { progressed, connected = true, true })
		if ctx.Err() != nil || status.Code(err) == codes.Canceled {
			return exitOK
		}
		if !connected || !transient(err) {
			return watchEnd(ctx, e, err)
		}
		if progressed {
			backoff = first
		}
		why := "the server ended it"
		if st, ok := status.FromError(err); ok && !errors.Is(err, io.EOF) {
			why = st.Code().String() + ": " + st.Message()
		}
		fmt.Fprintf(e.stderr, "verdictctl %s: stream ended (%s); reconnecting in %v%s\n", cmd, why, backoff, resume())
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, most)
	}
}

// transient: a stream ended this way may be opened again.
func transient(err error) bool {
	if errors.Is(err, io.EOF) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Internal, codes.Unknown, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// watchEnd turns the end of a watch into an exit code: Ctrl-C is a normal end.
func watchEnd(ctx context.Context, e *env, err error) int {
	if ctx.Err() != nil || status.Code(err) == codes.Canceled || errors.Is(err, io.EOF) {
		return exitOK
	}
	return fail(e, "watch", err, nil)
}

func printWatchEvent(w io.Writer, m *verdictv1.WatchResourcesResponse) {
	switch m.GetType() {
	case verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED:
		fmt.Fprintf(w, "%d SYNCED\n", m.GetRevision())
		return
	case verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT:
		if m.GetFresh() {
			fmt.Fprintf(w, "%d SNAPSHOT (forget what came before)\n", m.GetRevision())
		}
	}
	for _, c := range m.GetChanges() {
		op := "PUT"
		switch {
		case c.GetDeleted():
			op = "DELETE"
		case m.GetType() == verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT:
			op = "HAS"
		}
		line := fmt.Sprintf("%d %s %s", m.GetRevision(), op, c.GetKey())
		if e := c.GetResource().GetError(); e != "" {
			line += "  INVALID: " + e
		}
		fmt.Fprintln(w, line)
	}
}

// printRules writes a WatchRules message; withWorkload adds the line naming
// the workload and its addresses (inspect names it once, above).
func printRules(w io.Writer, m *verdictv1.WatchRulesResponse, withWorkload bool) {
	if m.GetKind() == verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS {
		fmt.Fprintf(w, "revision %d: set deltas\n", m.GetRevision())
		for _, d := range m.GetSetDeltas() {
			var parts []string
			for _, a := range d.GetAdded() {
				parts = append(parts, "+"+a)
			}
			for _, a := range d.GetRemoved() {
				parts = append(parts, "-"+a)
			}
			fmt.Fprintf(w, "  set %s: %s\n", d.GetName(), strings.Join(parts, " "))
		}
		return
	}
	fmt.Fprintf(w, "revision %d\n", m.GetRevision())
	if r := m.GetWorkload(); withWorkload && r != nil && r.GetWorkload() != "" {
		if addrs := m.GetWorkloadAddresses(); len(addrs) > 0 {
			fmt.Fprintf(w, "  workload %s: %s\n", r.GetWorkload(), strings.Join(addrs, " "))
		} else {
			fmt.Fprintf(w, "  workload %s\n", r.GetWorkload())
		}
	}
	for _, s := range []struct {
		name string
		r    *verdictv1.SideRules
	}{{"inbound (flows to the workload)", m.GetInbound()}, {"outbound (flows from the workload)", m.GetOutbound()}} {
		fmt.Fprintf(w, "  %s, %s:\n", s.name, s.r.GetCombine())
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "    #\tPHASE\tSCOPE\tPOLICY\tRULE\tPEER\tPORTS\tACTION")
		for i, r := range s.r.GetRules() {
			peer := selectorsText(r.GetPeer())
			if len(r.GetPeerSets())+len(r.GetPeerCidrs()) > 0 {
				peer += " = " + strings.Join(append(append([]string(nil), r.GetPeerSets()...), r.GetPeerCidrs()...), ",")
			}
			var ports []string
			for _, p := range r.GetPorts() {
				ports = append(ports, strings.TrimSuffix(p.GetProtocol()+"/"+p.GetPorts(), "/"))
			}
			action := actionText(r.GetAction())
			if r.GetAudit() {
				action += " (audit: not enforced)"
			}
			fmt.Fprintf(tw, "    %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i+1, r.GetPhase(), orDash(r.GetScope()), orDash(r.GetPolicy()),
				r.GetRule(), peer, orDash(strings.Join(ports, " ")), action)
		}
		fmt.Fprintf(tw, "    *\tfallback\t\t\t\t\t\t%s (%s)\n", actionText(s.r.GetFallback()), reasonText(s.r.GetFallbackReason()))
		tw.Flush()
	}
	for _, set := range m.GetSets() {
		fmt.Fprintf(w, "  set %s: %s\n", set.GetName(), orDash(strings.Join(set.GetAddresses(), " ")))
	}
}

// workloadEndpoint is the workload of watch rules (and inspect): by tags,
// name or address, exactly one.
func workloadEndpoint(tags, name, address string) (*verdictv1.Endpoint, error) {
	n := 0
	for _, v := range []string{tags, name, address} {
		if v != "" {
			n++
		}
	}
	switch {
	case n != 1:
		return nil, fmt.Errorf("name the workload: --workload k=v,.., --workload-name NAME or --workload-address IP (one of them)")
	case name != "":
		return &verdictv1.Endpoint{Workload: name}, nil
	case address != "":
		return &verdictv1.Endpoint{Address: address}, nil
	}
	t, err := parseTags(tags)
	if err != nil {
		return nil, fmt.Errorf("--workload: %w", err)
	}
	return &verdictv1.Endpoint{Tags: t}, nil
}
