package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// watchService implements verdict.v1.WatchService.
type watchService struct {
	verdictv1.UnimplementedWatchServiceServer
	log         *slog.Logger
	stop        <-chan struct{} // closed when the server stops: streams end
	feed        *resourceFeed   // WatchResources
	hub         *rulesHub       // WatchRules
	dropped     dropCounter
	rulesMaxLag time.Duration
}

// dropCounter counts the streams ended for falling behind
// (verdict_watch_dropped_total{rpc}).
type dropCounter interface {
	watchDropped(ctx context.Context)
	rulesDropped(ctx context.Context)
}

var _ verdictv1.WatchServiceServer = watchService{}

// snapshotChunk bounds the resources of one SNAPSHOT message.
const snapshotChunk = 500

// WatchResources streams the store from the replica's change feed (feed.go):
// a snapshot from memory and a SYNCED marker (from_revision 0, or older than
// the feed's history), then every change set after it, each as one CHANGES
// message. A stream that falls behind the history ends with
// RESOURCE_EXHAUSTED and the revision to resume from.
func (s watchService) WatchResources(req *verdictv1.WatchResourcesRequest, stream verdictv1.WatchService_WatchResourcesServer) error {
	ctx := stream.Context()
	select { // the feed holds the state once the syncer has synced
	case <-s.stop:
		return toStatus(ctx, s.log, errShuttingDown)
	case <-ctx.Done():
		return toStatus(ctx, s.log, ctx.Err())
	case <-s.feed.ready:
	}
	prefix := req.GetPrefix()
	snapshot, rev, seq := s.feed.start(req.GetFromRevision())
	if snapshot != nil {
		for _, part := range s.feed.snapshotParts(rev, prefix, snapshot) {
			if err := stream.SendMsg(part); err != nil {
				return toStatus(ctx, s.log, err)
			}
		}
	}
	for {
		set, behind, wake := s.feed.next(seq)
		switch {
		case behind:
			s.feed.dropped.Add(1)
			s.dropped.watchDropped(ctx)
			return toStatus(ctx, s.log, fmt.Errorf("%w: fell behind; resume from revision %d", errFellBehind, rev))
		case set == nil:
			select {
			case <-s.stop:
				return toStatus(ctx, s.log, errShuttingDown)
			case <-ctx.Done():
				return toStatus(ctx, s.log, ctx.Err())
			case <-wake:
			}
			continue
		}
		seq++
		if set.rev <= rev {
			continue // a resume from a revision ahead of the history
		}
		if resp := set.response(prefix); resp != nil {
			if err := stream.SendMsg(resp); err != nil {
				return toStatus(ctx, s.log, err)
			}
		}
		rev = set.rev
	}
}

// WatchRules streams a workload's rules: in full first, then whenever they
// change, and with address sets the deltas of their sets. The rules are
// computed once per distinct (mesh, type, workload as given, address sets)
// per snapshot by the hub, and shared by every stream watching that workload.
// Address sets expose the inventory: they need an authorized caller, as
// WatchResources does (the method table).
func (s watchService) WatchRules(req *verdictv1.WatchRulesRequest, stream verdictv1.WatchService_WatchRulesServer) error {
	ctx := stream.Context()
	w, err := s.hub.watch(ctx, req.GetMesh(), req.GetType(), watchedOf(req.GetWorkload()), req.GetAddressSets(), req.GetIncludeAudit())
	if err != nil {
		return toStatus(ctx, s.log, err)
	}
	defer w.close()
	return toStatus(ctx, s.log, s.serveRules(ctx, w, stream.SendMsg))
}

// watchedOf is a validated request's workload.
func watchedOf(ep *verdictv1.Endpoint) watched {
	switch {
	case ep.GetWorkload() != "":
		return watched{name: ep.GetWorkload()}
	case ep.GetAddress() != "":
		a, _ := resource.CanonicalAddress(ep.GetAddress())
		return watched{address: a}
	}
	tags := ep.GetTags()
	if tags == nil {
		tags = resource.Tags{}
	}
	return watched{tags: tags}
}
