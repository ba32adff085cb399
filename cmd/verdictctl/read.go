package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine/resource"
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
	fs := newFlags("get", e)
	mesh := fs.String("mesh", resource.DefaultMesh, "`MESH`, for KIND NAME")
	typ := fs.String("type", resource.DefaultType, "policy `TYPE`, for policy NAME")
	var output outputFlag
	output.register(fs, "yaml", "json", "text", "wide")
	minRev := fs.Int64("min-revision", 0, "answer from a snapshot at or after this revision")
	var past pastFlags
	past.register(fs, true)
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	key, err := keyOf(rest, *mesh, *typ)
	if err != nil {
		return fs.usage("%v", err)
	}
	if err := past.check(*minRev); err != nil {
		return fs.usage("%v", err)
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "get", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	resp, err := verdictv1.NewPolicyServiceClient(conn).Get(cctx, &verdictv1.GetRequest{Key: key, MinRevision: *minRev,
		AtRevision: past.rev, AtTime: past.atTime(), Conditions: true})
	if err != nil {
		return fail(e, "get", err, nil)
	}
	// The text form of a resource is its YAML document.
	doc := storedDoc{resp.GetResource()}
	if err := output.printer(e.stdout).print(doc, func(w io.Writer, _ bool) error { return doc.yaml(w) }); err != nil {
		return fail(e, "get", err, nil)
	}
	return exitOK
}

