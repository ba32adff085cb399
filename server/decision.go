package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// decisionService implements verdict.v1.DecisionService (compact.go has the
// compact path).
type decisionService struct {
	verdictv1.UnimplementedDecisionServiceServer
	*decider  // decisions, and the registry Identify fills
	snapshots // reads at a min_revision
	log       *slog.Logger
	stop      <-chan struct{} // closed when the server stops: streams end
}

// decider answers validated requests from a snapshot: the engine's decision,
// timed and handed to the recorder, converted to the API's answer. The
// decision service (the compact path too) and Envoy's Check (extauthz.go)
// share it.
type decider struct {
	identities *inventory.Registry // the tag sets registered through Identify
	// registrations limits the new sets each caller registers (Identify).
	registrations *registrationLimits
	record        *recorder
	confs         *apiconv.ConfCache
}

var _ verdictv1.DecisionServiceServer = decisionService{}

// Decide answers one flow (validated here, as the engine's request is built).
func (s decisionService) Decide(ctx context.Context, req *verdictv1.DecideRequest) (*verdictv1.DecideResponse, error) {
	er, err := decideRequest(req)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	snap, err := s.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	var t tally
	resp, err := s.decide(ctx, &t, snap, &er, new(apiconv.DecideAnswer))
	s.record.done(ctx, &t)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return resp, nil
}

// decide answers a validated request from snap in a (zero), whose response
// it returns; the decision goes to the recorder through t.
func (s *decider) decide(ctx context.Context, t *tally, snap *engine.Snapshot, er *engine.Request, a *apiconv.DecideAnswer) (*verdictv1.DecideResponse, error) {
	start := time.Now()
	er.Registry = s.identities // identities registered through Identify resolve too
	er.TagIdentities = true    // the answer reports every side's identity (from the memo when it answers)
	d, err := snap.Decide(er)
	if err != nil {
		return nil, err
	}
	end := time.Now()
	s.record.decided(ctx, t, er, &d, end.Sub(start), end)
	mesh := er.Mesh
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	resp := s.confs.DecideAnswer(a, mesh, &d, er.Explain)
	if ex := resp.GetExplanation(); ex != nil {
		boundTrace(ex.GetOutbound(), MaxExplainBytes/2)
		boundTrace(ex.GetInbound(), MaxExplainBytes/2)
	}
	return resp, nil
}

// boundTrace cuts a side's trace to about budget encoded bytes: its members,
// then its candidates in order, then the policies that were not candidates,
// as far as they fit; a cut sets Truncated.
func boundTrace(tr *verdictv1.SideTrace, budget int) {
	if tr == nil || proto.Size(tr) <= budget {
		return
	}
	left := budget - proto.Size(&verdictv1.SideTrace{MostSpecificScope: tr.GetMostSpecificScope(), Reason: tr.GetReason(), Truncated: true})
	fits := func(size int) bool {
		size += 4 // the field's tag and length
		if size > left {
			left = 0
			return false
		}
		left -= size
		return true
	}
	for i, m := range tr.Members {
		if !fits(len(m)) {
			tr.Members = tr.Members[:i]
			break
		}
	}
	for i, c := range tr.Candidates {
		if !fits(proto.Size(c)) {
			tr.Candidates = tr.Candidates[:i]
			break
		}
	}
	for i, n := range tr.NotCandidates {
		if !fits(proto.Size(n)) {
			tr.NotCandidates = tr.NotCandidates[:i]
			break
		}
	}
	tr.Truncated = true
}

// DecideBatch answers every flow from one snapshot; an invalid flow gets an
// error entry.
func (s decisionService) DecideBatch(ctx context.Context, req *verdictv1.DecideBatchRequest) (*verdictv1.DecideBatchResponse, error) {
	snap, err := s.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	flows := req.GetRequests()
	out := &verdictv1.DecideBatchResponse{Results: make([]*verdictv1.DecideResult, len(flows)), Revision: snap.Revision()}
	answers := make([]flowAnswer, len(flows)) // one allocation for the batch's answers
	var t tally
	for i, r := range flows {
		out.Results[i] = s.result(ctx, &t, snap, func() string { return fmt.Sprintf("requests[%d].", i) }, r, &answers[i])
	}
	s.record.done(ctx, &t)
	return out, nil
}

// flowAnswer holds the messages of one flow's answer in a batch or a stream,
// allocated together.
type flowAnswer struct {
	result   verdictv1.DecideResult
	response verdictv1.DecideResult_Response
	apiconv.DecideAnswer
}

// result answers one flow of a batch or a stream in a (zero), or says why it
// cannot; the fields of its errors start with prefix() ("requests[3]."),
// computed only for a flow that has errors.
func (s decisionService) result(ctx context.Context, t *tally, snap *engine.Snapshot, prefix func() string, r *verdictv1.DecideRequest, a *flowAnswer) *verdictv1.DecideResult {
	var errs fieldErrors
	er := errs.decide("", r)
	errs.notPast("", r, "set on the batch for all its flows; a stream answers from the current snapshot")
	errs.prefix(prefix)
	err := errs.err()
	if err == nil {
		var resp *verdictv1.DecideResponse
		if resp, err = s.decide(ctx, t, snap, &er, &a.DecideAnswer); err == nil {
			a.response.Response = resp
			a.result.Result = &a.response
			return &a.result
		}
	}
	a.result.Result = &verdictv1.DecideResult_Error{Error: errorEntry(ctx, s.log, err)}
	return &a.result
}

