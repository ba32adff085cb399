package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/observed"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// analysisService implements verdict.v1.AnalysisService (docs/analysis.md).
// Every call passed the interceptors of the method table: its caller is
// authorized and its request validated. Its decisions are the engine's bulk
// evaluation: neither recorded, logged nor observed. Impact replays the
// observed flows (observe.go).
type analysisService struct {
	verdictv1.UnimplementedAnalysisServiceServer
	log        *slog.Logger
	snaps      snapshots
	identities *inventory.Registry
	// Observed flows (observe.go): this replica's table (nil: none), the
	// fleet, this replica's place in it, the credentials to call the
	// others with and how long to wait for each.
	observed     *observed.Table
	fleet        Fleet
	self         Replica
	dial         func(addr string) ([]grpc.DialOption, error)
	fleetTimeout time.Duration
}

var _ verdictv1.AnalysisServiceServer = analysisService{}

// pageSize bounds the entries of one Reach or Matrix message.
const pageSize = 1000

// Reach answers at one revision (now, or a past one), in pages.
func (s analysisService) Reach(req *verdictv1.ReachRequest, stream verdictv1.AnalysisService_ReachServer) error {
	ctx := stream.Context()
	snap, err := s.snaps.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return toStatus(ctx, s.log, err)
	}
	r := apiconv.ReachRequest(req)
	r.Registry = s.identities
	ans, err := analysis.Reach(snap, &r)
	if err != nil {
		return toStatus(ctx, s.log, err)
	}
	page := &verdictv1.ReachResponse{Revision: ans.Revision, Endpoint: apiconv.EndpointResolution(r.Mesh, &ans.Endpoint, true), Notes: ans.Notes}
	for i := range ans.Entries {
		page.Entries = append(page.Entries, apiconv.ReachEntry(&ans.Entries[i]))
		if len(page.Entries) == pageSize {
			if err := stream.Send(page); err != nil {
				return toStatus(ctx, s.log, err)
			}
			page = &verdictv1.ReachResponse{Revision: ans.Revision}
		}
	}
	if len(page.Entries) > 0 || page.Endpoint != nil {
		return toStatus(ctx, s.log, stream.Send(page))
	}
	return nil
}

// Matrix answers at one revision (now, or a past one), in pages.
func (s analysisService) Matrix(req *verdictv1.MatrixRequest, stream verdictv1.AnalysisService_MatrixServer) error {
	ctx := stream.Context()
	snap, err := s.snaps.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return toStatus(ctx, s.log, err)
	}
	r := apiconv.MatrixRequest(req, func() []analysis.FlowClass { return analysis.FlowClasses(req.GetMesh(), req.GetType(), snap) })
	page := &verdictv1.MatrixResponse{Revision: snap.Revision()}
	var sendErr error
	_, _, err = analysis.Matrix(snap, &r, func(e analysis.MatrixEntry) bool {
		page.Entries = append(page.Entries, apiconv.MatrixEntry(&e))
		if len(page.Entries) < pageSize {
			return true
		}
		if sendErr = stream.Send(page); sendErr != nil {
			return false
		}
		page = &verdictv1.MatrixResponse{Revision: snap.Revision()}
		return ctx.Err() == nil
	})
	switch {
	case err != nil:
		return toStatus(ctx, s.log, err)
	case sendErr != nil:
		return toStatus(ctx, s.log, sendErr)
	case ctx.Err() != nil:
		return toStatus(ctx, s.log, ctx.Err())
	}
	return toStatus(ctx, s.log, stream.Send(page))
}

// Impact judges a proposed change against the current snapshot.
func (s analysisService) Impact(ctx context.Context, req *verdictv1.ImpactRequest) (*verdictv1.ImpactResponse, error) {
	snap, err := s.snaps.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	w, err := decodeWrite(req.GetResources(), req.GetDeletes(), nil)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	r := analysis.ImpactRequest{Puts: w.puts, Deletes: w.deletes, Explain: req.GetExplain(), Registry: s.identities}
	given := make([]analysis.ObservedFlow, 0, len(req.GetFlows()))
	for _, f := range req.GetFlows() {
		given = append(given, apiconv.ObservedFlow(f))
	}
	// Only the meshes the change concerns have flows it can alter.
	meshes := map[string]bool{}
	for _, p := range w.puts {
		meshes[resourceMesh(p.Key().Mesh)] = true
	}
	for _, k := range w.deletes {
		meshes[resourceMesh(k.Mesh)] = true
	}
	var replicas []*verdictv1.ImpactReplica
	r.Flows, replicas = s.replay(ctx, given, req.GetFleet(), meshes)
	ans, err := analysis.Impact(snap, &r)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	resp := apiconv.ImpactResponse(ans)
	resp.Replicas = replicas
	return resp, nil
}

