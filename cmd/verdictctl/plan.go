package main

// Writes larger than one call (docs/cli.md, "Large applies"):
// the client sends them in dependency order, each call atomic and guarded by
// the revisions it read, and on a failure rolls back the calls already made
// with guarded writes, then says exactly what the store holds of the set.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/docpos"
	"github.com/verdictpdp/verdict/internal/writeplan"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// op is one key of a write: a put (res set) or a delete, with the state the
// key held before (read for writes of more than one call).
type op struct {
	key  resource.Key
	res  resource.Resource   // put: the resource; nil: a delete
	pb   *verdictv1.Resource // put: as sent
	from loaded              // put: the document it came from

	prior    *verdictv1.Resource // the value before; nil: absent (or undecodable: priorErr)
	priorRev int64               // its mod revision; 0: absent
	priorErr string              // the value before does not decode: it cannot be restored
	same     bool                // a put of what the key holds already: the server writes nothing
}

func (o *op) isDelete() bool { return o.res == nil }

func (o *op) size() int {
	n := 64 + len(o.key.String())
	if o.pb != nil {
		n += proto.Size(o.pb)
	}
	return n
}

// expected is the guard of the op's forward write.
func (o *op) expected() int64 {
	if o.priorRev == 0 {
		return store.MustNotExist
	}
	return o.priorRev
}

// orderOps puts ops in dependency order: puts as writeplan.Rank says
// (meshes, scopes parents first, workloads, policies), deletes in reverse
// (policies, workloads, scopes children first, meshes).
func orderOps(ops []*op) []*op {
	parents := map[string]string{}
	for _, o := range ops {
		var parent string
		if s, ok := o.res.(*resource.Scope); ok {
			parent = s.Parent
		} else if o.isDelete() && o.prior.GetScope() != nil {
			parent = o.prior.GetScope().GetParent()
		}
		if parent != "" {
			parents[o.key.String()] = resource.Key{Kind: resource.KindScope, Mesh: o.key.Mesh, Name: parent}.String()
		}
	}
	rank := func(o *op) int {
		r := writeplan.Rank(o.key, parents)
		if o.isDelete() {
			return 1<<20 - r
		}
		return r
	}
	out := append([]*op(nil), ops...)
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// splitOps cuts ordered ops into calls of at most maxOps keys and
// writeplan.MaxBytes bytes.
func splitOps(ops []*op, maxOps int) [][]*op {
	if maxOps <= 0 || maxOps > store.MaxOps {
		maxOps = store.MaxOps
	}
	var parts [][]*op
	var cur []*op
	size := 0
	for _, o := range ops {
		n := o.size()
		if len(cur) > 0 && (len(cur) == maxOps || size+n > writeplan.MaxBytes) {
			parts = append(parts, cur)
			cur, size = nil, 0
		}
		cur = append(cur, o)
		size += n
	}
	if len(cur) > 0 {
		parts = append(parts, cur)
	}
	return parts
}

// writer runs a write of one or more calls.
type writer struct {
	client verdictv1.PolicyServiceClient
	cf     *connFlags
	e      *env
	cmd    string // "apply" or "delete"
	dryRun bool
	maxOps int      // per call; 0: store.MaxOps (tests set less)
	out    *printer // the answer: a line per key and per call, or a writeReport
}

// writeReport is apply's and delete's answer as a document: each call's
// ApplyResponse, in the API's own schema (warnings point into the files).
type writeReport struct {
	DryRun bool              `json:"dryRun"`
	Calls  []json.RawMessage `json:"calls"`
}

func (r *writeReport) add(resp *verdictv1.ApplyResponse) {
	b, err := protojson.Marshal(resp)
	if err != nil {
		b = []byte("{}")
	}
	r.Calls = append(r.Calls, b)
}

// origin maps a call's field path ("resources[i].policy.sources[0]", a
// warning "resources[i] (key): ...") to the document it names, with its
// position; other paths stay as they are.
func origin(part []*op) func(string) docpos.Problem {
	var puts []*op
	for _, o := range part {
		if !o.isDelete() {
			puts = append(puts, o)
		}
	}
	return func(field string) docpos.Problem {
		m := resourceIndex.FindStringSubmatch(field)
		if m == nil {
			return docpos.Problem{Path: field}
		}
		i, _ := strconv.Atoi(m[1])
		if i >= len(puts) || puts[i].from.src == nil {
			return docpos.Problem{Path: field}
		}
		rest := field[len(m[0]):]
		if key, why, ok := strings.Cut(rest, "): "); ok && strings.HasPrefix(rest, " (") {
			// "resources[0] (key): why": a warning about the whole document
			p := puts[i].from.at("", why)
			p.Path += key + ")"
			return p
		}
		return puts[i].from.at(rest, "")
	}
}

// warning is a call's warning, pointed into the files.
func warning(part []*op, warn string) string {
	p := origin(part)(warn)
	if p.Msg == "" {
		return warn
	}
	return p.String()
}

// request is the Apply of a part; guarded when the write takes several calls.
func (w *writer) request(part []*op, guarded bool) *verdictv1.ApplyRequest {
	req := &verdictv1.ApplyRequest{DryRun: w.dryRun}
	if guarded {
		req.ExpectedRevisions = map[string]int64{}
	}
	for _, o := range part {
		if o.isDelete() {
			req.Deletes = append(req.Deletes, o.key.String())
		} else {
			req.Resources = append(req.Resources, o.pb)
		}
		if guarded {
			req.ExpectedRevisions[o.key.String()] = o.expected()
		}
	}
	return req
}

// done is a call that was applied.
type done struct {
	ops []*op
	rev int64
}

// outcomeText is an ApplyOutcome as kubectl says it: created, configured,
// unchanged, deleted.
func outcomeText(o verdictv1.ApplyOutcome) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "APPLY_OUTCOME_"))
}

