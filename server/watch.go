package server

import (
	"context"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// watchService implements verdict.v1.WatchService.
type watchService struct {
	*Server
	verdictv1.UnimplementedWatchServiceServer
}

var _ verdictv1.WatchServiceServer = watchService{}

// snapshotChunk bounds the resources of one SNAPSHOT message.
const snapshotChunk = 500

// WatchResources streams the store from its Watch: a Reset becomes a snapshot
// and a SYNCED marker, changes become CHANGES. Resuming from a revision is the
// store's (a compacted revision comes back as a Reset: a fresh snapshot).
func (s watchService) WatchResources(req *verdictv1.WatchResourcesRequest, stream verdictv1.WatchService_WatchResourcesServer) error {
	if err := validateRequest(req); err != nil {
		return toStatus(stream.Context(), s.log, err)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	events := s.store.Watch(ctx, req.GetFromRevision())
	for {
		select {
		case <-s.stop:
			return toStatus(ctx, s.log, errShuttingDown)
		case ev, ok := <-events:
			if !ok {
				return toStatus(ctx, s.log, stream.Context().Err())
			}
			if err := sendEvent(stream, req.GetPrefix(), ev); err != nil {
				return toStatus(ctx, s.log, err)
			}
		}
	}
}

func sendEvent(stream verdictv1.WatchService_WatchResourcesServer, prefix string, ev store.Event) error {
	var changes []*verdictv1.ResourceChange
	for _, c := range ev.Changes {
		if !strings.HasPrefix(c.Path, prefix) {
			continue
		}
		rc, err := resourceChange(c)
		if err != nil {
			return err
		}
		changes = append(changes, rc)
	}
	if !ev.Reset {
		if len(changes) == 0 {
			return nil // progress, or nothing under the prefix
		}
		return stream.Send(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES,
			Revision: ev.Revision, Changes: changes})
	}
	for first := true; first || len(changes) > 0; first = false {
		n := min(len(changes), snapshotChunk)
		if err := stream.Send(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT,
			Revision: ev.Revision, Fresh: first, Changes: changes[:n]}); err != nil {
			return err
		}
		changes = changes[n:]
	}
	return stream.Send(&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED, Revision: ev.Revision})
}

func resourceChange(c engine.Change) (*verdictv1.ResourceChange, error) {
	switch {
	case c.Resource != nil:
		sr, err := apiconv.StoredResource(c.Path, c.Resource, nil)
		return &verdictv1.ResourceChange{Key: c.Path, Resource: sr}, err
	case c.Err != nil:
		sr, err := apiconv.StoredResource(c.Path, nil, c.Err)
		if sr != nil {
			sr.ModRevision = c.ModRevision
		}
		return &verdictv1.ResourceChange{Key: c.Path, Resource: sr}, err
	}
	return &verdictv1.ResourceChange{Key: c.Path, Deleted: true}, nil
}

// WatchRules streams a workload's rules: in full first, then whenever they
// change. The rules are computed once per distinct (mesh, type, tags) per
// snapshot by the hub, and shared by every stream watching that workload.
func (s watchService) WatchRules(req *verdictv1.WatchRulesRequest, stream verdictv1.WatchService_WatchRulesServer) error {
	ctx := stream.Context()
	if err := validateRequest(req); err != nil {
		return toStatus(ctx, s.log, err)
	}
	w, err := s.hub.watch(req.GetMesh(), req.GetType(), req.GetWorkload().GetTags())
	if err != nil {
		return toStatus(ctx, s.log, err)
	}
	defer w.close()
	for {
		select {
		case <-s.stop:
			return toStatus(ctx, s.log, errShuttingDown)
		case <-ctx.Done():
			return toStatus(ctx, s.log, ctx.Err())
		case <-w.notify:
			st := w.latest()
			if st.err != nil {
				return toStatus(ctx, s.log, st.err)
			}
			if err := stream.Send(st.resp); err != nil {
				return toStatus(ctx, s.log, err)
			}
		}
	}
}
