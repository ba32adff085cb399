package server

// The method table: every method the server serves has exactly one row, which
// says who may call it, what of a request needs an authorized caller, what of
// an answer only an authorized caller may read, how its requests are
// validated, and how large one may be (docs/api.md, "Access" and "Limits").
// The interceptors look every call up here before any handler runs; a method
// without a row is refused (UNIMPLEMENTED), so a new RPC is never open or
// unvalidated by omission. TestEveryMethodHasARow walks the services
// registered on the real server against this table.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/internal/admission"
	"github.com/verdictpdp/verdict/internal/fanout"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// access says who may call a method. The zero value admits nobody: a row
// that forgets to say is refused, not open.
type access uint8

const (
	// anyone who reaches the listener (sidecars, Envoy, firewall agents).
	anyone access = iota + 1
	// authorizedOnly: a caller with the bearer token or an allowed client
	// certificate (every caller in development mode).
	authorizedOnly
)

// method is one row of the table.
type method struct {
	access access
	// needs are the parts of a request that need an authorized caller on a
	// method anyone may call (explain); each message of a stream is checked.
	needs []need
	// redact returns an answer to a caller who is not authorized without
	// what only an authorized caller may read (workload names, tags): the
	// answer itself, edited, or a copy of one shared with other streams; nil:
	// the method's answers hold none. It sees every message a stream sends.
	redact func(resp any) any
	// validate checks a request (validates); nil refuses every request.
	validate func(req any) error
	// maxBytes bounds a request message (0: Config.MaxRecvMsgBytes). Rows
	// of one request type share the smallest (requestCodec measures it).
	maxBytes int
	// admitted: the caller's calls are admitted per caller (Config.AdmitPerCaller;
	// internal/admission): a unary call holds one of its caller's slots while
	// its handler runs, a stream each message while it is answered (the
	// handler asks: admitMessage).
	admitted bool
	// selfChecked: the interceptors leave the messages to the handler, which
	// runs checkRequest on each one and answers a refusal its own way — a
	// DecideStream or DecideCompactStream message gets an error answer and the
	// stream goes on; Envoy's Check gets a DENY, never a gRPC error.
	selfChecked bool
}

// need is a part of a request that needs an authorized caller (needsIf).
type need struct {
	what string         // "explain", as the refusal names it
	in   func(any) bool // the request has it (a request of another type: true)
}

