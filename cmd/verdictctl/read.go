package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// keyOf reads KEY or KIND NAME (with --mesh and --type).
func keyOf(args []string, mesh, typ string) (string, error) {
	switch len(args) {
	case 1:
		if strings.Contains(args[0], "/") {
			return args[0], nil
		}
		if strings.EqualFold(args[0], "mesh") {
			return mesh + "/mesh", nil
		}
	case 2:
		switch strings.ToLower(args[0]) {
		case "mesh":
			return args[1] + "/mesh", nil
		case "scope":
			return mesh + "/scopes/" + args[1], nil
		case "policy":
			return mesh + "/policies/" + typ + "/" + args[1], nil
		case "workload":
			return mesh + "/workloads/" + args[1], nil
		}
	}
	return "", fmt.Errorf("name a resource as KEY (default/policies/TrafficPermission/x) or KIND NAME (mesh, scope, policy, workload)")
}

func runGet(ctx context.Context, args []string, e *env) int {
	fs := newFlags("get", "KEY | KIND NAME", "Shows one resource from the server's snapshot, valid or not, as YAML\n"+
		"(re-appliable; the key, revisions and any error as comments) or JSON.", e.stderr)
	mesh := fs.String("mesh", engine.DefaultMesh, "mesh, for KIND NAME")
	typ := fs.String("type", engine.DefaultType, "policy type, for policy NAME")
	var output outputFlag
	output.register(fs, "yaml", "yaml", "json", "text", "wide")
	minRev := fs.Int64("min-revision", 0, "answer from a snapshot at or after this revision")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	key, err := keyOf(rest, *mesh, *typ)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl get: %v\n", err)
		return exitUsage
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "get", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewPolicyServiceClient(conn).Get(cctx, &verdictv1.GetRequest{Key: key, MinRevision: *minRev})
	if err != nil {
		return fail(e, "get", err, nil)
	}
	if output.value == "json" {
		err = printJSON(e.stdout, resp.GetResource())
	} else { // text and wide are the YAML document: it is the resource's text form
		err = printStored(e.stdout, resp.GetResource())
	}
	if err != nil {
		return fail(e, "get", err, nil)
	}
	return exitOK
}

