package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// decisionService implements verdict.v1.DecisionService.
type decisionService struct {
	*Server
	verdictv1.UnimplementedDecisionServiceServer
}

var _ verdictv1.DecisionServiceServer = decisionService{}

// Decide answers one flow (validated here, as the engine's request is built).
func (s decisionService) Decide(ctx context.Context, req *verdictv1.DecideRequest) (*verdictv1.DecideResponse, error) {
	er, err := decideRequest(req)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	snap, err := s.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	resp, err := s.decide(ctx, snap, &er)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return resp, nil
}

// decide answers a validated request from snap.
func (s *Server) decide(ctx context.Context, snap *engine.Snapshot, er *engine.Request) (*verdictv1.DecideResponse, error) {
	start := time.Now()
	d, err := snap.Decide(er)
	if err != nil {
		return nil, err
	}
	s.metrics.decided(ctx, d.Action, time.Since(start))
	return s.confs.DecideResponse(&d), nil
}

// DecideBatch answers every flow from one snapshot; an invalid flow gets an
// error entry.
func (s decisionService) DecideBatch(ctx context.Context, req *verdictv1.DecideBatchRequest) (*verdictv1.DecideBatchResponse, error) {
	snap, err := s.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	out := &verdictv1.DecideBatchResponse{Results: make([]*verdictv1.DecideResult, len(req.GetRequests())), Revision: snap.Revision()}
	for i, r := range req.GetRequests() {
		out.Results[i] = s.result(ctx, snap, func() string { return fmt.Sprintf("requests[%d].", i) }, r)
	}
	return out, nil
}

// result answers one flow of a batch or a stream, or says why it cannot; the
// fields of its errors start with prefix() ("requests[3]."), computed only for
// a flow that has errors.
func (s *Server) result(ctx context.Context, snap *engine.Snapshot, prefix func() string, r *verdictv1.DecideRequest) *verdictv1.DecideResult {
	var errs fieldErrors
	er := errs.decide("", r)
	errs.prefix(prefix)
	err := errs.err()
	if err == nil {
		var resp *verdictv1.DecideResponse
		if resp, err = s.decide(ctx, snap, &er); err == nil {
			return &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Response{Response: resp}}
		}
	}
	return &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Error{Error: errorEntry(ctx, s.log, err)}}
}

// DecideStream answers each message with its id. An invalid message gets an
// error answer and the stream goes on; the stream ends when the client closes
// it, or with UNAVAILABLE when the server stops.
func (s decisionService) DecideStream(stream verdictv1.DecisionService_DecideStreamServer) error {
	ctx := stream.Context()
	msgs := make(chan *verdictv1.DecideStreamRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-s.stop:
			return toStatus(ctx, s.log, errShuttingDown)
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return toStatus(ctx, s.log, err)
		case m := <-msgs:
			if err := stream.Send(s.streamAnswer(ctx, m)); err != nil {
				return toStatus(ctx, s.log, err)
			}
		}
	}
}

func (s *Server) streamAnswer(ctx context.Context, m *verdictv1.DecideStreamRequest) *verdictv1.DecideStreamResponse {
	out := &verdictv1.DecideStreamResponse{Id: m.GetId()}
	if err := validateStreamRequest(m); err != nil {
		out.Result = &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Error{Error: errorEntry(ctx, s.log, err)}}
		return out
	}
	snap, err := s.snapshotAt(ctx, m.GetRequest().GetMinRevision())
	if err != nil {
		out.Result = &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Error{Error: errorEntry(ctx, s.log, err)}}
		return out
	}
	out.Result = s.result(ctx, snap, func() string { return "request." }, m.GetRequest())
	return out
}

// Resolve returns the effective configuration (validated by the interceptor).
func (s decisionService) Resolve(ctx context.Context, req *verdictv1.ResolveRequest) (*verdictv1.ResolveResponse, error) {
	snap, err := s.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	rr := apiconv.ResolveRequest(req)
	res, err := snap.Resolve(&rr)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	resp, err := apiconv.ResolveResponse(res)
	return resp, toStatus(ctx, s.log, err)
}