// methodTable is the server's table, keyed by full method name. A new method
// is one row: its access and validator, and where it has them the parts of
// its requests that need authorization (needsIf: explain, a read at a past
// revision or time) and what its answers must not show anyone else
// (redacts).
var methodTable = map[string]*method{
	// DecisionService: open to sidecars; explain and inventory data (workload
	// names, tags) only for authorized callers. Its calls are admitted per
	// caller, so that one caller's flood takes at most its share of the cores.
	verdictv1.DecisionService_Decide_FullMethodName: {access: anyone, admitted: true, needs: []need{needsIf("explain", (*verdictv1.DecideRequest).GetExplain),
		needsIf("at_revision", hasPast[*verdictv1.DecideRequest])},
		redact: redacts(redactDecide), validate: validatedByHandler},
	verdictv1.DecisionService_DecideBatch_FullMethodName: {access: anyone, admitted: true, needs: []need{needsIf("explain", batchExplains),
		needsIf("at_revision", hasPast[*verdictv1.DecideBatchRequest])},
		redact: redacts(redactBatch), validate: validates(checkDecideBatch)},
	verdictv1.DecisionService_DecideStream_FullMethodName: {access: anyone, admitted: true, needs: []need{needsIf("explain", streamExplains)},
		redact: redacts(redactStream), validate: validates(checkStreamMessage), selfChecked: true},
	verdictv1.DecisionService_Resolve_FullMethodName: {access: anyone, admitted: true, needs: []need{needsIf("at_revision", hasPast[*verdictv1.ResolveRequest])},
		validate: validates(checkResolve)},
	verdictv1.DecisionService_Identify_FullMethodName:      {access: anyone, admitted: true, redact: redacts(redactIdentify), validate: validates(checkIdentify)},
	verdictv1.DecisionService_DecideCompact_FullMethodName: {access: anyone, admitted: true, validate: validatedByHandler},
	verdictv1.DecisionService_DecideCompactStream_FullMethodName: {access: anyone, admitted: true, validate: validates(checkCompactStreamMessage),
		selfChecked: true},

	// PolicyService: the store itself.
	verdictv1.PolicyService_Apply_FullMethodName:  {access: authorizedOnly, validate: validates(checkApply)},
	verdictv1.PolicyService_Get_FullMethodName:    {access: authorizedOnly, validate: validates(checkGet)},
	verdictv1.PolicyService_List_FullMethodName:   {access: authorizedOnly, validate: validates(checkList)},
	verdictv1.PolicyService_Delete_FullMethodName: {access: authorizedOnly, validate: validates(checkDelete)},
	verdictv1.PolicyService_Status_FullMethodName: {access: authorizedOnly, validate: validates(checkStatus)},
	// The store's past (docs/history.md): who changed what, and reverts.
	verdictv1.PolicyService_History_FullMethodName: {access: authorizedOnly, validate: validates(checkHistory)},
	verdictv1.PolicyService_Diff_FullMethodName:    {access: authorizedOnly, validate: validates(checkDiff)},
	verdictv1.PolicyService_Revert_FullMethodName:  {access: authorizedOnly, validate: validates(checkRevert)},

	// WatchService: the store's changes need authorization; a workload's
	// rules are open, its peers' addresses (address sets) are inventory.
	verdictv1.WatchService_WatchResources_FullMethodName: {access: authorizedOnly, validate: validates(checkWatchResources)},
	verdictv1.WatchService_WatchRules_FullMethodName: {access: anyone, needs: []need{needsIf("address_sets", (*verdictv1.WatchRulesRequest).GetAddressSets)},
		redact: redactRules, validate: validates(checkWatchRules)},

	// AnalysisService: its answers name workloads and tags. A read of the
	// past needs an authorized caller too, said here as well should the
	// service ever open.
	verdictv1.AnalysisService_Reach_FullMethodName: {access: authorizedOnly, needs: []need{needsIf("at_revision", hasPast[*verdictv1.ReachRequest])},
		validate: validates(checkReach)},
	verdictv1.AnalysisService_Matrix_FullMethodName: {access: authorizedOnly, needs: []need{needsIf("at_revision", hasPast[*verdictv1.MatrixRequest])},
		validate: validates(checkMatrix)},
	verdictv1.AnalysisService_Impact_FullMethodName: {access: authorizedOnly, validate: validates(checkImpact)},
	verdictv1.AnalysisService_Lint_FullMethodName: {access: authorizedOnly, needs: []need{needsIf("at_revision", hasPast[*verdictv1.LintRequest])},
		validate: validates(checkLint)},
	// A replica's observed flows, which replicas ask each other for with
	// their own credentials.
	verdictv1.AnalysisService_ObservedFlows_FullMethodName: {access: authorizedOnly, validate: validates(checkObservedFlows)},

	// Decision records name workloads and callers.
	verdictv1.DecisionLogService_Follow_FullMethodName: {access: authorizedOnly, validate: validates(checkFollow)},

	// Envoy's external authorization: decided as Decide; a request it cannot
	// take (too large, undecodable) is a DENY (extauthz.go).
	authv3.Authorization_Check_FullMethodName: {access: anyone, admitted: true, redact: redacts(redactCheck), validate: validatedByHandler, selfChecked: true},

	// gRPC's own services.
	healthpb.Health_Check_FullMethodName:                                   {access: anyone, validate: nothingToValidate},
	healthpb.Health_Watch_FullMethodName:                                   {access: anyone, validate: nothingToValidate},
	healthpb.Health_List_FullMethodName:                                    {access: anyone, validate: nothingToValidate},
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      {access: anyone, validate: nothingToValidate},
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: {access: anyone, validate: nothingToValidate},
}

// needsIf is a need: what, which a request of type T has when has says so.
func needsIf[T proto.Message](what string, has func(T) bool) need {
	return need{what: what, in: func(req any) bool {
		r, ok := req.(T)
		return !ok || has(r) // a message of another type: refused, as if it had the part
	}}
}

// redacts makes a row's redact of a function that edits answers of one
// type; answers of other types are sent as they are.
func redacts[T proto.Message](redact func(T)) func(any) any {
	return func(resp any) any {
		if r, ok := resp.(T); ok {
			redact(r)
		}
		return resp
	}
}

func batchExplains(r *verdictv1.DecideBatchRequest) bool {
	for _, f := range r.GetRequests() {
		if f.GetExplain() {
			return true
		}
	}
	return false
}

func streamExplains(m *verdictv1.DecideStreamRequest) bool { return m.GetRequest().GetExplain() }

// redactResolution keeps of how an end resolved only its form, what it
// resolved as, and its identity.
func redactResolution(r *verdictv1.EndpointResolution) {
	if r != nil {
		r.Workload, r.Holders, r.Tags = "", 0, nil
	}
}

func redactDecide(r *verdictv1.DecideResponse) {
	if r == nil {
		return
	}
	redactResolution(r.SourceResolution)
	redactResolution(r.DestinationResolution)
	r.Explanation = nil // never asked for without authorization (needs)
}

func redactBatch(r *verdictv1.DecideBatchResponse) {
	for _, res := range r.GetResults() {
		redactDecide(res.GetResponse())
	}
}