func runList(ctx context.Context, args []string, e *env) int {
	fs := newFlags("list", "[PREFIX]", "Lists resources in key order, valid or not (PREFIX: \"default/\",\n"+
		"\"default/policies/TrafficLog/\"). -o yaml prints every document, re-appliable.", e.stderr)
	mesh := fs.String("mesh", "", "only this mesh")
	typ := fs.String("type", "", "only policies of this type (with --mesh, default mesh \"default\")")
	var output outputFlag
	output.register(fs, "text", "text", "wide", "yaml", "json")
	minRev := fs.Int64("min-revision", 0, "answer from a snapshot at or after this revision")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	prefix := ""
	switch {
	case len(rest) == 1:
		prefix = rest[0]
	case len(rest) > 1:
		fmt.Fprintln(e.stderr, "verdictctl list: at most one PREFIX")
		return exitUsage
	case *typ != "":
		m := *mesh
		if m == "" {
			m = engine.DefaultMesh
		}
		prefix = m + "/policies/" + *typ + "/"
	case *mesh != "":
		prefix = *mesh + "/"
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "list", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewPolicyServiceClient(conn)
	var all []*verdictv1.StoredResource
	token := ""
	for {
		cctx, cancel := cf.ctx(ctx)
		resp, err := client.List(cctx, &verdictv1.ListRequest{Prefix: prefix, PageSize: 500, PageToken: token, MinRevision: *minRev})
		cancel()
		if err != nil {
			return fail(e, "list", err, nil)
		}
		all = append(all, resp.GetResources()...)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(all) == 0 && !knownPrefix(prefix) {
		fmt.Fprintf(e.stderr, "warning: no resource has the prefix %q, which names no kind: keys are <mesh>/mesh, <mesh>/scopes/, <mesh>/policies/<type>/, <mesh>/workloads/\n", prefix)
	}
	switch output.value {
	case "wide":
		err = printWide(e.stdout, all, time.Now())
	case "json":
		err = printJSON(e.stdout, &verdictv1.ListResponse{Resources: all})
	case "yaml":
		for i, sr := range all {
			if i > 0 {
				fmt.Fprintln(e.stdout, "---")
			}
			if err = printStored(e.stdout, sr); err != nil {
				break
			}
		}
	default:
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tREVISION\tSTATUS")
		for _, sr := range all {
			st := "ok"
			if sr.GetError() != "" {
				st = "INVALID: " + sr.GetError()
			}
			if sr.GetResource().GetWorkload() != nil {
				st = fmt.Sprintf("%s  identity %d", st, sr.GetIdentity())
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\n", sr.GetKey(), sr.GetModRevision(), st)
		}
		err = tw.Flush()
	}
	if err != nil {
		return fail(e, "list", err, nil)
	}
	return exitOK
}

func runDelete(ctx context.Context, args []string, e *env) int {
	fs := newFlags("delete", "KEY... | KIND NAME | -f FILE | --prefix PREFIX",
		"Removes resources: policies first, meshes last. A key that holds nothing is reported and\n"+
			"skipped (--strict: nothing is deleted then). More keys than one etcd transaction holds\n"+
			"are deleted in several calls, rolled back if one fails (docs/cli.md).", e.stderr)
	mesh := fs.String("mesh", engine.DefaultMesh, "mesh, for KIND NAME")
	typ := fs.String("type", engine.DefaultType, "policy type, for policy NAME")
	var files fileList
	fs.Var(&files, "f", "delete the resources of this file (or directory, or -)")
	prefix := fs.String("prefix", "", "delete every key with this prefix (\"big/\", \"default/policies/TrafficLog/\")")
	strict := fs.Bool("strict", false, "a key that holds nothing fails the command before anything is deleted")
	dryRun := fs.Bool("dry-run", false, "validate only")
	var output outputFlag
	output.register(fs, "text", "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	var keys []string
	switch {
	case *prefix != "":
		if len(files) > 0 || len(rest) > 0 {
			fmt.Fprintln(e.stderr, "verdictctl delete: --prefix goes alone")
			return exitUsage
		}
	case len(files) > 0:
		items, err := readResources(files, e.stdin)
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl delete: invalid input:\n%v\n", err)
			return exitError
		}
		for _, it := range items {
			keys = append(keys, it.res.Key().String())
		}
	case len(rest) == 2 && !strings.Contains(rest[0], "/"):
		k, err := keyOf(rest, *mesh, *typ)
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl delete: %v\n", err)
			return exitUsage
		}
		keys = []string{k}
	default:
		keys = rest
	}
	if len(keys) == 0 && *prefix == "" {
		fmt.Fprintln(e.stderr, "verdictctl delete: name the resources (KEY..., KIND NAME, -f FILE or --prefix PREFIX)")
		return exitUsage
	}
	var ops []*op
	seen := map[string]bool{}
	for _, k := range keys {
		key, err := engine.ParseKey(k)
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl delete: %q: %v\n", k, err)
			return exitUsage
		}
		if !seen[key.String()] {
			seen[key.String()] = true
			ops = append(ops, &op{key: key})
		}
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "delete", err, nil)
	}
	defer conn.Close()
	client := verdictv1.NewPolicyServiceClient(conn)
	w := &writer{client: client, cf: &cf, e: e, cmd: "delete", dryRun: *dryRun, maxOps: e.maxOps, output: output.value}
	rev, err := storeRevision(ctx, client, &cf)
	if err != nil {
		return fail(e, "delete", err, nil)
	}
	if *prefix != "" {
		all, err := listAll(ctx, client, &cf, *prefix, rev)
		if err != nil {
			return fail(e, "delete", err, nil)
		}
		for _, sr := range all {
			key, err := engine.ParseKey(sr.GetKey())
			if err != nil {
				fmt.Fprintf(e.stderr, "verdictctl delete: %s: %v (skipped)\n", sr.GetKey(), err)
				continue
			}
			ops = append(ops, &op{key: key, prior: sr.GetResource(), priorRev: sr.GetModRevision()})
		}
		if len(ops) == 0 {
			fmt.Fprintf(e.stderr, "verdictctl delete: no key has the prefix %q\n", *prefix)
			return exitError
		}
	} else {
		var missing []string
		present := ops[:0]
		for _, o := range ops {
			cctx, cancel := cf.ctx(ctx)
			resp, err := client.Get(cctx, &verdictv1.GetRequest{Key: o.key.String(), MinRevision: rev})
			cancel()
			if status.Code(err) == codes.NotFound {
				missing = append(missing, o.key.String())
				continue
			}
			if err != nil {
				return fail(e, "delete", err, nil)
			}
			o.prior, o.priorRev = resp.GetResource().GetResource(), resp.GetResource().GetModRevision()
			present = append(present, o)
		}
		ops = present
		for _, k := range missing {
			fmt.Fprintf(e.stderr, "verdictctl delete: %s holds nothing\n", k)
		}
		if len(missing) > 0 && *strict {
			fmt.Fprintf(e.stderr, "verdictctl delete: --strict: %d keys hold nothing; nothing was deleted\n", len(missing))
			return exitError
		}
		if len(ops) == 0 {
			return exitError
		}
	}
	ops = orderOps(ops)
	if len(splitOps(ops, w.maxOps)) > 1 {
		cur, _, code := w.checkWhole(ctx, ops)
		if code != exitOK {
			return code
		}
		if *dryRun {
			return w.dryRunWhole(cur, ops, nil)
		}
	}
	return w.execute(ctx, ops)
}

