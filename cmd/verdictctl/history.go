package main

// The store's past (docs/history.md): --at-revision and --at on reads,
// history, diff --from-revision, revert.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// pastFlags name a past revision or time to read at.
type pastFlags struct {
	rev  int64
	at   time.Time
	now  func() time.Time
	time bool // --at is registered
}

// register adds --at-revision, and with withTime --at.
func (p *pastFlags) register(fs *flagSet, withTime bool) {
	p.now = time.Now
	fs.Func("at-revision", "answer as the store was at this past `REVISION` (docs/history.md)", func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return errors.New("not a revision (1 or more)")
		}
		p.rev = n
		return nil
	})
	if withTime {
		p.time = true
		fs.Func("at", "answer as the store was at `TIME`: RFC 3339 (2026-11-21T14:00:00Z) or relative to now (-2h, -30m)",
			func(s string) error {
				t, err := parseTime(s, p.now())
				if err != nil {
					return err
				}
				p.at = t
				return nil
			})
	}
}

// parseTime reads RFC 3339, or a negative Go duration relative to now.
func parseTime(s string, now time.Time) (time.Time, error) {
	if strings.HasPrefix(s, "-") {
		d, err := time.ParseDuration(s)
		if err != nil {
			return time.Time{}, errors.New("not a time: RFC 3339 (2026-11-21T14:00:00Z) or relative (-2h, -90m)")
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, errors.New("not a time: RFC 3339 (2026-11-21T14:00:00Z) or relative (-2h, -90m)")
	}
	return t, nil
}

// check refuses two ways of naming a revision at once.
func (p *pastFlags) check(minRev int64) error {
	n := 0
	for _, set := range []bool{p.rev != 0, !p.at.IsZero(), minRev != 0} {
		if set {
			n++
		}
	}
	if n > 1 {
		if p.time {
			return errors.New("--at-revision, --at and --min-revision exclude each other")
		}
		return errors.New("--at-revision and --min-revision exclude each other")
	}
	return nil
}

// atTime is the --at time for a request; nil when not given.
func (p *pastFlags) atTime() *timestamppb.Timestamp {
	if p.at.IsZero() {
		return nil
	}
	return timestamppb.New(p.at)
}

func runHistory(ctx context.Context, args []string, e *env) int {
	fs := newFlags("history", e)
	prefix := fs.Bool("prefix", false, "KEY is a key prefix: the versions of every key under it (\"default/\", \"\" for all)")
	from := fs.Int64("from-revision", 0, "only versions written after this `REVISION` (default: the oldest held)")
	to := fs.Int64("to-revision", 0, "and up to this `REVISION` (default: the current one)")
	pageSize := fs.Int("page-size", 100, "versions per call, 1-1000 (every page is read)")
	limit := fs.Int("limit", 0, "print at most the last `N` versions (0: all)")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	key := ""
	switch {
	case len(rest) == 1:
		key = rest[0]
	case len(rest) > 1:
		return fs.usage("give one KEY (or with --prefix a PREFIX)")
	case !*prefix:
		return fs.usage("give a KEY, or --prefix [PREFIX]")
	}
	if *pageSize < 1 || *pageSize > 1000 || *limit < 0 || *from < 0 || *to < 0 {
		return fs.usage("--page-size is 1-1000; --limit, --from-revision and --to-revision are not negative")
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "history", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewPolicyServiceClient(conn)
	all := &verdictv1.HistoryResponse{}
	req := &verdictv1.HistoryRequest{Key: key, Prefix: *prefix, FromRevision: *from, ToRevision: *to, PageSize: int32(*pageSize)}
	for {
		cctx, cancel := cf.ctx(ctx)
		resp, err := client.History(cctx, req)
		cancel()
		if err != nil {
			return fail(e, "history", err, nil)
		}
		all.Versions = append(all.Versions, resp.GetVersions()...)
		all.FromRevision, all.ToRevision = resp.GetFromRevision(), resp.GetToRevision()
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if *limit > 0 && len(all.Versions) > *limit {
		all.Versions = all.Versions[len(all.Versions)-*limit:]
	}
	err = output.printer(e.stdout).print(all, func(w io.Writer, wide bool) error {
		return printHistory(w, all, wide)
	})
	if err != nil {
		return fail(e, "history", err, nil)
	}
	return exitOK
}

// printHistory prints one line per version (revision, time, writer, change,
// key), and with wide each version's unified diff to the one before.
func printHistory(w io.Writer, h *verdictv1.HistoryResponse, wide bool) error {
	if len(h.GetVersions()) == 0 {
		fmt.Fprintf(w, "no version written in revisions (%d, %d]\n", h.GetFromRevision(), h.GetToRevision())
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REVISION\tTIME\tWRITER\tCHANGE\tKEY")
	for _, v := range h.GetVersions() {
		when := "-"
		if v.GetTime() != nil {
			when = v.GetTime().AsTime().UTC().Format(time.RFC3339)
		}
		who := orDash(v.GetWriter())
		if v.GetVia() == "revert" {
			who += " (revert)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", v.GetRevision(), when, who, changeText(v.GetChange()), v.GetKey())
		if !wide {
			continue
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		before, err := storedText(v.GetPrevious())
		if err != nil {
			return err
		}
		after, err := storedText(v.GetResource())
		if err != nil {
			return err
		}
		from, to := v.GetKey()+"\t(before)", fmt.Sprintf("%s\t(revision %d)", v.GetKey(), v.GetRevision())
		if v.GetPrevious() == nil {
			from = "/dev/null"
		}
		if v.GetResource() == nil {
			to = "/dev/null"
		}
		unifiedDiff(w, from, to, before, after)
	}
	return tw.Flush()
}

func changeText(c verdictv1.VersionChange) string {
	return strings.ToLower(strings.TrimPrefix(c.String(), "VERSION_CHANGE_"))
}

// storedText is a stored resource's canonical text for a diff ("" for
// nothing; a value that does not decode, as a comment).
func storedText(sr *verdictv1.StoredResource) (string, error) {
	if sr == nil {
		return "", nil
	}
	if sr.GetResource() == nil {
		return fmt.Sprintf("# the stored value does not decode: %s\n", sr.GetError()), nil
	}
	r, err := apiconv.ResourceFromProto(sr.GetKey(), sr.GetResource())
	if err != nil {
		return fmt.Sprintf("# the stored value is invalid: %v\n", err), nil
	}
	return canonicalText(r)
}

// runDiffRevisions is diff --from-revision A [--to-revision B]: the
// resources that differ between two revisions, exit 1 when some do.
func runDiffRevisions(ctx context.Context, e *env, output outputFlag, cf *connFlags, prefix string, from, to int64) int {
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "diff", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewPolicyServiceClient(conn).Diff(cctx, &verdictv1.DiffRequest{Prefix: prefix, FromRevision: from, ToRevision: to})
	if err != nil {
		return fail(e, "diff", err, nil)
	}
	err = output.printer(e.stdout).print(resp, func(w io.Writer, _ bool) error {
		for _, d := range resp.GetDifferences() {
			before, err := storedText(d.GetBefore())
			if err != nil {
				return err
			}
			after, err := storedText(d.GetAfter())
			if err != nil {
				return err
			}
			fromName := fmt.Sprintf("%s\t(revision %d)", d.GetKey(), resp.GetFromRevision())
			toName := fmt.Sprintf("%s\t(revision %d)", d.GetKey(), resp.GetToRevision())
			if d.GetBefore() == nil {
				fromName = "/dev/null"
			}
			if d.GetAfter() == nil {
				toName = "/dev/null"
			}
			fmt.Fprintf(w, "diff -u %s %s\n", d.GetKey(), changeText(d.GetChange()))
			unifiedDiff(w, fromName, toName, before, after)
		}
		printDiffFlows(w, resp)
		return nil
	})
	if err != nil {
		return fail(e, "diff", err, nil)
	}
	if len(resp.GetDifferences()) > 0 || len(resp.GetFlows().GetChanges()) > 0 {
		return exitFailed
	}
	return exitOK
}

// printDiffFlows prints the workload pairs whose answer differs between
// the two revisions of a Diff, after its resources.
func printDiffFlows(w io.Writer, resp *verdictv1.DiffResponse) {
	f := resp.GetFlows()
	switch {
	case resp.GetFlowsError() != "":
		fmt.Fprintf(w, "\nFlows not judged: %s\n", resp.GetFlowsError())
		return
	case f == nil:
		return
	case len(f.GetChanges()) == 0:
		fmt.Fprintf(w, "\nNo workload pair's answer differs between revision %d and %d (%s considered).\n",
			resp.GetFromRevision(), resp.GetToRevision(), count(int(f.GetConsidered()), "flow", "flows"))
		return
	}
	fmt.Fprintf(w, "\nWorkload pairs whose answer differs from revision %d (before) to %d (after): %s\n",
		resp.GetFromRevision(), resp.GetToRevision(), count(len(f.GetChanges()), "flow", "flows"))
	printFlowChanges(w, f, false, "-o json")
}

func runRevert(ctx context.Context, args []string, e *env) int {
	fs := newFlags("revert", e)
	prefix := fs.Bool("prefix", false, "KEY is a key prefix: revert every key under it")
	to := fs.Int64("to-revision", 0, "write back what the keys held at this `REVISION` (required)")
	expected := fs.Int64("expected-revision", 0, "refuse if a key changed after this `REVISION` (default: the revision read now)")
	dryRun := fs.Bool("dry-run", false, "say what would be written; write nothing")
	var output outputFlag
	output.register(fs, "text", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	key := ""
	switch {
	case len(rest) == 1:
		key = rest[0]
	case len(rest) > 1:
		return fs.usage("give one KEY (or with --prefix a PREFIX)")
	case !*prefix:
		return fs.usage("give a KEY, or --prefix PREFIX")
	}
	if *to < 1 {
		return fs.usage("--to-revision N is required (1 or more)")
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "revert", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewPolicyServiceClient(conn)
	seen := *expected
	if seen == 0 {
		if seen, err = storeRevision(ctx, client, &cf); err != nil {
			return fail(e, "revert", err, nil)
		}
	}
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := client.Revert(cctx, &verdictv1.RevertRequest{Key: key, Prefix: *prefix, ToRevision: *to, ExpectedRevision: seen, DryRun: *dryRun})
	if err != nil {
		return fail(e, "revert", err, nil)
	}
	if !*dryRun && len(resp.GetResults()) > 0 {
		awaitServed(ctx, e, client, &cf, resp.GetRevision())
	}
	err = output.printer(e.stdout).print(resp, func(w io.Writer, _ bool) error {
		for _, r := range resp.GetResults() {
			fmt.Fprintf(w, "%s %s\n", r.GetKey(), outcomeText(r.GetOutcome()))
		}
		switch {
		case len(resp.GetResults()) == 0:
			fmt.Fprintf(w, "nothing to revert: the keys hold what they held at revision %d (revision %d)\n", *to, resp.GetRevision())
		case *dryRun:
			fmt.Fprintf(w, "dry run: nothing written (read at revision %d)\n", resp.GetRevision())
		default:
			fmt.Fprintf(w, "reverted to revision %d as revision %d\n", *to, resp.GetRevision())
		}
		return nil
	})
	if err != nil {
		return fail(e, "revert", err, nil)
	}
	return exitOK
}