// printCall writes a call's line per key: "KEY created", "KEY unchanged"...
func (w *writer) printCall(out io.Writer, resp *verdictv1.ApplyResponse) {
	suffix := ""
	if w.dryRun {
		suffix = " (dry run)"
	}
	if len(resp.GetResults()) == 0 { // a server that does not say
		for _, k := range append(resp.GetKeys(), resp.GetDeleted()...) {
			fmt.Fprintf(out, "%s %s%s\n", k, map[string]string{"apply": "applied", "delete": "deleted"}[w.cmd], suffix)
		}
		return
	}
	for _, r := range resp.GetResults() {
		fmt.Fprintf(out, "%s %s%s\n", r.GetKey(), outcomeText(r.GetOutcome()), suffix)
	}
}

// changed reports whether a call wrote anything.
func changed(resp *verdictv1.ApplyResponse) bool {
	if len(resp.GetResults()) == 0 {
		return true
	}
	for _, r := range resp.GetResults() {
		if r.GetOutcome() != verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED {
			return true
		}
	}
	return false
}

// writtenOps are the ops of a call the server wrote: not those it found
// unchanged (a rollback must not touch them).
func writtenOps(part []*op, resp *verdictv1.ApplyResponse) []*op {
	unchanged := map[string]bool{}
	for _, r := range resp.GetResults() {
		if r.GetOutcome() == verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED {
			unchanged[r.GetKey()] = true
		}
	}
	var out []*op
	for _, o := range part {
		if !unchanged[o.key.String()] {
			out = append(out, o)
		}
	}
	return out
}