// checkReach checks a Reach request: an end as Decide's, direction, port.
func checkReach(r *verdictv1.ReachRequest) error {
	var errs fieldErrors
	p, _ := resource.ParseProtocol(r.GetProtocol())
	req := engine.Request{Mesh: r.GetMesh(), Type: r.GetType(), Protocol: p, Port: r.GetPort()}
	req.Source, req.SourceEndpoint = apiconv.Endpoint(r.GetEndpoint())
	var inner fieldErrors
	inner.request("", r.GetProtocol(), &req)
	for _, fe := range inner.list {
		if rest, ok := strings.CutPrefix(fe.Field, "source"); ok {
			fe.Field = "endpoint" + rest
		}
		errs.list = append(errs.list, fe)
	}
	if d := r.GetDirection(); d != verdictv1.ReachDirection_REACH_DIRECTION_TO && d != verdictv1.ReachDirection_REACH_DIRECTION_FROM {
		errs.add("direction", "give TO (who can reach the endpoint) or FROM (what it can reach)")
	}
	errs.minRevision("minRevision", r.GetMinRevision())
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

// checkMatrix checks a Matrix request: names, selections' tags, port.
func checkMatrix(r *verdictv1.MatrixRequest) error {
	var errs fieldErrors
	errs.names(r.GetMesh(), r.GetType())
	for field, tags := range map[string]map[string]string{"sources": r.GetSources(), "destinations": r.GetDestinations()} {
		if err := resource.CheckTags(tags); err != nil {
			errs.add(field, err.Error())
		}
	}
	if _, err := resource.ParseProtocol(r.GetProtocol()); err != nil {
		errs.add("protocol", err.Error())
	}
	if r.GetPort() > 65535 {
		errs.add("port", fmt.Sprintf("%d is not a port (0 = not given, 1 to 65535)", r.GetPort()))
	}
	if r.GetPort() != 0 && r.GetProtocol() == "" {
		errs.add("port", "a port needs a protocol")
	}
	errs.minRevision("minRevision", r.GetMinRevision())
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

// checkImpact checks an Impact request: something to judge, keys that are
// keys; the documents are decoded and validated by the handler, as Apply's.
func checkImpact(r *verdictv1.ImpactRequest) error {
	var errs fieldErrors
	if len(r.GetResources())+len(r.GetDeletes()) == 0 {
		errs.add("resources", "name at least one resource or delete")
	}
	for i, k := range r.GetDeletes() {
		errs.key(fmt.Sprintf("deletes[%d]", i), k)
	}
	errs.minRevision("minRevision", r.GetMinRevision())
	return errs.err()
}

// Lint answers the findings of the current snapshot (or a past one), or of
// the snapshot a proposed change would make of it (nothing is written).
func (s analysisService) Lint(ctx context.Context, req *verdictv1.LintRequest) (*verdictv1.LintResponse, error) {
	snap, err := s.snaps.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	w, err := decodeWrite(req.GetResources(), req.GetDeletes(), nil)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	ans, err := analysis.Lint(snap, &analysis.LintRequest{Mesh: req.GetMesh(), Type: req.GetType(), Puts: w.puts, Deletes: w.deletes})
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return apiconv.LintResponse(ans), nil
}

// checkLint checks a Lint request's names and keys (documents: as Impact's).
func checkLint(r *verdictv1.LintRequest) error {
	var errs fieldErrors
	errs.names(r.GetMesh(), r.GetType())
	for i, k := range r.GetDeletes() {
		errs.key(fmt.Sprintf("deletes[%d]", i), k)
	}
	errs.minRevision("minRevision", r.GetMinRevision())
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

// warmAnalysis prepares what the analyses start from for each new lineage
// of snapshots (a start, a rebuild from the store), off every request's
// path: the first Reach after a start costs what a later one does
// (docs/analysis.md, "Sizes"). Snapshots Apply derives carry it.
func (s *Server) warmAnalysis(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last *engine.Snapshot
	for {
		if s.syncer.Synced() {
			if snap := s.syncer.Snapshot(); snap != last {
				analysis.Warm(ctx, snap)
				last = snap
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