func redactStream(m *verdictv1.DecideStreamResponse) { redactDecide(m.GetResult().GetResponse()) }

func redactIdentify(r *verdictv1.IdentifyResponse) {
	for _, res := range r.GetResults() {
		redactResolution(res.GetResolution())
	}
}

// redactCheck removes the workload names from a Check's dynamic metadata
// (checkMetadata): the source and destination keep form, resolved_as and
// identity.
func redactCheck(r *authv3.CheckResponse) {
	for _, end := range []string{"source", "destination"} {
		if s := r.GetDynamicMetadata().GetFields()[end].GetStructValue(); s != nil {
			delete(s.Fields, "workload")
			delete(s.Fields, "holders")
		}
	}
}

// redactRules: a RULES message is shared by the streams watching one
// workload, encoded once (fanout.Message); one that names the workload
// (watched by address) goes to a caller who is not authorized as its
// redacted twin, which keeps of the resolution its form, resolved_as and
// identity, shared too.
func redactRules(resp any) any {
	if m, ok := resp.(*fanout.Message); ok {
		return m.Redacted()
	}
	return resp
}

// call is what the interceptors learned of a call: its method's row and its
// caller's standing. Handlers of self-checked methods find it in their
// context (checkRequest).
type call struct {
	method     string
	row        *method
	authorized bool
	why        error // why the caller is not authorized; nil when it is
	// slots admits the call's work per caller (nil: its row is not admitted,
	// or admission is off); caller names its caller there.
	slots  *admission.Limiter
	caller string
}

type callKey struct{}

func withCall(ctx context.Context, c *call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// checkRequest checks one message of a self-checked method against its row,
// for the caller of ctx: its size, the parts that need an authorized caller,
// its fields. Without the interceptors' call in ctx every message is refused.
func checkRequest(ctx context.Context, req any) error {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		m, _ := grpc.Method(ctx)
		return fmt.Errorf("%w: %s: no call of the method table", errNoRow, m)
	}
	return c.check(req)
}

// admitMessage waits for one of the caller's slots for one message of an
// admitted stream (the row's admitted), released by releaseMessage (not a
// closure, allocated per message); the context's error when it ends first.
// Without an admitted call in ctx it admits at once (nil).
func admitMessage(ctx context.Context) (*call, error) {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil || c.slots == nil {
		return nil, nil
	}
	if err := c.slots.Acquire(ctx, c.caller); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *call) releaseMessage() {
	if c != nil {
		c.slots.Release(c.caller)
	}
}

// check checks a request against the call's row.
func (c *call) check(req any) error {
	if reason, ok := oversized(req); ok {
		return fmt.Errorf("%w: %s: %s", errTooLarge, c.method, reason)
	}
	if !c.authorized {
		for _, n := range c.row.needs {
			if n.in(req) {
				return fmt.Errorf("%s needs an authorized caller (a bearer token or an allowed client certificate): %w", n.what, c.why)
			}
		}
	}
	if c.row.validate == nil {
		return fmt.Errorf("%w: %s: its row names no validator", errNoRow, c.method)
	}
	return c.row.validate(req)
}

// redact is the answer to send: for a caller who is not authorized, as the
// row's redaction leaves it.
func (c *call) redact(resp any) any {
	if !c.authorized && c.row.redact != nil {
		return c.row.redact(resp)
	}
	return resp
}

// admit looks a call up in the table and judges its caller: a method without
// a row is refused; so is a caller with ambiguous credentials whatever the
// method, and one not authorized for a method only authorized callers may
// call. Refusals for credentials are logged (rate-limited).
func (s *Server) admit(ctx context.Context, fullMethod string) (call, error) {
	row := s.methods[fullMethod]
	if row == nil {
		return call{}, toStatus(ctx, s.log, fmt.Errorf("%w: %s has no row in the server's method table", errNoRow, fullMethod))
	}
	c := call{method: fullMethod, row: row}
	c.authorized, c.why = s.auth.standing(ctx)
	var refusal error
	switch {
	case errors.Is(c.why, errAmbiguousAuthorization):
		refusal = c.why
	case row.access == anyone:
	case row.access == authorizedOnly:
		if !c.authorized {
			refusal = fmt.Errorf("%s needs an authorized caller (a bearer token or an allowed client certificate): %w", fullMethod, c.why)
		}
	default:
		return call{}, toStatus(ctx, s.log, fmt.Errorf("%w: %s: its row says nobody may call it", errNoRow, fullMethod))
	}
	if refusal != nil {
		s.auth.refused(ctx, refusal)
		return call{}, toStatus(ctx, s.log, refusal)
	}
	if row.admitted && s.slots != nil {
		c.slots, c.caller = s.slots, callerKey(ctx)
	}
	return c, nil
}