// execute writes the ops in order, in as many calls as they need, and
// returns the exit code. A write of several calls was checked whole before
// (checkWhole) and its ops carry the state they replace.
func (w *writer) execute(ctx context.Context, ops []*op) int {
	parts := splitOps(ops, w.maxOps)
	multi := len(parts) > 1
	rep := writeReport{DryRun: w.dryRun}
	if multi {
		fmt.Fprintf(w.e.stderr, "%d keys do not fit one transaction: writing them in %d calls, each atomic, in dependency order; "+
			"if one fails, the calls before it are rolled back (docs/cli.md)\n", len(ops), len(parts))
	}
	prog := newProgress(w.e, w.out, w.cmd, len(ops))
	defer prog.done()
	var applied []done
	var last int64
	sent := 0
	for n, part := range parts {
		if n > 0 {
			// The server checks each call against its snapshot: it must hold
			// the previous call's write (read-your-writes).
			if err := w.waitFor(ctx, last); err != nil {
				prog.done()
				fmt.Fprintf(w.e.stderr, "verdictctl %s: waiting for the server to see call %d: %v\n", w.cmd, n, err)
				return w.abandon(ctx, applied, nil)
			}
		}
		if w.e.beforeCall != nil {
			w.e.beforeCall(n)
		}
		if multi {
			prog.show(sent, fmt.Sprintf("call %d of %d", n+1, len(parts)))
		}
		cctx, cancel := w.cf.ctx(ctx)
		resp, err := w.client.Apply(cctx, w.request(part, multi))
		cancel()
		if err != nil {
			prog.done()
			if multi {
				fmt.Fprintf(w.e.stderr, "verdictctl %s: call %d of %d failed:\n", w.cmd, n+1, len(parts))
			}
			code := fail(w.e, w.cmd, err, origin(part))
			if !multi {
				return code
			}
			var unknown []*op
			if ambiguous(err) {
				if rev, ok := w.probe(ctx, part); ok {
					fmt.Fprintf(w.e.stderr, "call %d was written all the same (revision %d)\n", n+1, rev)
					var written []*op
					for _, o := range part {
						if !o.same {
							written = append(written, o)
						}
					}
					applied = append(applied, done{written, rev})
				} else {
					unknown = part
				}
			} else {
				fmt.Fprintf(w.e.stderr, "nothing of call %d was written\n", n+1)
			}
			return w.abandon(ctx, applied, unknown)
		}
		sent += len(part)
		for i, warn := range resp.GetWarnings() {
			resp.Warnings[i] = warning(part, warn)
			prog.clear()
			fmt.Fprintf(w.e.stderr, "warning: %s\n", resp.Warnings[i])
		}
		rep.add(resp)
		if written := writtenOps(part, resp); len(written) > 0 {
			applied = append(applied, done{written, resp.GetRevision()})
		}
		last = max(last, resp.GetRevision())
		if !w.out.forPeople() {
			continue
		}
		prog.clear()
		w.printCall(w.out.w, resp)
		switch {
		case w.dryRun:
			fmt.Fprintf(w.out.w, "dry run: nothing was written (checked against revision %d)\n", resp.GetRevision())
		case !changed(resp):
			fmt.Fprintf(w.out.w, "revision %d (nothing changed: nothing was written)\n", resp.GetRevision())
		default:
			fmt.Fprintf(w.out.w, "revision %d\n", resp.GetRevision())
		}
	}
	prog.done()
	if !w.dryRun && len(applied) > 0 {
		awaitServed(ctx, w.e, w.client, w.cf, last)
	}
	if !w.out.forPeople() {
		if err := w.out.print(rep, nil); err != nil {
			return fail(w.e, w.cmd, err, nil)
		}
	}
	return exitOK
}

// ambiguous: the call may have been written although it failed.
func ambiguous(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
		return true
	}
	return false
}

// waitFor waits until the server's snapshot holds revision rev.
func (w *writer) waitFor(ctx context.Context, rev int64) error {
	return waitServed(ctx, w.client, w.cf, rev)
}

func waitServed(ctx context.Context, client verdictv1.PolicyServiceClient, cf *connFlags, rev int64) error {
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	_, err := client.Status(cctx, &verdictv1.StatusRequest{MinRevision: rev})
	return err
}

// awaitServed gives the next command read-your-writes: a write returns once
// the server's snapshot holds it, so a read that follows on that server sees
// it (docs/cli.md#read-your-writes). The write stands whatever the wait's
// outcome; a wait that fails is a warning.
func awaitServed(ctx context.Context, e *env, client verdictv1.PolicyServiceClient, cf *connFlags, rev int64) {
	if err := waitServed(ctx, client, cf, rev); err != nil {
		fmt.Fprintf(e.stderr, "warning: written at revision %d, which the server does not serve yet (%v): "+
			"pass --min-revision %d to the next read\n", rev, err, rev)
	}
}

// probe reads a part whose call failed ambiguously: it was written when every
// put holds one new revision and every delete is gone.
func (w *writer) probe(ctx context.Context, part []*op) (int64, bool) {
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := w.cf.ctx(ctx)
	st, err := w.client.Status(cctx, &verdictv1.StatusRequest{})
	cancel()
	if err != nil {
		return 0, false
	}
	var rev int64
	for _, o := range part {
		if o.same {
			continue // not written either way
		}
		cctx, cancel := w.cf.ctx(ctx)
		resp, err := w.client.Get(cctx, &verdictv1.GetRequest{Key: o.key.String(), MinRevision: st.GetStoreRevision()})
		cancel()
		switch {
		case status.Code(err) == codes.NotFound && o.isDelete():
			continue
		case err != nil || o.isDelete():
			return 0, false
		}
		r := resp.GetResource().GetModRevision()
		if r == o.priorRev || (rev != 0 && r != rev) {
			return 0, false
		}
		rev = r
	}
	return rev, true
}

