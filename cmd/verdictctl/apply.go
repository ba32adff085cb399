package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/docpos"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(s string) error { *f = append(*f, s); return nil }

// loaded is a resource read from a file, with where it came from.
type loaded struct {
	res resource.Resource
	src *docpos.Source // the file
	doc int            // its index among the file's documents
}

// at is a docpos.Problem at path of the resource's document.
func (l loaded) at(path, msg string) docpos.Problem {
	if l.src == nil {
		return docpos.Problem{Path: path, Msg: msg}
	}
	return l.src.At(l.doc, path, msg)
}

// inputFiles expands the arguments of -f: a directory's .yaml, .yml and
// .json files in name order, "-" (stdin) and files as given.
func inputFiles(files []string) ([]string, error) {
	var out []string
	for _, f := range files {
		if f == "-" {
			out = append(out, f)
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			out = append(out, f)
			continue
		}
		entries, err := os.ReadDir(f)
		if err != nil {
			return nil, err
		}
		var paths []string
		for _, e := range entries {
			switch filepath.Ext(e.Name()) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					paths = append(paths, filepath.Join(f, e.Name()))
				}
			}
		}
		sort.Strings(paths)
		out = append(out, paths...)
	}
	return out, nil
}

// readResources reads every document of the files. A file that cannot be
// read is an I/O error (err); invalid documents are docpos.Problems, every one of
// every file, with its position.
func readResources(files []string, stdin io.Reader) ([]loaded, docpos.Problems, error) {
	paths, err := inputFiles(files)
	if err != nil {
		return nil, nil, err
	}
	var out []loaded
	var probs docpos.Problems
	for i, p := range paths {
		var data []byte
		if p == "-" {
			data, err = io.ReadAll(stdin)
			p = "stdin"
		} else {
			data, err = os.ReadFile(p)
		}
		if err != nil {
			return nil, nil, err
		}
		src := docpos.NewSource(p, i, data)
		rs, err := resource.DecodeYAML(data)
		if err != nil {
			probs = append(probs, src.DecodeProblems(err)...)
			continue
		}
		for j, r := range rs {
			out = append(out, loaded{res: r, src: src, doc: j})
		}
	}
	return out, probs, nil
}

// readInput is readResources for a command: it prints what is wrong and
// returns the exit code to stop with (invalid: invalid documents end the
// command with that code).
func readInput(e *env, cmd string, files []string, invalid int) ([]loaded, int) {
	items, probs, err := readResources(files, e.stdin)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl %s: %v\n", cmd, err)
		return nil, exitError
	}
	if len(probs) > 0 {
		fmt.Fprintf(e.stderr, "verdictctl %s: invalid documents (nothing was sent):\n", cmd)
		probs.Print(e.stderr, "  ")
		return nil, invalid
	}
	return items, exitOK
}

var resourceIndex = regexp.MustCompile(`^resources\[(\d+)\](?:\.(?:mesh|scope|policy|workload)\b)?\.?`)

func runApply(ctx context.Context, args []string, e *env) int {
	fs := newFlags("apply", e)
	var files fileList
	fs.Var(&files, "f", "`FILE`, directory or - (stdin) of YAML or JSON documents, native or Kuma; repeatable")
	dryRun := fs.Bool("dry-run", false, "validate only and say what each document would do; write nothing")
	lintMode := "warn"
	fs.Func("lint", "`MODE`: warn (print the lint findings the change brings; the default), error (also write nothing and exit 1 when it brings an error-level one), off", func(s string) error {
		switch s {
		case "warn", "error", "off":
			lintMode = s
			return nil
		}
		return fmt.Errorf("not warn, error or off")
	})
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	if len(files) == 0 || len(rest) > 0 {
		return fs.usage("give the resources with -f FILE|DIR|- (and nothing else)")
	}
	items, code := readInput(e, "apply", files, exitError)
	if code != exitOK {
		return code
	}
	if len(items) == 0 {
		fmt.Fprintln(e.stderr, "verdictctl apply: no resource in the input")
		return exitError
	}
	ops := make([]*op, len(items))
	for i, it := range items {
		pb, err := apiconv.ResourceToProto(it.res)
		if err != nil {
			return fail(e, "apply", err, nil)
		}
		ops[i] = &op{key: it.res.Key(), res: it.res, pb: pb, from: it}
	}
	ops = orderOps(ops)
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "apply", err, nil)
	}
	defer conn.Close()
	if code := lintChange(ctx, e, &cf, conn, ops, lintMode); code != exitOK {
		return code
	}
	w := &writer{client: verdictv1.NewPolicyServiceClient(conn), cf: &cf, e: e, cmd: "apply", dryRun: *dryRun, maxOps: e.maxOps,
		out: output.printer(e.stdout)}
	if len(splitOps(ops, w.maxOps)) > 1 {
		cur, warnings, code := w.checkWhole(ctx, ops)
		if code != exitOK {
			return code
		}
		if *dryRun {
			return w.dryRunWhole(cur, ops, warnings)
		}
	}
	return w.execute(ctx, ops)
}

// dryRunWhole reports the check of a set over one call's limit: the server
// checks one call at a time, against its snapshot, so a split set's later
// calls would fail for want of the earlier ones; the set was checked whole
// here with the server's engine instead, and each document's outcome is
// judged against what the server holds, as the server judges it.
func (w *writer) dryRunWhole(cur *current, ops []*op, warnings []string) int {
	for _, warn := range warnings {
		fmt.Fprintf(w.e.stderr, "warning: %s\n", warn)
	}
	resp := &verdictv1.ApplyResponse{Revision: cur.snap.Revision(), Warnings: warnings}
	for _, o := range ops {
		if o.isDelete() {
			resp.Deleted = append(resp.Deleted, o.key.String())
			continue
		}
		resp.Keys = append(resp.Keys, o.key.String())
		resp.Results = append(resp.Results, &verdictv1.ApplyResult{Key: o.key.String(), Outcome: cur.outcome(o)})
	}
	for _, k := range resp.GetDeleted() {
		resp.Results = append(resp.Results, &verdictv1.ApplyResult{Key: k, Outcome: verdictv1.ApplyOutcome_APPLY_OUTCOME_DELETED})
	}
	rep := writeReport{DryRun: true}
	rep.add(resp)
	err := w.out.print(rep, func(out io.Writer, _ bool) error {
		w.printCall(out, resp)
		_, err := fmt.Fprintf(out, "dry run: nothing was written (the whole set of %d keys checked against the server's contents at revision %d)\n",
			len(ops), cur.snap.Revision())
		return err
	})
	if err != nil {
		return fail(w.e, w.cmd, err, nil)
	}
	return exitOK
}
