package server

// Observed flows (docs/analysis.md, "Observed flows"): every decision path
// counts its flows into the replica's table — through the recorder, or the
// compact path through a batch of it — and Impact replays them: this
// replica's own, and with fleet those of every live replica, asked through
// ObservedFlows with the replica's own credentials. A replica that does not
// answer in time is named in the answer, never skipped silently.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/observed"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Fleet lists the live replicas (cmd/verdictd: the etcd registry,
// docs/analysis.md "The fleet").
type Fleet interface {
	// Replicas lists every live replica, this one included.
	Replicas(ctx context.Context) ([]Replica, error)
}

// Replica is one live replica: its id, the address it advertises, and the
// revision of its registration.
type Replica struct {
	ID, Address string
	Revision    int64
}

// DefaultFleetTimeout bounds the wait for one replica's observed flows.
const DefaultFleetTimeout = 10 * time.Second

// observe counts a decision made at at into the observed-flows table.
func (r *recorder) observe(er *engine.Request, d *engine.Decision, at time.Time) {
	o := observed.Decision{Mesh: er.Mesh, Type: er.Type, Protocol: er.Protocol, Port: er.Port, Action: d.Action,
		Policy: d.Policy, Revision: d.Revision, At: at.UnixNano(),
		Source:      observedEnd(er.SourceEndpoint, er.Source, &d.SourceResolution),
		Destination: observedEnd(er.DestinationEndpoint, er.Destination, &d.DestinationResolution)}
	r.observed.Observe(&o)
}

func observedEnd(ep *inventory.Endpoint, tags resource.Tags, res *inventory.EndpointResolution) observed.End {
	e := observed.End{Identity: res.Identity, Tags: res.Tags}
	if ep != nil {
		e.Given = *ep
	} else {
		e.Given.Tags = tags
	}
	return e
}

// ObservedFlows lists this replica's observed flows in pages.
func (s analysisService) ObservedFlows(req *verdictv1.ObservedFlowsRequest, stream verdictv1.AnalysisService_ObservedFlowsServer) error {
	ctx := stream.Context()
	page := &verdictv1.ObservedFlowsResponse{}
	if s.observed == nil {
		return toStatus(ctx, s.log, stream.Send(page))
	}
	var keep func(mesh, typ string) bool
	if len(req.GetMeshes()) > 0 {
		keep = func(mesh, _ string) bool { return slices.Contains(req.GetMeshes(), mesh) }
	}
	flows := s.observed.Flows(keep)
	page.Held, page.Max, page.Evicted = uint64(s.observed.Len()), uint64(s.observed.Max()), uint64(s.observed.Evicted())
	for i := range flows {
		page.Flows = append(page.Flows, apiconv.ObservedFlowProto(&flows[i]))
		if len(page.Flows) == pageSize {
			if err := stream.Send(page); err != nil {
				return toStatus(ctx, s.log, err)
			}
			page = &verdictv1.ObservedFlowsResponse{}
		}
	}
	if len(page.Flows) > 0 || len(flows) == 0 {
		return toStatus(ctx, s.log, stream.Send(page))
	}
	return nil
}

// checkObservedFlows checks an ObservedFlows request: mesh names.
func checkObservedFlows(r *verdictv1.ObservedFlowsRequest) error {
	var errs fieldErrors
	for i, m := range r.GetMeshes() {
		if err := resource.CheckName(m); err != nil {
			errs.add(fmt.Sprintf("meshes[%d]", i), err.Error())
		}
	}
	return errs.err()
}

// replay returns the flows Impact replays — those given, this replica's
// own, and with fleet every live replica's, of the meshes given (nil: all),
// each flow once (its counts summed) — and the replicas asked.
func (s analysisService) replay(ctx context.Context, given []analysis.ObservedFlow, fleet bool, meshes map[string]bool) ([]analysis.ObservedFlow, []*verdictv1.ImpactReplica) {
	var keep func(mesh, typ string) bool
	if meshes != nil {
		keep = func(mesh, _ string) bool { return meshes[resourceMesh(mesh)] }
	}
	sources := [][]analysis.ObservedFlow{given}
	var replicas []*verdictv1.ImpactReplica
	if s.observed != nil {
		own := s.observed.Flows(keep)
		flows := make([]analysis.ObservedFlow, len(own))
		for i := range own {
			flows[i] = apiconv.ReplayFlow(&own[i])
		}
		sources = append(sources, flows)
		replicas = append(replicas, &verdictv1.ImpactReplica{Id: s.self.ID, Address: s.self.Address, Flows: uint64(len(flows)), Self: true})
	}
	if fleet && s.fleet != nil {
		others, errRep := s.askFleet(ctx, meshes)
		for _, o := range others {
			replicas = append(replicas, o.replica)
			sources = append(sources, o.flows)
		}
		if errRep != nil {
			replicas = append(replicas, errRep)
		}
	}
	return observed.Merge(sources), replicas
}

func resourceMesh(m string) string {
	if m == "" {
		return resource.DefaultMesh
	}
	return m
}

// peerFlows is one replica's answer.
type peerFlows struct {
	replica *verdictv1.ImpactReplica
	flows   []analysis.ObservedFlow
}

// askFleet asks every live replica but this one for its observed flows, at
// most 8 at a time, each within FleetTimeout (and the call's deadline).
// A replica that does not answer is listed with its error; so is the
// registry when it cannot be read (the second result).
func (s analysisService) askFleet(ctx context.Context, meshes map[string]bool) ([]peerFlows, *verdictv1.ImpactReplica) {
	reps, err := s.fleet.Replicas(ctx)
	if err != nil {
		return nil, &verdictv1.ImpactReplica{Id: "(registry)", Error: "the live replicas could not be listed: " + err.Error()}
	}
	timeout := s.fleetTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		timeout = min(timeout, left-min(500*time.Millisecond, left/5))
	}
	var req verdictv1.ObservedFlowsRequest
	for m := range meshes {
		req.Meshes = append(req.Meshes, m)
	}
	slices.Sort(req.Meshes)
	var out []peerFlows
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, r := range reps {
		if r.ID == s.self.ID {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			flows, err := s.askReplica(ctx, r.Address, timeout, &req)
			p := peerFlows{replica: &verdictv1.ImpactReplica{Id: r.ID, Address: r.Address, Flows: uint64(len(flows))}, flows: flows}
			if err != nil {
				p.replica.Error, p.flows, p.replica.Flows = err.Error(), nil, 0
			}
			mu.Lock()
			out = append(out, p)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b peerFlows) int { return strings.Compare(a.replica.Id, b.replica.Id) })
	return out, nil
}

// askReplica reads one replica's observed flows.
func (s analysisService) askReplica(ctx context.Context, addr string, timeout time.Duration, req *verdictv1.ObservedFlowsRequest) ([]analysis.ObservedFlow, error) {
	if addr == "" {
		return nil, fmt.Errorf("it advertises no address")
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("no time left to ask it")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if s.dial != nil {
		var err error
		if opts, err = s.dial(addr); err != nil {
			return nil, err
		}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	st, err := verdictv1.NewAnalysisServiceClient(conn).ObservedFlows(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []analysis.ObservedFlow
	for {
		page, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		for _, f := range page.GetFlows() {
			if o, ok := apiconv.ReplayFlowProto(f); ok {
				out = append(out, o)
			}
		}
	}
}