// listAll reads every resource with the prefix, page by page.
func listAll(ctx context.Context, client verdictv1.PolicyServiceClient, cf *connFlags, prefix string, minRev int64) ([]*verdictv1.StoredResource, error) {
	var all []*verdictv1.StoredResource
	token := ""
	for {
		cctx, cancel := cf.ctx(ctx)
		resp, err := client.List(cctx, &verdictv1.ListRequest{Prefix: prefix, PageSize: 500, PageToken: token, MinRevision: minRev})
		cancel()
		if err != nil {
			return nil, err
		}
		all = append(all, resp.GetResources()...)
		if token = resp.GetNextPageToken(); token == "" {
			return all, nil
		}
	}
}

func runStatus(ctx context.Context, args []string, e *env) int {
	fs := newFlags("status", "", "Shows the server's snapshot revision, sync state, digest and invalid resources.", e.stderr)
	var output outputFlag
	output.register(fs, "text", "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if rest, code := parse(fs, args); code != 0 || len(rest) > 0 {
		if code == 0 {
			fmt.Fprintf(e.stderr, "verdictctl status: unexpected argument %q\n", rest[0])
			return exitUsage
		}
		return stopCode(code)
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "status", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	st, err := verdictv1.NewPolicyServiceClient(conn).Status(cctx, &verdictv1.StatusRequest{})
	if err != nil {
		return fail(e, "status", err, nil)
	}
	if output.structured() {
		if err := printMessage(e.stdout, output.value, st); err != nil {
			return fail(e, "status", err, nil)
		}
		return exitOK
	}
	fmt.Fprintf(e.stdout, "revision:       %d (store at %d)\nsynced:         %v\nstale:          %v\nresources:      %d\ndigest:         %s\ninvalid:        %d\n",
		st.GetRevision(), st.GetStoreRevision(), st.GetSynced(), st.GetStale(), st.GetResources(), st.GetDigest(), len(st.GetInvalid()))
	for _, inv := range st.GetInvalid() {
		fmt.Fprintf(e.stdout, "  %s: %s\n", inv.GetKey(), inv.GetError())
	}
	for _, a := range st.GetStoreAlarms() {
		fmt.Fprintf(e.stdout, "etcd alarm:     %s\n", a)
	}
	return exitOK
}

// knownPrefix: a prefix that can name keys — empty, a mesh ("default/"), or
// one under a mesh's kinds ("default/policies/TrafficLog/"). A prefix of
// another shape ("default/polices/") can match nothing.
func knownPrefix(prefix string) bool {
	parts := strings.Split(prefix, "/")
	if len(parts) < 2 {
		return true // "" or the start of a mesh name
	}
	kind := parts[1]
	for _, k := range []string{"mesh", "scopes", "policies", "workloads"} {
		if strings.HasPrefix(k, kind) && (len(parts) == 2 || kind == k) {
			return true
		}
	}
	return false
}

// printWide is list -o wide: kind, type, action, scope and age beside each key.
func printWide(w io.Writer, all []*verdictv1.StoredResource, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tKIND\tTYPE\tACTION\tSCOPE\tAGE\tREVISION\tSTATUS")
	for _, sr := range all {
		r := sr.GetResource()
		kind, typ, action, scope := "-", "-", "-", "-"
		var created time.Time
		switch {
		case r.GetMesh() != nil:
			kind, created = "Mesh", r.GetMesh().GetCreationTime().AsTime()
		case r.GetScope() != nil:
			kind, scope, created = "Scope", orDash(r.GetScope().GetParent()), r.GetScope().GetCreationTime().AsTime()
			action = orDash(strings.TrimPrefix(r.GetScope().GetCatchAll(), "ACTION_"))
		case r.GetWorkload() != nil:
			kind, created = "Workload", r.GetWorkload().GetCreationTime().AsTime()
		case r.GetPolicy() != nil:
			p := r.GetPolicy()
			kind, typ, scope, created = "Policy", p.GetType(), orDash(p.GetScope()), p.GetCreationTime().AsTime()
			action = p.GetAction()
			if action == "" {
				action = "ALLOW"
			}
		}
		age := "-"
		if !created.IsZero() && created.Unix() > 0 {
			age = shortAge(now.Sub(created))
		}
		st := "ok"
		if sr.GetError() != "" {
			st = "INVALID: " + sr.GetError()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", sr.GetKey(), kind, typ, action, scope, age, sr.GetModRevision(), st)
	}
	return tw.Flush()
}

// shortAge is kubectl's age: 45s, 12m, 5h, 3d.
func shortAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(max(d, 0).Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