// abandon rolls back the applied calls, newest first, and reports what the
// store holds of the set; unknown are keys of a call whose outcome is not known.
func (w *writer) abandon(ctx context.Context, applied []done, unknown []*op) int {
	ctx = context.WithoutCancel(ctx) // Ctrl-C stops the write, not its undoing
	var left []string
	for _, o := range unknown {
		left = append(left, fmt.Sprintf("%s: not known whether the failed call wrote it (verdictctl get %s)", o.key, o.key))
	}
	if len(applied) == 0 {
		w.report(left)
		return exitError
	}
	fmt.Fprintf(w.e.stderr, "rolling back the %d calls applied before it, newest first, with guarded writes\n", len(applied))
	last := applied[len(applied)-1].rev
	for j := len(applied) - 1; j >= 0; j-- {
		d := applied[j]
		if err := w.waitFor(ctx, last); err != nil {
			fmt.Fprintf(w.e.stderr, "  waiting for revision %d: %v\n", last, err)
		}
		undo := make([]*op, 0, len(d.ops))
		for i := len(d.ops) - 1; i >= 0; i-- {
			undo = append(undo, d.ops[i])
		}
		if rev, err := w.undo(ctx, undo, d.rev); err == nil {
			last = rev
			continue
		}
		// One key at a time: what can be restored is.
		for _, o := range undo {
			// Each call is checked against the snapshot: it must hold the
			// previous undo (a child scope gone before its parent goes).
			if err := w.waitFor(ctx, last); err != nil {
				fmt.Fprintf(w.e.stderr, "  waiting for revision %d: %v\n", last, err)
			}
			rev, err := w.undo(ctx, []*op{o}, d.rev)
			if err == nil {
				last = rev
				continue
			}
			left = append(left, w.leftover(ctx, o, d.rev, err))
		}
	}
	w.report(left)
	return exitError
}

// undo restores the state ops held before the call that wrote them at rev,
// guarded: a key another writer changed since is not touched.
func (w *writer) undo(ctx context.Context, ops []*op, rev int64) (int64, error) {
	req := &verdictv1.ApplyRequest{ExpectedRevisions: map[string]int64{}}
	for _, o := range ops {
		switch {
		case o.priorErr != "":
			return 0, fmt.Errorf("its value before did not decode (%s): it cannot be restored", o.priorErr)
		case o.prior == nil:
			req.Deletes = append(req.Deletes, o.key.String())
		default:
			req.Resources = append(req.Resources, o.prior)
		}
		if o.isDelete() {
			req.ExpectedRevisions[o.key.String()] = store.MustNotExist
		} else {
			req.ExpectedRevisions[o.key.String()] = rev
		}
	}
	cctx, cancel := w.cf.ctx(ctx)
	defer cancel()
	resp, err := w.client.Apply(cctx, req)
	if err != nil {
		return 0, err
	}
	return resp.GetRevision(), nil
}

// leftover says what a key that could not be restored holds.
func (w *writer) leftover(ctx context.Context, o *op, rev int64, err error) string {
	did := "wrote"
	if o.isDelete() {
		did = "deleted"
	}
	if status.Code(err) == codes.Aborted {
		cctx, cancel := w.cf.ctx(ctx)
		defer cancel()
		now := "deleted since"
		if resp, gerr := w.client.Get(cctx, &verdictv1.GetRequest{Key: o.key.String()}); gerr == nil {
			now = fmt.Sprintf("at revision %d now", resp.GetResource().GetModRevision())
		}
		return fmt.Sprintf("%s: changed by another writer after this %s (%s): left alone", o.key, w.cmd, now)
	}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Code().String() + ": " + st.Message()
	}
	return fmt.Sprintf("%s: left as this %s %s it (revision %d): %s", o.key, w.cmd, did, rev, msg)
}

func (w *writer) report(left []string) {
	if len(left) == 0 {
		fmt.Fprintf(w.e.stderr, "rolled back: every key of the set holds what it held before this %s\n", w.cmd)
		return
	}
	fmt.Fprintf(w.e.stderr, "NOT rolled back: %d keys of the set differ from before this %s:\n", len(left), w.cmd)
	for _, l := range left {
		fmt.Fprintf(w.e.stderr, "  %s\n", l)
	}
	fmt.Fprintln(w.e.stderr, "every other key of the set holds what it held before")
}

// storeRevision is the newest revision the server has seen the store at: a
// read at it sees every write made before (the snapshot may lag a write).
func storeRevision(ctx context.Context, client verdictv1.PolicyServiceClient, cf *connFlags) (int64, error) {
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	st, err := client.Status(cctx, &verdictv1.StatusRequest{})
	if err != nil {
		return 0, err
	}
	return st.GetStoreRevision(), nil
}

