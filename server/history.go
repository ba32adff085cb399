package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/history"
)

// The store's past (docs/history.md): reads at a revision or a time, History,
// Diff and Revert. They need a store that keeps history (store.History:
// store/etcd); on another every such call is FailedPrecondition
// (errNoHistory).

// errNoHistory: a read of the past on a server whose store keeps none.
var errNoHistory = errors.New("this server's store keeps no history (verdictd on etcd does)")

// pastReader serves reads at a past revision or time.
type pastReader interface {
	At(ctx context.Context, rev int64) (*engine.Snapshot, error)
	AtTime(ctx context.Context, t time.Time) (*engine.Snapshot, error)
}

// read is the snapshot a read names: at a past revision, at a time, or the
// current one at or after minRev (snapshotAt).
func (s snapshots) read(ctx context.Context, minRev, atRev int64, atTime *timestamppb.Timestamp) (*engine.Snapshot, error) {
	switch {
	case atRev == 0 && atTime == nil:
		return s.snapshotAt(ctx, minRev)
	case s.past == nil:
		return nil, errNoHistory
	case atRev != 0:
		return s.past.At(ctx, atRev)
	}
	return s.past.AtTime(ctx, atTime.AsTime())
}

// writerOf is who a write is recorded for (docs/history.md, "Writers"):
// "token" for the shared token, else the allowed SAN of the caller's client
// certificate, and in development mode "anonymous <peer address>". Called
// for an authorized caller (standing): a token it sent was the right one.
func (s *authorizer) writerOf(ctx context.Context) string {
	if s.devMode {
		addr := "unknown"
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		return store.WriterAnonymous + " " + addr
	}
	if len(metadata.ValueFromIncomingContext(ctx, "authorization")) > 0 {
		return store.WriterToken
	}
	if cert := verifiedClientCert(ctx); cert != nil {
		for _, id := range certIdentities(cert) {
			if slices.Contains(s.identities, id) {
				return id
			}
		}
	}
	return store.WriterToken
}

// writing is ctx for a write made by the call: its writer and the call's name
// are recorded with it.
func (s policyService) writing(ctx context.Context, via string) context.Context {
	return store.WithVia(store.WithWriter(ctx, s.auth.writerOf(ctx)), via)
}

// History lists the versions of a key or a prefix within the retention window.
func (s policyService) History(ctx context.Context, req *verdictv1.HistoryRequest) (*verdictv1.HistoryResponse, error) {
	if s.history == nil {
		return nil, toStatus(ctx, s.log, errNoHistory)
	}
	page, err := history.Versions(ctx, s.history, history.Query{Key: req.GetKey(), Prefix: req.GetPrefix(),
		From: req.GetFromRevision(), To: req.GetToRevision(), PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()})
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	out := &verdictv1.HistoryResponse{NextPageToken: page.NextPageToken, FromRevision: page.From, ToRevision: page.To,
		Versions: make([]*verdictv1.Version, len(page.Entries))}
	for i, e := range page.Entries {
		v, err := versionProto(e)
		if err != nil {
			return nil, toStatus(ctx, s.log, err)
		}
		out.Versions[i] = v
	}
	return out, nil
}

