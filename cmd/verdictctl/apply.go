package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(s string) error { *f = append(*f, s); return nil }

// loaded is a resource read from a file, with where it came from.
type loaded struct {
	res    resource.Resource
	origin string // "policies.yaml documents[3]"
}

// readResources reads every document of the files (a directory: its .yaml,
// .yml and .json files in name order; "-": stdin).
func readResources(files []string, stdin io.Reader) ([]loaded, error) {
	var out []loaded
	var errs []error
	for _, f := range files {
		paths := []string{f}
		if f != "-" {
			if fi, err := os.Stat(f); err != nil {
				return nil, err
			} else if fi.IsDir() {
				paths = nil
				entries, err := os.ReadDir(f)
				if err != nil {
					return nil, err
				}
				for _, e := range entries {
					switch filepath.Ext(e.Name()) {
					case ".yaml", ".yml", ".json":
						if !e.IsDir() {
							paths = append(paths, filepath.Join(f, e.Name()))
						}
					}
				}
				sort.Strings(paths)
			}
		}
		for _, p := range paths {
			var data []byte
			var err error
			if p == "-" {
				data, err = io.ReadAll(stdin)
				p = "stdin"
			} else {
				data, err = os.ReadFile(p)
			}
			if err != nil {
				return nil, err
			}
			rs, err := resource.DecodeYAML(data)
			if err != nil {
				var ve *resource.ValidationError
				if errors.As(err, &ve) {
					for _, fe := range ve.Errors {
						errs = append(errs, fmt.Errorf("%s: %s", p, fieldLines(data, fe).Error()))
					}
					continue
				}
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			for i, r := range rs {
				out = append(out, loaded{res: r, origin: fmt.Sprintf("%s documents[%d]", p, i)})
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

var resourceIndex = regexp.MustCompile(`^resources\[(\d+)\]`)

func runApply(ctx context.Context, args []string, e *env) int {
	fs := newFlags("apply", "-f FILE|DIR|- [-f ...] [--dry-run]",
		"Validates and writes resources. A set larger than one etcd transaction (128 resources)\n"+
			"is checked whole against the server's contents, then sent in several calls in dependency\n"+
			"order, each atomic; if one fails, the calls before it are rolled back (docs/cli.md).", e.stderr)
	var files fileList
	fs.Var(&files, "f", "file, directory or - (stdin) of YAML or JSON documents, native or Kuma; repeatable")
	dryRun := fs.Bool("dry-run", false, "validate only; write nothing")
	var output outputFlag
	output.register(fs, "text", "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(files) == 0 || len(rest) > 0 {
		fmt.Fprintln(e.stderr, "verdictctl apply: give the resources with -f FILE|DIR|- (and nothing else)")
		return exitUsage
	}
	items, err := readResources(files, e.stdin)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl apply: invalid input:\n%v\n", err)
		return exitError
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
		ops[i] = &op{key: it.res.Key(), res: it.res, pb: pb, origin: it.origin}
	}
	ops = orderOps(ops)
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "apply", err, nil)
	}
	defer conn.Close()
	w := &writer{client: verdictv1.NewPolicyServiceClient(conn), cf: &cf, e: e, cmd: "apply", dryRun: *dryRun, maxOps: e.maxOps, output: output.value}
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
// here with the server's engine instead.
func (w *writer) dryRunWhole(cur *current, ops []*op, warnings []string) int {
	for _, warn := range warnings {
		fmt.Fprintf(w.e.stderr, "warning: %s\n", warn)
	}
	verb := "valid (dry run)"
	if w.cmd == "delete" {
		verb = "can be deleted (dry run)"
	}
	if w.structured() {
		keys := make([]string, len(ops))
		for i, o := range ops {
			keys[i] = o.key.String()
		}
		call := writeCall{Revision: cur.snap.Revision(), Warnings: warnings}
		if w.cmd == "delete" {
			call.Deleted = keys
		} else {
			call.Written = keys
		}
		if err := printValue(w.e.stdout, w.output, writeResult{DryRun: true, Calls: []writeCall{call}}); err != nil {
			return fail(w.e, w.cmd, err, nil)
		}
		return exitOK
	}
	for _, o := range ops {
		fmt.Fprintf(w.e.stdout, "%s %s\n", o.key, verb)
	}
	fmt.Fprintf(w.e.stdout, "dry run: nothing was written (the whole set of %d keys checked against the server's contents at revision %d)\n",
		len(ops), cur.snap.Revision())
	return exitOK
}

var docField = regexp.MustCompile(`^documents\[(\d+)\] \(line (\d+)\)(.*)$`)

// fieldLines rewrites "documents[i] (line N).path: why" to name the line of
// the field itself (the document's first line when the path is not found).
func fieldLines(data []byte, fe resource.FieldError) resource.FieldError {
	m := docField.FindStringSubmatch(fe.Field)
	if m == nil || m[3] == "" {
		return fe
	}
	i, _ := strconv.Atoi(m[1])
	dec := yaml.NewDecoder(bytes.NewReader(data))
	n := -1
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			return fe
		}
		if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" {
			continue // skipped by the decoder too
		}
		if n++; n < i {
			continue
		}
		line := fieldNode(doc.Content[0], strings.TrimPrefix(m[3], "."))
		if line > 0 {
			fe.Field = fmt.Sprintf("documents[%s] (line %d)%s", m[1], line, m[3])
		}
		return fe
	}
}

var pathPart = regexp.MustCompile(`^([^.\[]+)?((?:\[\d+\])*)`)

// fieldNode returns the line of path ("sources[0].match") in n: of the
// deepest node the path reaches.
func fieldNode(n *yaml.Node, path string) int {
	line := n.Line
	for path != "" && n != nil {
		m := pathPart.FindStringSubmatch(path)
		if m == nil || m[0] == "" {
			return line
		}
		path = strings.TrimPrefix(path[len(m[0]):], ".")
		if m[1] != "" {
			if n.Kind != yaml.MappingNode {
				return line
			}
			var next *yaml.Node
			for k := 0; k+1 < len(n.Content); k += 2 {
				if n.Content[k].Value == m[1] {
					line, next = n.Content[k].Line, n.Content[k+1]
					break
				}
			}
			if next == nil {
				return line
			}
			n = next
		}
		for _, idx := range regexp.MustCompile(`\d+`).FindAllString(m[2], -1) {
			j, _ := strconv.Atoi(idx)
			if n.Kind != yaml.SequenceNode || j >= len(n.Content) {
				return line
			}
			n = n.Content[j]
			line = n.Line
		}
	}
	return line
}