// current is what the server holds of some meshes: a snapshot the engine can
// check a write against, and every stored resource by key.
type current struct {
	snap   *engine.Snapshot
	stored map[string]*verdictv1.StoredResource
}

// outcome says what a put does to what the server holds, as the server
// judges it (writeplan.Same).
func (c *current) outcome(o *op) verdictv1.ApplyOutcome {
	sr, ok := c.stored[o.key.String()]
	switch {
	case !ok:
		return verdictv1.ApplyOutcome_APPLY_OUTCOME_CREATED
	case sr.GetError() == "" && sr.GetResource() != nil:
		if r, err := apiconv.ResourceFromProto(sr.GetKey(), sr.GetResource()); err == nil && writeplan.Same(r, o.res) {
			return verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED
		}
	}
	return verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED
}

// readMeshes lists the meshes' resources and builds the engine's snapshot of
// them: the server's own checks, run here on a set over one call's limit.
func (w *writer) readMeshes(ctx context.Context, meshes []string) (*current, error) {
	cur := &current{stored: map[string]*verdictv1.StoredResource{}}
	var changes []engine.Change
	rev, err := storeRevision(ctx, w.client, w.cf)
	if err != nil {
		return nil, err
	}
	for _, m := range meshes {
		token := ""
		for {
			cctx, cancel := w.cf.ctx(ctx)
			resp, err := w.client.List(cctx, &verdictv1.ListRequest{Prefix: m + "/", PageSize: 1000, PageToken: token, MinRevision: rev})
			cancel()
			if err != nil {
				return nil, err
			}
			rev = max(rev, resp.GetRevision())
			for _, sr := range resp.GetResources() {
				cur.stored[sr.GetKey()] = sr
				if sr.GetResource() == nil {
					continue
				}
				r, err := apiconv.ResourceFromProto(sr.GetKey(), sr.GetResource())
				if err != nil {
					continue // stored but invalid: the server holds it as invalid too
				}
				m := r.Metadata()
				m.CreateRevision, m.ModRevision = sr.GetCreateRevision(), sr.GetModRevision()
				changes = append(changes, engine.Put(r.WithMeta(m)))
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	cur.snap = engine.Empty().Apply(rev, changes)
	return cur, nil
}

// checkWhole reads the meshes the ops touch, checks the whole write against
// them as the server would (engine.Snapshot.CheckApply), and records in each
// op the state it replaces. It prints the errors and returns false when the
// write is invalid; warnings are the type warnings of the puts.
func (w *writer) checkWhole(ctx context.Context, ops []*op) (cur *current, warnings []string, code int) {
	seen := map[string]bool{}
	var meshes []string
	var puts []resource.Resource
	var putOps []*op
	var deletes []resource.Key
	for _, o := range ops {
		if !seen[o.key.Mesh] {
			seen[o.key.Mesh] = true
			meshes = append(meshes, o.key.Mesh)
		}
		if o.isDelete() {
			deletes = append(deletes, o.key)
		} else {
			puts = append(puts, o.res)
			putOps = append(putOps, o)
		}
	}
	cur, err := w.readMeshes(ctx, meshes)
	if err != nil {
		return nil, nil, fail(w.e, w.cmd, err, nil)
	}
	for _, o := range ops {
		sr, ok := cur.stored[o.key.String()]
		if !ok {
			continue
		}
		o.priorRev = sr.GetModRevision()
		o.prior = sr.GetResource()
		if o.prior == nil {
			o.priorErr = orDash(sr.GetError())
		}
		o.same = !o.isDelete() && cur.outcome(o) == verdictv1.ApplyOutcome_APPLY_OUTCOME_UNCHANGED
	}
	err = cur.snap.CheckApply(puts, deletes)
	if err == nil {
		warnings, err = cur.snap.TypeWarnings(puts)
	}
	if err != nil {
		var ve *resource.ValidationError
		if errors.As(err, &ve) {
			fmt.Fprintf(w.e.stderr, "verdictctl %s: InvalidArgument (the whole set, checked against the server's contents at revision %d; nothing was written):\n",
				w.cmd, cur.snap.Revision())
			var ps docpos.Problems
			for _, fe := range ve.Errors {
				p := origin(putOps)(fe.Field)
				p.Msg = fe.Reason
				ps = append(ps, p)
			}
			ps.Print(w.e.stderr, "  ")
			return nil, nil, exitError
		}
		return nil, nil, fail(w.e, w.cmd, err, nil)
	}
	for i, warn := range warnings {
		warnings[i] = warning(putOps, warn)
	}
	return cur, warnings, exitOK
}