func versionProto(e history.Entry) (*verdictv1.Version, error) {
	v := &verdictv1.Version{Key: store.RenderPath(e.Path), Revision: e.Revision}
	switch {
	case e.Deleted:
		v.Change = verdictv1.VersionChange_VERSION_CHANGE_DELETED
	case e.Prev == nil:
		v.Change = verdictv1.VersionChange_VERSION_CHANGE_CREATED
	default:
		v.Change = verdictv1.VersionChange_VERSION_CHANGE_UPDATED
	}
	if r := e.Record; r != nil {
		v.Time, v.Writer, v.Via = timestamppb.New(r.Time), r.Writer, r.Via
	}
	var err error
	if !e.Deleted {
		c := e.Item.Change()
		if v.Resource, err = storedProto(&c); err != nil {
			return nil, err
		}
	}
	if e.Prev != nil {
		c := e.Prev.Change()
		if v.Previous, err = storedProto(&c); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// storedProto is what a key held, as the API shows a stored resource.
func storedProto(c *engine.Change) (*verdictv1.StoredResource, error) {
	if c == nil {
		return nil, nil
	}
	sr, err := apiconv.StoredResource(store.RenderPath(c.Path), c.Resource, c.Err)
	if sr != nil && c.Resource == nil {
		sr.ModRevision = c.ModRevision
	}
	return sr, err
}

// Diff lists the resources that differ between two revisions, and the
// workload pairs whose answer differs (diffFlows).
func (s policyService) Diff(ctx context.Context, req *verdictv1.DiffRequest) (*verdictv1.DiffResponse, error) {
	if s.history == nil {
		return nil, toStatus(ctx, s.log, errNoHistory)
	}
	to := req.GetToRevision()
	if to == 0 {
		cur, err := s.history.Revision(ctx)
		if err != nil {
			return nil, toStatus(ctx, s.log, err)
		}
		to = cur
	}
	diffs, err := history.Diff(ctx, s.history, req.GetPrefix(), req.GetFromRevision(), to, 0)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	out := &verdictv1.DiffResponse{FromRevision: req.GetFromRevision(), ToRevision: to,
		Differences: make([]*verdictv1.ResourceDifference, len(diffs))}
	for i, d := range diffs {
		rd := &verdictv1.ResourceDifference{Key: store.RenderPath(d.Path), Change: verdictv1.VersionChange_VERSION_CHANGE_UPDATED}
		switch {
		case d.Before == nil:
			rd.Change = verdictv1.VersionChange_VERSION_CHANGE_CREATED
		case d.After == nil:
			rd.Change = verdictv1.VersionChange_VERSION_CHANGE_DELETED
		}
		if rd.Before, err = storedProto(d.Before); err == nil {
			rd.After, err = storedProto(d.After)
		}
		if err != nil {
			return nil, toStatus(ctx, s.log, err)
		}
		out.Differences[i] = rd
	}
	if out.Flows, out.FlowsError, err = s.diffFlows(ctx, req.GetFromRevision(), to, diffs); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return out, nil
}

// diffFlows judges the workload pairs whose answer differs between revisions
// from and to (docs/history.md, "Diff"): the analysis core's Impact of the
// differences — each document at the newer revision as a put, each key gone
// as a delete — applied to the snapshot at the older one; from after to, the
// answers are swapped back. Impact's after snapshot holds what the store held
// at the newer revision but for mod revisions: every put carries the revision
// after the older one, which keeps the puts newer than every document left
// alone, as they are (a NewestModified tie-break among the puts falls to their
// modificationTime). Its flows are the workload pairs of both revisions (a
// workload created or deleted in between answers "no workload" on one side)
// on every class of flows the policies of either tell apart. A difference
// Apply could not write (a value that does not decode, a conflict written
// around verdict) leaves the pairs unjudged, and why says so. This is the one
// call into the analysis core that Diff makes.
func (s policyService) diffFlows(ctx context.Context, from, to int64, diffs []history.Difference) (flows *verdictv1.ImpactResponse, why string, err error) {
	if len(diffs) == 0 {
		return nil, "", nil
	}
	older, newer, back := from, to, from > to
	if back {
		older, newer = to, from
	}
	var puts []resource.Resource
	var deletes []resource.Key
	for _, d := range diffs {
		was, is := d.Before, d.After
		if back {
			was, is = is, was
		}
		switch {
		case is == nil && was.Key.Kind == 0:
			return nil, fmt.Sprintf("%s, gone at revision %d, is not a resource's key", store.RenderPath(d.Path), newer), nil
		case is == nil:
			deletes = append(deletes, was.Key)
		case is.Resource == nil:
			return nil, fmt.Sprintf("%s at revision %d does not decode: %v", store.RenderPath(d.Path), newer, is.Err), nil
		default:
			puts = append(puts, is.Resource)
		}
	}
	snap, err := s.snaps.read(ctx, 0, older, nil)
	if err != nil {
		return nil, "", err
	}
	ans, err := analysis.Impact(snap, &analysis.ImpactRequest{Puts: puts, Deletes: deletes})
	if ve := (*resource.ValidationError)(nil); errors.As(err, &ve) {
		return nil, fmt.Sprintf("the documents at revision %d do not apply to revision %d as one change: %s", newer, older, keyedErrors(ve, puts)), nil
	}
	if err != nil {
		return nil, "", err
	}
	if back {
		for i := range ans.Changes {
			c := &ans.Changes[i]
			c.Before, c.After, c.BeforeErr, c.AfterErr = c.After, c.Before, c.AfterErr, c.BeforeErr
		}
	}
	ans.Revision = from
	return apiconv.ImpactResponse(ans), "", nil
}

// keyedErrors is a validation error of a write of puts with each
// "resources[i]" named by its key.
func keyedErrors(ve *resource.ValidationError, puts []resource.Resource) string {
	parts := make([]string, len(ve.Errors))
	for i, fe := range ve.Errors {
		var n int
		if _, err := fmt.Sscanf(fe.Field, "resources[%d]", &n); err == nil && n >= 0 && n < len(puts) {
			fe.Field = puts[n].Key().String() + strings.TrimPrefix(fe.Field, fmt.Sprintf("resources[%d]", n))
		}
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

// Revert writes the documents of a past revision back, validated as Apply
// is, in one transaction guarded by what each key holds now.
func (s policyService) Revert(ctx context.Context, req *verdictv1.RevertRequest) (*verdictv1.RevertResponse, error) {
	if s.history == nil {
		return nil, toStatus(ctx, s.log, errNoHistory)
	}
	plan, err := history.PlanRevert(ctx, s.history, req.GetKey(), req.GetPrefix(), req.GetToRevision(), req.GetExpectedRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	snap := s.snaps.current()
	if err := snap.CheckApply(plan.Puts, plan.Deletes); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	out := &verdictv1.RevertResponse{Revision: plan.Current}
	for _, op := range plan.Ops {
		outcome := verdictv1.ApplyOutcome_APPLY_OUTCOME_DELETED
		switch {
		case op.Resource != nil && op.ExpectedRevision == store.MustNotExist:
			outcome = verdictv1.ApplyOutcome_APPLY_OUTCOME_CREATED
		case op.Resource != nil:
			outcome = verdictv1.ApplyOutcome_APPLY_OUTCOME_CONFIGURED
		}
		out.Results = append(out.Results, &verdictv1.ApplyResult{Key: opKey(op).String(), Outcome: outcome})
	}
	if req.GetDryRun() || len(plan.Ops) == 0 {
		return out, nil
	}
	if out.Revision, err = s.store.Apply(s.writing(ctx, "revert"), plan.Ops); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return out, nil
}

func opKey(op store.Op) resource.Key {
	if op.Resource != nil {
		return op.Resource.Key()
	}
	return op.Key
}

func checkHistory(r *verdictv1.HistoryRequest) error {
	var errs fieldErrors
	keyOrPrefix(&errs, r.GetKey(), r.GetPrefix())
	if r.GetFromRevision() < 0 {
		errs.add("fromRevision", fmt.Sprintf("%d is negative", r.GetFromRevision()))
	}
	if r.GetToRevision() < 0 {
		errs.add("toRevision", fmt.Sprintf("%d is negative", r.GetToRevision()))
	}
	if r.GetToRevision() > 0 && r.GetFromRevision() > r.GetToRevision() {
		errs.add("fromRevision", fmt.Sprintf("%d is after toRevision %d", r.GetFromRevision(), r.GetToRevision()))
	}
	if ps := r.GetPageSize(); ps < 0 || ps > history.MaxPageSize {
		errs.add("pageSize", fmt.Sprintf("%d is not from 0 (default %d) to %d", ps, history.DefaultPageSize, history.MaxPageSize))
	}
	return errs.err()
}

func checkDiff(r *verdictv1.DiffRequest) error {
	var errs fieldErrors
	if r.GetFromRevision() <= 0 {
		errs.add("fromRevision", "is required (a revision, 1 or more)")
	}
	if r.GetToRevision() < 0 {
		errs.add("toRevision", fmt.Sprintf("%d is negative", r.GetToRevision()))
	}
	return errs.err()
}

func checkRevert(r *verdictv1.RevertRequest) error {
	var errs fieldErrors
	keyOrPrefix(&errs, r.GetKey(), r.GetPrefix())
	if r.GetToRevision() <= 0 {
		errs.add("toRevision", "is required (a revision, 1 or more)")
	}
	if r.GetExpectedRevision() < 0 {
		errs.add("expectedRevision", fmt.Sprintf("%d is negative", r.GetExpectedRevision()))
	}
	return errs.err()
}

// keyOrPrefix checks a key, or with prefix a key prefix (anything).
func keyOrPrefix(errs *fieldErrors, key string, prefix bool) {
	if !prefix {
		errs.key("key", key)
	}
}
