package main

// verdictctl diff -f: what apply -f would change, as kubectl diff shows it
// (diff --from-revision A --to-revision B, the store between two revisions,
// is in history.go).
// Each document is compared with what the server holds at its key, both in
// the canonical native form without the times and revisions the store
// stamps (the comparison verdictd makes before it writes, writeplan.Same):
// a document that would change nothing prints nothing.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/writeplan"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func runDiff(ctx context.Context, args []string, e *env) int {
	fs := newFlags("diff", e)
	var files fileList
	fs.Var(&files, "f", "`FILE`, directory or - (stdin) of documents, native or Kuma; repeatable")
	from := fs.Int64("from-revision", 0, "compare the store at this `REVISION` ... (instead of -f)")
	to := fs.Int64("to-revision", 0, "... with the store at this `REVISION` (default: the current one)")
	prefix := fs.String("prefix", "", "with --from-revision: only keys under this `PREFIX`")
	var output outputFlag
	output.register(fs, "text", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	if *from != 0 || *to != 0 || *prefix != "" {
		switch {
		case len(files) > 0 || len(rest) > 0:
			return fs.usage("give either -f FILE|DIR|- or --from-revision A [--to-revision B], and nothing else")
		case *from < 1 || *to < 0:
			return fs.usage("--from-revision A is required with --to-revision and --prefix (a revision, 1 or more)")
		}
		return runDiffRevisions(ctx, e, output, &cf, *prefix, *from, *to)
	}
	if len(files) == 0 || len(rest) > 0 {
		return fs.usage("give the documents with -f FILE|DIR|-, or two revisions with --from-revision A [--to-revision B]")
	}
	items, code := readInput(e, "diff", files, exitError)
	if code != exitOK {
		return code
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "diff", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewPolicyServiceClient(conn)
	rev, err := storeRevision(ctx, client, &cf)
	if err != nil {
		return fail(e, "diff", err, nil)
	}
	stored := map[string]*verdictv1.StoredResource{}
	listed := map[string]bool{}
	for _, it := range items {
		mesh := it.res.Key().Mesh
		if listed[mesh] {
			continue
		}
		listed[mesh] = true
		all, err := listAll(ctx, client, &cf, mesh+"/", rev)
		if err != nil {
			return fail(e, "diff", err, nil)
		}
		for _, sr := range all {
			stored[sr.GetKey()] = sr
		}
	}
	rep := diffReport{Revision: rev}
	var text bytes.Buffer
	for _, it := range items {
		key := it.res.Key().String()
		next, err := canonicalText(it.res)
		if err != nil {
			return fail(e, "diff", err, nil)
		}
		sr, ok := stored[key]
		outcome := verdictv1.ApplyOutcome_APPLY_OUTCOME_CREATED
		var before string
		if ok {
			outcome = verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED
			if sr.GetResource() == nil {
				before = fmt.Sprintf("# the stored value does not decode: %s\n", sr.GetError())
			} else if r, err := apiconv.ResourceFromProto(key, sr.GetResource()); err != nil {
				before = fmt.Sprintf("# the stored value is invalid: %v\n", err)
			} else {
				if writeplan.Same(r, it.res) && sr.GetError() == "" {
					outcome = verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED
				}
				if before, err = canonicalText(r); err != nil {
					return fail(e, "diff", err, nil)
				}
			}
		}
		rep.Results = append(rep.Results, diffResult{Key: key, Outcome: outcomeText(outcome)})
		if outcome == verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED {
			continue
		}
		rep.Differ = true
		from := fmt.Sprintf("%s\t(server, revision %d)", key, sr.GetModRevision())
		if !ok {
			from = "/dev/null"
		}
		p := it.at("", "")
		to := fmt.Sprintf("%s\t(%s:%d)", key, p.File, p.Line)
		fmt.Fprintf(&text, "diff -u %s %s\n", key, outcomeText(outcome))
		unifiedDiff(&text, from, to, before, next)
	}
	err = output.printer(e.stdout).print(rep, func(w io.Writer, _ bool) error {
		_, err := w.Write(text.Bytes())
		return err
	})
	if err != nil {
		return fail(e, "diff", err, nil)
	}
	if rep.Differ {
		return exitFailed
	}
	return exitOK
}

// diffReport is diff's answer as a document.
type diffReport struct {
	Revision int64        `json:"revision,string"` // the store's, compared against
	Differ   bool         `json:"differ"`
	Results  []diffResult `json:"results"`
}

type diffResult struct {
	Key     string `json:"key"`
	Outcome string `json:"outcome"` // what apply would do: created, configured, unchanged
}

// canonicalText is a resource's native document as YAML, without the times
// the store stamps.
func canonicalText(r resource.Resource) (string, error) {
	pb, err := apiconv.ResourceToProto(r.WithMeta(resource.Meta{}))
	if err != nil {
		return "", err
	}
	doc, err := resourceDoc(pb)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	err = printYAMLDoc(&b, doc)
	return b.String(), err
}

// unifiedDiff writes the unified diff (3 lines of context) of two texts.
func unifiedDiff(w io.Writer, fromName, toName, a, b string) {
	x, y := splitLines(a), splitLines(b)
	// The longest common subsequence, by dynamic programming: documents are
	// small.
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type edit struct {
		op   byte // ' ', '-', '+'
		text string
		i, j int // the line numbers (from 0) in x and y before it
	}
	var edits []edit
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			edits = append(edits, edit{' ', x[i], i, j})
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			edits = append(edits, edit{'-', x[i], i, j})
			i++
		default:
			edits = append(edits, edit{'+', y[j], i, j})
			j++
		}
	}
	fmt.Fprintf(w, "--- %s\n+++ %s\n", fromName, toName)
	const context = 3
	for k := 0; k < len(edits); {
		if edits[k].op == ' ' {
			k++
			continue
		}
		// A hunk: from context lines before this change to context lines
		// after the last change closer than 2*context to the next.
		start := max(k-context, 0)
		end := k
		for n := k; n < len(edits); n++ {
			if edits[n].op != ' ' {
				end = n
			} else if n-end > 2*context {
				break
			}
		}
		stop := min(end+context+1, len(edits))
		var del, ins int
		for _, e := range edits[start:stop] {
			if e.op != '+' {
				del++
			}
			if e.op != '-' {
				ins++
			}
		}
		fi, fj := edits[start].i+1, edits[start].j+1
		if del == 0 {
			fi--
		}
		if ins == 0 {
			fj--
		}
		fmt.Fprintf(w, "@@ -%d,%d +%d,%d @@\n", fi, del, fj, ins)
		for _, e := range edits[start:stop] {
			fmt.Fprintf(w, "%c%s\n", e.op, e.text)
		}
		k = stop
	}
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}
