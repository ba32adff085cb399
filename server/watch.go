package server

import (
	"context"
	"log/slog"
	"net"

	"google.golang.org/grpc/peer"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/fanout"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// watchService implements verdict.v1.WatchService: each stream is served by
// the change feed or the rules hub (internal/fanout), which the server runs.
type watchService struct {
	verdictv1.UnimplementedWatchServiceServer
	log   *slog.Logger
	feed  resourceFeed
	rules rulesHub
}

// resourceFeed is what WatchResources needs of the change feed (fanout.Feed).
type resourceFeed interface {
	Serve(ctx context.Context, from int64, prefix string, send func(any) error) error
}

// rulesHub is what WatchRules needs of the rules hub (fanout.Hub).
type rulesHub interface {
	Serve(ctx context.Context, req fanout.RulesRequest, caller fanout.Caller, send func(any) error) error
}

var _ verdictv1.WatchServiceServer = watchService{}

// WatchResources streams the store from the replica's change feed: a
// snapshot and a SYNCED marker, then every change set (docs/api.md). A stream
// that falls behind the feed's history ends with RESOURCE_EXHAUSTED and the
// revision to resume from.
func (s watchService) WatchResources(req *verdictv1.WatchResourcesRequest, stream verdictv1.WatchService_WatchResourcesServer) error {
	ctx := stream.Context()
	return toStatus(ctx, s.log, s.feed.Serve(ctx, req.GetFromRevision(), req.GetPrefix(), stream.SendMsg))
}

// WatchRules streams a workload's rules: in full first, then whenever they
// change, and with address sets the deltas of their sets, computed once per
// distinct workload by the hub, which caps the streams per connection, per
// caller and in total. Address sets expose the inventory: they need an
// authorized caller (the method table).
func (s watchService) WatchRules(req *verdictv1.WatchRulesRequest, stream verdictv1.WatchService_WatchRulesServer) error {
	ctx := stream.Context()
	r := fanout.RulesRequest{Mesh: req.GetMesh(), Type: req.GetType(), Workload: watchedOf(req.GetWorkload()),
		AddressSets: req.GetAddressSets(), IncludeAudit: req.GetIncludeAudit()}
	return toStatus(ctx, s.log, s.rules.Serve(ctx, r, callerOf(ctx), stream.SendMsg))
}

// callerOf is who calls, for the hub's caps: the connection, and the
// verified client certificate's first identity, else the peer's address
// without its port (every connection of one host is one caller).
func callerOf(ctx context.Context) fanout.Caller {
	var c fanout.Caller
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return c
	}
	c.Conn, c.ID = p.Addr.String(), p.Addr.String()
	if a, ok := p.Addr.(connAddr); ok && a.conn != nil {
		c.Conn = a.conn
	}
	if host, _, err := net.SplitHostPort(c.ID); err == nil {
		c.ID = host
	}
	if cert := verifiedClientCert(ctx); cert != nil {
		if ids := certIdentities(cert); len(ids) > 0 {
			c.ID = ids[0]
		}
	}
	return c
}

// watchedOf is a validated request's workload.
func watchedOf(ep *verdictv1.Endpoint) fanout.Workload {
	switch {
	case ep.GetWorkload() != "":
		return fanout.Workload{Name: ep.GetWorkload()}
	case ep.GetAddress() != "":
		a, _ := resource.CanonicalAddress(ep.GetAddress())
		return fanout.Workload{Address: a}
	}
	tags := ep.GetTags()
	if tags == nil {
		tags = resource.Tags{}
	}
	return fanout.Workload{Tags: tags}
}