func runList(ctx context.Context, args []string, e *env) int {
	fs := newFlags("list", e)
	mesh := fs.String("mesh", "", "only this `MESH`")
	typ := fs.String("type", "", "only policies of this `TYPE` (with --mesh, default mesh \"default\")")
	var output outputFlag
	output.register(fs, "text", "wide", "yaml", "json")
	minRev := fs.Int64("min-revision", 0, "answer from a snapshot at or after this revision")
	var past pastFlags
	past.register(fs, true)
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	if err := past.check(*minRev); err != nil {
		return fs.usage("%v", err)
	}
	prefix := ""
	switch {
	case len(rest) == 1:
		prefix = rest[0]
	case len(rest) > 1:
		return fs.usage("at most one PREFIX")
	case *typ != "":
		m := *mesh
		if m == "" {
			m = resource.DefaultMesh
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
	all, err := listAllAt(ctx, verdictv1.NewPolicyServiceClient(conn), &cf,
		&verdictv1.ListRequest{Prefix: prefix, MinRevision: *minRev, AtRevision: past.rev, AtTime: past.atTime(),
			Conditions: output.printer(e.stdout).wide()})
	if err != nil {
		return fail(e, "list", err, nil)
	}
	if len(all) == 0 && !knownPrefix(prefix) {
		fmt.Fprintf(e.stderr, "warning: no resource has the prefix %q, which names no kind: keys are <mesh>/mesh, <mesh>/scopes/, <mesh>/policies/<type>/, <mesh>/workloads/\n", prefix)
	}
	err = output.printer(e.stdout).print(storedList{&verdictv1.ListResponse{Resources: all}}, func(w io.Writer, wide bool) error {
		if wide {
			return printWide(w, all, time.Now())
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
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
		return tw.Flush()
	})
	if err != nil {
		return fail(e, "list", err, nil)
	}
	return exitOK
}

func runDelete(ctx context.Context, args []string, e *env) int {
	fs := newFlags("delete", e)
	mesh := fs.String("mesh", resource.DefaultMesh, "`MESH`, for KIND NAME")
	typ := fs.String("type", resource.DefaultType, "policy `TYPE`, for policy NAME")
	var files fileList
	fs.Var(&files, "f", "delete the resources of this `FILE` (or directory, or -)")
	prefix := fs.String("prefix", "", "delete every key with this `PREFIX` (\"big/\", \"default/policies/TrafficLog/\")")
	strict := fs.Bool("strict", false, "a key that holds nothing fails the command (exit 3) before anything is deleted")
	dryRun := fs.Bool("dry-run", false, "validate only")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	var keys []string
	switch {
	case *prefix != "":
		if len(files) > 0 || len(rest) > 0 {
			return fs.usage("--prefix goes alone")
		}
	case len(files) > 0:
		items, code := readInput(e, "delete", files, exitError)
		if code != exitOK {
			return code
		}
		for _, it := range items {
			keys = append(keys, it.res.Key().String())
		}
	case len(rest) == 2 && !strings.Contains(rest[0], "/"):
		k, err := keyOf(rest, *mesh, *typ)
		if err != nil {
			return fs.usage("%v", err)
		}
		keys = []string{k}
	default:
		keys = rest
	}
	if len(keys) == 0 && *prefix == "" && len(files) == 0 {
		return fs.usage("name the resources (KEY..., KIND NAME, -f FILE or --prefix PREFIX)")
	}
	var ops []*op
	seen := map[string]bool{}
	for _, k := range keys {
		key, err := resource.ParseKey(k)
		if err != nil {
			return fs.usage("%q: %v", k, err)
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
	w := &writer{client: client, cf: &cf, e: e, cmd: "delete", dryRun: *dryRun, maxOps: e.maxOps, out: output.printer(e.stdout)}
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
			key, err := resource.ParseKey(sr.GetKey())
			if err != nil {
				fmt.Fprintf(e.stderr, "verdictctl delete: %s: %v (skipped)\n", sr.GetKey(), err)
				continue
			}
			ops = append(ops, &op{key: key, prior: sr.GetResource(), priorRev: sr.GetModRevision()})
		}
		if len(ops) == 0 {
			fmt.Fprintf(e.stderr, "verdictctl delete: no key has the prefix %q: nothing to delete\n", *prefix)
			if *strict {
				return exitError
			}
			return exitOK
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
			fmt.Fprintf(e.stderr, "verdictctl delete: --strict: %s nothing; nothing was deleted\n", count(len(missing), "key holds", "keys hold"))
			return exitError
		}
		if len(ops) == 0 {
			return exitOK // every key named holds nothing already: what delete is for
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
	return listAllAt(ctx, client, cf, &verdictv1.ListRequest{Prefix: prefix, MinRevision: minRev})
}

// listAllAt reads every page of req (its page size and token are set here).
func listAllAt(ctx context.Context, client verdictv1.PolicyServiceClient, cf *connFlags, req *verdictv1.ListRequest) ([]*verdictv1.StoredResource, error) {
	var all []*verdictv1.StoredResource
	req.PageSize, req.PageToken = 500, ""
	for {
		cctx, cancel := cf.ctx(ctx)
		resp, err := client.List(cctx, req)
		cancel()
		if err != nil {
			return nil, err
		}
		all = append(all, resp.GetResources()...)
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return all, nil
		}
	}
}

func runStatus(ctx context.Context, args []string, e *env) int {
	fs := newFlags("status", e)
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "status", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	st, err := verdictv1.NewPolicyServiceClient(conn).Status(cctx, &verdictv1.StatusRequest{Conditions: true})
	if err != nil {
		return fail(e, "status", err, nil)
	}
	err = output.printer(e.stdout).print(st, func(w io.Writer, _ bool) error {
		fmt.Fprintf(w, "revision:       %d (store at %d)\nsynced:         %v\nstale:          %v\nresources:      %d\ndigest:         %s\ninvalid:        %d\n",
			st.GetRevision(), st.GetStoreRevision(), st.GetSynced(), st.GetStale(), st.GetResources(), st.GetDigest(), len(st.GetInvalid()))
		for _, inv := range st.GetInvalid() {
			fmt.Fprintf(w, "  %s: %s\n", inv.GetKey(), inv.GetError())
		}
		printConditionCounts(w, st.GetConditions())
		return nil
	})
	if err != nil {
		return fail(e, "status", err, nil)
	}
	for _, a := range st.GetStoreAlarms() {
		fmt.Fprintf(e.stdout, "etcd alarm:     %s\n", a)
	}
	return exitOK
}

// printConditionCounts writes, per mesh, how many policies hold each
// standing condition (docs/lint.md): "conditions:     default: 12
// Accepted, 11 Enforced, 1 Shadowed".
func printConditionCounts(w io.Writer, counts []*verdictv1.ConditionCount) {
	mesh := ""
	for i, c := range counts {
		switch {
		case i == 0:
			fmt.Fprintf(w, "conditions:     %s: ", c.GetMesh())
		case c.GetMesh() != mesh:
			fmt.Fprintf(w, "\n                %s: ", c.GetMesh())
		default:
			fmt.Fprint(w, ", ")
		}
		mesh = c.GetMesh()
		fmt.Fprintf(w, "%d %s", c.GetPolicies(), c.GetCondition())
	}
	if len(counts) > 0 {
		fmt.Fprintln(w)
	}
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

// printWide is list -o wide: kind, type, mode, action, scope, age and a
// policy's standing conditions (docs/lint.md) beside each key. ACTION is
// empty where no action applies (a Mesh, a Workload, a policy of a
// configuration type such as TrafficLog); MODE is Audit for a policy or
// scope whose rules are not enforced; CONDITIONS is "-" for what is not a
// policy, and for a read of the past.
func printWide(w io.Writer, all []*verdictv1.StoredResource, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tKIND\tTYPE\tMODE\tACTION\tSCOPE\tAGE\tREVISION\tSTATUS\tCONDITIONS")
	for _, sr := range all {
		r := sr.GetResource()
		kind, typ, mode, action, scope := "-", "-", "-", "", "-"
		var created time.Time
		switch {
		case r.GetMesh() != nil:
			kind, created = "Mesh", r.GetMesh().GetCreationTime().AsTime()
		case r.GetScope() != nil:
			s := r.GetScope()
			kind, scope, created = "Scope", orDash(s.GetParent()), s.GetCreationTime().AsTime()
			mode = modeText(s.GetMode())
			action = strings.TrimPrefix(s.GetCatchAll(), "ACTION_")
		case r.GetWorkload() != nil:
			kind, created = "Workload", r.GetWorkload().GetCreationTime().AsTime()
		case r.GetPolicy() != nil:
			p := r.GetPolicy()
			kind, typ, scope, created = "Policy", p.GetType(), orDash(p.GetScope()), p.GetCreationTime().AsTime()
			mode = modeText(p.GetMode())
			action = policyAction(p)
		}
		age := "-"
		if !created.IsZero() && created.Unix() > 0 {
			age = shortAge(now.Sub(created))
		}
		st := "ok"
		if sr.GetError() != "" {
			st = "INVALID: " + sr.GetError()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", sr.GetKey(), kind, typ, mode, action, scope, age, sr.GetModRevision(), st,
			orDash(strings.Join(sr.GetConditions(), ",")))
	}
	return tw.Flush()
}

// modeText is a policy's or a scope's mode: Enforce unless written Audit.
func modeText(m string) string {
	if m == "" {
		return "Enforce"
	}
	return m
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

// storedDoc is a stored resource whose YAML is its re-appliable document,
// with the key, revisions and error as comments.
type storedDoc struct{ *verdictv1.StoredResource }

func (d storedDoc) yaml(w io.Writer) error { return printStored(w, d.StoredResource) }

// storedList is a list whose YAML is every document, re-appliable.
type storedList struct{ *verdictv1.ListResponse }

func (l storedList) yaml(w io.Writer) error {
	for i, sr := range l.GetResources() {
		if i > 0 {
			if _, err := fmt.Fprintln(w, "---"); err != nil {
				return err
			}
		}
		if err := printStored(w, sr); err != nil {
			return err
		}
	}
	return nil
}

// policyAction is the ACTION column of a policy: the action it writes, its
// items' actions, ALLOW for an access-control type that writes none, and
// nothing for a configuration type (TrafficLog: its action only says whether
// it applies, docs/resources.md).
func policyAction(p *verdictv1.Policy) string {
	if a := p.GetAction(); a != "" {
		return strings.ToUpper(a)
	}
	seen := map[string]bool{}
	var items []string
	for _, it := range append(append([]*verdictv1.Item(nil), p.GetFrom()...), p.GetTo()...) {
		if a := strings.ToUpper(it.GetAction()); a != "" && !seen[a] {
			seen[a] = true
			items = append(items, a)
		}
	}
	if len(items) > 0 {
		sort.Strings(items)
		return strings.Join(items, ",")
	}
	if p.GetConf() != nil || p.GetDefaults() != nil || p.GetOverrides() != nil || !strings.HasSuffix(p.GetType(), "TrafficPermission") {
		return ""
	}
	return "ALLOW"
}

// count is "1 key holds" or "3 keys hold": a number with its noun.
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
