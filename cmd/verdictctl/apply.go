package main

import (
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

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/writeplan"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(s string) error { *f = append(*f, s); return nil }

// loaded is a resource read from a file, with where it came from.
type loaded struct {
	res    engine.Resource
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
			rs, err := engine.DecodeYAML(data)
			if err != nil {
				var ve *engine.ValidationError
				if errors.As(err, &ve) {
					for _, fe := range ve.Errors {
						errs = append(errs, fmt.Errorf("%s: %s", p, fe.Error()))
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
			"is sent in several calls, each atomic, meshes and scopes first; the command says so.", e.stderr)
	var files fileList
	fs.Var(&files, "f", "file, directory or - (stdin) of YAML or JSON documents, native or Kuma; repeatable")
	dryRun := fs.Bool("dry-run", false, "validate only; write nothing")
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
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "apply", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewPolicyServiceClient(conn)
	origins := make(map[engine.Resource]string, len(items))
	all := make([]engine.Resource, len(items))
	for i, it := range items {
		all[i], origins[it.res] = it.res, it.origin
	}
	parts := writeplan.Split(all, 0)
	if len(parts) > 1 {
		fmt.Fprintf(e.stdout, "%d resources do not fit one transaction: applying them in %d calls, each atomic "+
			"(if one fails, the calls before it stay applied)\n", len(all), len(parts))
	}
	verb := "applied"
	if *dryRun {
		verb = "valid (dry run)"
	}
	for n, part := range parts {
		req := &verdictv1.ApplyRequest{DryRun: *dryRun}
		for _, r := range part {
			pr, err := apiconv.ResourceToProto(r)
			if err != nil {
				return fail(e, "apply", err, nil)
			}
			req.Resources = append(req.Resources, pr)
		}
		origin := func(field string) string {
			m := resourceIndex.FindStringSubmatch(field)
			if m == nil {
				return field
			}
			i, _ := strconv.Atoi(m[1])
			if i >= len(part) {
				return field
			}
			return origins[part[i]] + strings.TrimPrefix(field, m[0])
		}
		cctx, cancel := cf.ctx(ctx)
		resp, err := client.Apply(cctx, req)
		cancel()
		if err != nil {
			if len(parts) > 1 {
				fmt.Fprintf(e.stderr, "call %d of %d failed; the %d calls before it were applied\n", n+1, len(parts), n)
			}
			return fail(e, "apply", err, origin)
		}
		for _, w := range resp.GetWarnings() {
			fmt.Fprintf(e.stderr, "warning: %s\n", origin(w))
		}
		for _, k := range resp.GetKeys() {
			fmt.Fprintf(e.stdout, "%s %s\n", k, verb)
		}
		fmt.Fprintf(e.stdout, "revision %d\n", resp.GetRevision())
	}
	return exitOK
}