// unaryInterceptor admits a unary call (admit), checks its request against
// its row unless the handler does (selfChecked), and redacts the answer for a
// caller who is not authorized.
func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, err := s.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if c.row.selfChecked {
		cc := c // only self-checked calls pay for a call in the context
		ctx = withCall(ctx, &cc)
	} else if err := c.check(req); err != nil {
		if errors.Is(err, errUnauthenticated) || errors.Is(err, errPermissionDenied) {
			s.auth.refused(ctx, err)
		}
		return nil, toStatus(ctx, s.log, err)
	}
	if c.slots != nil && !readsPast(req) {
		if err := s.admitUnary(ctx, &c, req); err != nil {
			return nil, toStatus(ctx, s.log, err)
		}
		defer c.slots.Release(c.caller)
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return nil, err
	}
	return c.redact(resp), nil
}

// admitUnary takes one of the caller's slots for a unary call of an admitted
// row. A call waits for its min_revision first: the wait costs no CPU, and
// must not hold the caller's other calls.
func (s *Server) admitUnary(ctx context.Context, c *call, req any) error {
	if r, ok := req.(interface{ GetMinRevision() int64 }); ok && r.GetMinRevision() > 0 {
		if _, err := s.decision.snapshotAt(ctx, r.GetMinRevision()); err != nil {
			return err
		}
	}
	return c.slots.Acquire(ctx, c.caller)
}

// readsPast reports whether req reads at a past revision or time: it waits
// for the store (not for CPU) and needs an authorized caller, so it is not
// admitted per caller, where it would hold the caller's other calls.
func readsPast(req any) bool {
	r, ok := req.(pastRead)
	return ok && hasPast(r)
}

type pastRead interface {
	GetAtRevision() int64
	GetAtTime() *timestamppb.Timestamp
}

// streamInterceptor admits a stream (admit); its messages are checked as
// they are received (checkedStream) and its answers redacted as they are
// sent.
func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c, err := s.admit(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	cs := &checkedStream{ServerStream: ss, srv: s, call: c}
	cs.ctx = withCall(ss.Context(), &cs.call)
	return handler(srv, cs)
}

// checkedStream is a stream seen through its row: each message received is
// checked (unless the handler checks it: selfChecked), each answer sent is
// redacted for a caller who is not authorized.
type checkedStream struct {
	grpc.ServerStream
	ctx  context.Context
	srv  *Server
	call call
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.call.row.selfChecked {
		return nil
	}
	if err := s.call.check(m); err != nil {
		if errors.Is(err, errUnauthenticated) || errors.Is(err, errPermissionDenied) {
			s.srv.auth.refused(s.ctx, err)
		}
		return toStatus(s.ctx, s.srv.log, err)
	}
	return nil
}

func (s *checkedStream) SendMsg(m any) error {
	return s.ServerStream.SendMsg(s.call.redact(m))
}

// ReceiveHeadroom is what the server's gRPC receive limit adds to the largest
// method limit: a message between its method's limit and the gRPC limit
// reaches the interceptors, which refuse it by the row (RESOURCE_EXHAUSTED),
// or Check's handler, which denies it. Envoy sends at most 8 MiB of headers
// (its max_request_headers_kb ceiling) plus the body it buffers
// (with_request_body.max_request_bytes; docs/envoy.md): with the default
// limits every Check it can send below a 4 MiB body gets an answer.
const ReceiveHeadroom = 12 << 20

// requestLimits are the receive limits of a method table by request type
// (requestCodec measures a message against its type's) and the server's gRPC
// receive limit: the largest plus ReceiveHeadroom. A method whose request type
// is not registered with protobuf gets no entry: its messages are measured
// against def.
func requestLimits(table map[string]*method, def int) (byType map[protoreflect.FullName]int, grpcLimit int) {
	byType = map[protoreflect.FullName]int{}
	largest := def
	for name, row := range table {
		limit := row.maxBytes
		if limit <= 0 {
			limit = def
		}
		largest = max(largest, limit)
		in, ok := requestType(name)
		if !ok {
			continue
		}
		if old, ok := byType[in]; !ok || limit < old {
			byType[in] = limit
		}
	}
	return byType, largest + ReceiveHeadroom
}

// requestType is the request message of a full method name
// ("/verdict.v1.DecisionService/Decide"), from protobuf's registry.
func requestType(fullMethod string) (protoreflect.FullName, bool) {
	svc, name, ok := splitMethod(fullMethod)
	if !ok {
		return "", false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return "", false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return "", false
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return "", false
	}
	return md.Input().FullName(), true
}

// splitMethod splits "/pkg.Service/Method".
func splitMethod(fullMethod string) (service, name string, ok bool) {
	rest, slash := strings.CutPrefix(fullMethod, "/")
	service, name, ok = strings.Cut(rest, "/")
	return service, name, slash && ok && service != "" && name != ""
}