// MaxStreamWaiting bounds the messages of one DecideStream that wait for their
// min_revision at once; a message beyond it is answered at once with
// UNAVAILABLE.
const MaxStreamWaiting = 64

// DecideStream answers each message with its id. An invalid message (or one
// asking for explain without authorization) gets an error answer and the
// stream goes on. A message whose min_revision is ahead of the snapshot
// waits for it (WaitTimeout, then an UNAVAILABLE answer) without
// holding the messages behind it: those are answered meanwhile, so answers
// may come out of order — match them by id. The stream ends when the client
// closes it (once every waiting message is answered), when the client cancels
// it (in any state: reading, sending, waiting), or with UNAVAILABLE when the
// server stops.
func (s decisionService) DecideStream(stream verdictv1.DecisionService_DecideStreamServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	var waiters sync.WaitGroup
	defer func() {
		cancel()
		waiters.Wait()
	}()
	msgs, recvErr := receive(ctx, stream.Recv)
	late := make(chan *verdictv1.DecideStreamResponse) // answers of messages that waited
	waiting := 0
	closed := false
	for !closed || waiting > 0 {
		var out *verdictv1.DecideStreamResponse
		select {
		case <-s.stop:
			return toStatus(ctx, s.log, errShuttingDown)
		case <-ctx.Done():
			return toStatus(ctx, s.log, ctx.Err())
		case err := <-recvErr:
			if !errors.Is(err, io.EOF) {
				return toStatus(ctx, s.log, err)
			}
			closed, recvErr = true, nil
			continue
		case out = <-late:
			waiting--
		case m := <-msgs:
			if out = s.streamAnswer(ctx, m, false); out != nil {
				break
			}
			if waiting >= MaxStreamWaiting {
				out = streamError(ctx, s.log, m, fmt.Errorf("%w: %d messages of this stream already wait for their min_revision",
					errNotCurrent, waiting))
				break
			}
			waiting++
			waiters.Add(1)
			go func() {
				defer waiters.Done()
				select {
				case late <- s.streamAnswer(ctx, m, true):
				case <-ctx.Done():
				}
			}()
			continue
		}
		if err := stream.Send(out); err != nil {
			return toStatus(ctx, s.log, err)
		}
	}
	return nil
}

// receive runs recv on a goroutine of its own until it fails, handing each
// message over msgs (until ctx ends) and the error over errs: a stream's
// handler selects on them beside the server's stop and ctx.
func receive[M any](ctx context.Context, recv func() (M, error)) (msgs <-chan M, errs <-chan error) {
	ms, es := make(chan M), make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				es <- err
				return
			}
			select {
			case ms <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ms, es
}

// streamAnswer answers one message of a DecideStream, checked against the
// method's row (size, explain for an authorized caller, fields). Without
// wait, a message whose min_revision is ahead of the snapshot gets nil (it
// must wait); with wait, it waits as a stream message does (messageAt).
func (s decisionService) streamAnswer(ctx context.Context, m *verdictv1.DecideStreamRequest, wait bool) *verdictv1.DecideStreamResponse {
	if err := checkRequest(ctx, m); err != nil {
		return streamError(ctx, s.log, m, err)
	}
	rev := m.GetRequest().GetMinRevision()
	snap := s.current()
	if rev > snap.Revision() {
		if !wait {
			return nil
		}
		var err error
		if snap, err = s.messageAt(ctx, rev); err != nil {
			return streamError(ctx, s.log, m, err)
		}
	}
	adm, err := admitMessage(ctx)
	if err != nil {
		return streamError(ctx, s.log, m, err)
	}
	defer adm.releaseMessage()
	a := new(streamAnswer)
	a.resp.Id = m.GetId()
	var t tally
	a.resp.Result = s.result(ctx, &t, snap, func() string { return "request." }, m.GetRequest(), &a.flowAnswer)
	s.record.done(ctx, &t)
	return &a.resp
}

// streamAnswer: the messages of one DecideStream answer, allocated together.
type streamAnswer struct {
	resp verdictv1.DecideStreamResponse
	flowAnswer
}

func streamError(ctx context.Context, log *slog.Logger, m *verdictv1.DecideStreamRequest, err error) *verdictv1.DecideStreamResponse {
	return &verdictv1.DecideStreamResponse{Id: m.GetId(),
		Result: &verdictv1.DecideResult{Result: &verdictv1.DecideResult_Error{Error: errorEntry(ctx, log, err)}}}
}

// Resolve returns the effective configuration (validated by the interceptor).
func (s decisionService) Resolve(ctx context.Context, req *verdictv1.ResolveRequest) (*verdictv1.ResolveResponse, error) {
	snap, err := s.read(ctx, req.GetMinRevision(), req.GetAtRevision(), req.GetAtTime())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	rr := apiconv.ResolveRequest(req)
	rr.Registry = s.identities
	res, err := snap.Resolve(&rr)
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	resp, err := apiconv.ResolveResponse(res)
	return resp, toStatus(ctx, s.log, err)
}
