package server

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// Limits of requests beyond the engine's (resource.MaxTagsPerWorkload and the
// tag key and value lengths apply to every workload).
const (
	MaxBatch        = 1000 // flows in one DecideBatch
	MaxPageSize     = 1000 // resources in one List page
	DefaultPageSize = 100
	MaxStreamIDLen  = 256 // bytes of a DecideStream id
	// MaxExplainBatch bounds the flows of one DecideBatch that ask for an
	// explanation; more is INVALID_ARGUMENT (an explanation can be a
	// thousand times the size of its flow: Decide explains one).
	MaxExplainBatch = 10
	// MaxExplainBytes bounds the encoded explanation of one decision: the
	// candidates, then the policies that were not candidates, are cut where
	// the budget ends (half per side) and the side says Truncated.
	MaxExplainBytes = 64 << 10
)

// Plain Go validation: protovalidate is not available, so every request type
// has a check here, named by its method's row in the method table
// (methods.go): run by the interceptors for unary calls and a server stream's
// request, and by the handlers for each message of a client stream. Errors
// are *resource.ValidationError with field paths in the request's JSON names;
// errors.go turns them into InvalidArgument with BadRequest details.

// validates makes a row's validator of a check of one request type: a
// message that did not decode (requestCodec) is refused naming its field
// before check runs; a message of another type is refused (a row naming the
// wrong check fails closed).
func validates[T proto.Message](check func(T) error) func(any) error {
	return func(req any) error {
		r, ok := req.(T)
		if !ok {
			return fmt.Errorf("%w: %T is not the request its row validates", errWrongMessage, req)
		}
		if fe, ok := undecodable(r); ok {
			return &resource.ValidationError{Errors: []resource.FieldError{fe}}
		}
		return check(r)
	}
}

// validatedByHandler is the validator of a method whose handler checks its
// request as it builds the engine's (Decide: decideRequest; DecideCompact:
// compactRequest) — once per call — or answers a bad request itself (Check:
// a DENY, never an error).
func validatedByHandler(any) error { return nil }

// nothingToValidate is the validator of the methods verdict does not
// implement (health, reflection): gRPC's own codec decodes their requests.
func nothingToValidate(any) error { return nil }

func checkDecideBatch(r *verdictv1.DecideBatchRequest) error {
	var errs fieldErrors
	if n := len(r.GetRequests()); n > MaxBatch {
		errs.add("requests", fmt.Sprintf("%d flows, over the limit of %d per batch", n, MaxBatch))
	}
	explained := 0
	for i, f := range r.GetRequests() {
		if f.GetExplain() {
			if explained++; explained == MaxExplainBatch+1 {
				errs.add(fmt.Sprintf("requests[%d].explain", i), fmt.Sprintf("over the limit of %d explained flows per batch: "+
					"ask Decide to explain one flow", MaxExplainBatch))
			}
		}
	}
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

func checkIdentify(r *verdictv1.IdentifyRequest) error {
	var errs fieldErrors
	errs.names(r.GetMesh(), "")
	if n := len(r.GetEndpoints()); n > MaxBatch {
		errs.add("endpoints", fmt.Sprintf("%d endpoints, over the limit of %d per call", n, MaxBatch))
	}
	errs.minRevision("minRevision", r.GetMinRevision())
	return errs.err()
}

func checkResolve(r *verdictv1.ResolveRequest) error {
	var errs fieldErrors
	errs.flow("", r.GetMesh(), r.GetType(), r.GetSource(), r.GetDestination(), r.GetProtocol(), r.GetPort())
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

// checkCompactStreamMessage checks one batch of a DecideCompactStream.
func checkCompactStreamMessage(m *verdictv1.DecideCompactStreamRequest) error {
	return compactRequest(m.GetBatch(), "batch.")
}

func checkApply(r *verdictv1.ApplyRequest) error {
	var errs fieldErrors
	errs.apply(r)
	return errs.err()
}

func checkGet(r *verdictv1.GetRequest) error {
	var errs fieldErrors
	errs.key("key", r.GetKey())
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

func checkList(r *verdictv1.ListRequest) error {
	var errs fieldErrors
	if ps := r.GetPageSize(); ps < 0 || ps > MaxPageSize {
		errs.add("pageSize", fmt.Sprintf("%d is not from 0 (default %d) to %d", ps, DefaultPageSize, MaxPageSize))
	}
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return errs.err()
}

func checkDelete(r *verdictv1.DeleteRequest) error {
	var errs fieldErrors
	if len(r.GetKeys()) == 0 {
		errs.add("keys", "name at least one key")
	}
	if len(r.GetKeys()) > store.MaxOps {
		errs.add("keys", fmt.Sprintf("%d keys, over the limit of %d per call (one etcd transaction)", len(r.GetKeys()), store.MaxOps))
	}
	seen := map[string]bool{}
	for i, k := range r.GetKeys() {
		errs.key(fmt.Sprintf("keys[%d]", i), k)
		seen[k] = true
	}
	errs.expected(r.GetExpectedRevisions(), seen)
	return errs.err()
}

func checkStatus(r *verdictv1.StatusRequest) error {
	var errs fieldErrors
	errs.minRevision("minRevision", r.GetMinRevision())
	return errs.err()
}

func checkWatchResources(r *verdictv1.WatchResourcesRequest) error {
	var errs fieldErrors
	errs.minRevision("fromRevision", r.GetFromRevision())
	return errs.err()
}

func checkWatchRules(r *verdictv1.WatchRulesRequest) error {
	var errs fieldErrors
	errs.names(r.GetMesh(), r.GetType())
	errs.watchedForm("workload", r.GetWorkload())
	return errs.err()
}

// checkFollow: a filter is matched as text, any value is valid.
func checkFollow(*verdictv1.FollowRequest) error { return nil }

// decideRequest validates a Decide's request and returns the engine's request
// built from it: the one place a Decide's engine.Request is built.
func decideRequest(r *verdictv1.DecideRequest) (engine.Request, error) {
	if fe, ok := undecodable(r); ok {
		return engine.Request{}, &resource.ValidationError{Errors: []resource.FieldError{fe}}
	}
	var errs fieldErrors
	req := errs.decide("", r)
	errs.past("", r.GetMinRevision(), r.GetAtRevision(), r.GetAtTime())
	return req, errs.err()
}

// checkStreamMessage checks the envelope of one message of a DecideStream;
// the request's own fields are checked as a batch's flows are (result).
func checkStreamMessage(m *verdictv1.DecideStreamRequest) error {
	var errs fieldErrors
	if len(m.GetId()) > MaxStreamIDLen {
		errs.add("id", fmt.Sprintf("%d bytes, over the limit of %d", len(m.GetId()), MaxStreamIDLen))
	}
	if m.GetRequest() == nil {
		errs.add("request", "is required")
	}
	return errs.err()
}

type fieldErrors struct{ list []resource.FieldError }

func (e *fieldErrors) add(field, reason string) {
	e.list = append(e.list, resource.FieldError{Field: field, Reason: reason})
}

// prefix puts prefix() before every field (a field "" names the whole flow:
// it becomes the prefix without its final dot).
func (e *fieldErrors) prefix(prefix func() string) {
	if len(e.list) == 0 {
		return
	}
	p := prefix()
	for i := range e.list {
		if e.list[i].Field == "" {
			e.list[i].Field = strings.TrimSuffix(p, ".")
		} else {
			e.list[i].Field = p + e.list[i].Field
		}
	}
}

func (e *fieldErrors) err() error {
	if len(e.list) == 0 {
		return nil
	}
	return &resource.ValidationError{Errors: e.list}
}

// decide checks a flow to decide and returns the engine's request for it
// (apiconv builds it; valid when e gained no error).
func (e *fieldErrors) decide(prefix string, r *verdictv1.DecideRequest) engine.Request {
	req := apiconv.DecideRequest(r)
	e.request(prefix, r.GetProtocol(), &req)
	e.minRevision(prefix+"minRevision", r.GetMinRevision())
	return req
}

func (e *fieldErrors) flow(prefix, mesh, typ string, src, dst *verdictv1.Endpoint, protocol string, port uint32) {
	p, _ := resource.ParseProtocol(protocol)
	req := engine.Request{Mesh: mesh, Type: typ, Protocol: p, Port: port}
	req.Source, req.SourceEndpoint = apiconv.Endpoint(src)
	req.Destination, req.DestinationEndpoint = apiconv.Endpoint(dst)
	e.request(prefix, protocol, &req)
}

// watchedForm checks a WatchRules workload: exactly one of tags, a workload
// name or an address. A principal or an identity names a tag set, not a
// workload whose rules a firewall could enforce: refused.
func (e *fieldErrors) watchedForm(field string, ep *verdictv1.Endpoint) {
	given := 0
	for _, set := range []bool{len(ep.GetTags()) > 0, ep.GetWorkload() != "", ep.GetAddress() != "",
		ep.GetPrincipal() != "", ep.GetIdentity() != 0} {
		if set {
			given++
		}
	}
	if given > 1 {
		e.add(field, "give exactly one of tags, workload and address")
	}
	switch {
	case ep.GetPrincipal() != "":
		e.add(field+".principal", "WatchRules takes a workload by tags, name or address, not by principal")
	case ep.GetIdentity() != 0:
		e.add(field+".identity", "WatchRules takes a workload by tags, name or address, not by identity")
	case ep.GetAddress() != "":
		if _, err := resource.CanonicalAddress(ep.GetAddress()); err != nil {
			e.add(field+".address", err.Error())
		}
	}
	if err := resource.CheckTags(ep.GetTags()); err != nil {
		e.add(field+".tags", err.Error())
	}
}

// request checks a flow's fields; protocol is the text req.Protocol was
// parsed from.
func (e *fieldErrors) request(prefix, protocol string, req *engine.Request) {
	if _, err := resource.ParseProtocol(protocol); err != nil {
		e.add(prefix+"protocol", err.Error())
	}
	if err := req.Validate(); err != nil {
		if ve := (*resource.ValidationError)(nil); errors.As(err, &ve) {
			for _, fe := range ve.Errors {
				e.add(prefix+fe.Field, fe.Reason)
			}
		} else {
			e.add(strings.TrimSuffix(prefix, "."), err.Error())
		}
	}
}

func (e *fieldErrors) names(mesh, typ string) {
	req := engine.Request{Mesh: mesh, Type: typ}
	if err := req.Validate(); err != nil {
		if ve := (*resource.ValidationError)(nil); errors.As(err, &ve) {
			e.list = append(e.list, ve.Errors...)
		}
	}
}

func (e *fieldErrors) minRevision(field string, rev int64) {
	if rev < 0 {
		e.add(field, fmt.Sprintf("%d is negative", rev))
	}
}

// past checks a read's revision fields: at most one of min_revision,
// at_revision and at_time, none negative, a time that is one.
func (e *fieldErrors) past(prefix string, minRev, atRev int64, atTime *timestamppb.Timestamp) {
	if atRev < 0 {
		e.add(prefix+"atRevision", fmt.Sprintf("%d is negative", atRev))
	}
	if atTime != nil {
		if err := atTime.CheckValid(); err != nil {
			e.add(prefix+"atTime", err.Error())
		}
	}
	given := 0
	for _, set := range []bool{minRev != 0, atRev != 0, atTime != nil} {
		if set {
			given++
		}
	}
	if given > 1 {
		e.add(prefix+"atRevision", "give at most one of minRevision, atRevision and atTime")
	}
}

// notPast refuses a flow's own at_revision or at_time in a batch or a
// stream: a batch takes them for all its flows, a stream not at all.
func (e *fieldErrors) notPast(prefix string, r *verdictv1.DecideRequest, where string) {
	if r.GetAtRevision() != 0 {
		e.add(prefix+"atRevision", where)
	}
	if r.GetAtTime() != nil {
		e.add(prefix+"atTime", where)
	}
}

// hasPast: a request reads the past (the method table's needs).
func hasPast[T interface {
	GetAtRevision() int64
	GetAtTime() *timestamppb.Timestamp
}](r T) bool {
	return r.GetAtRevision() != 0 || r.GetAtTime() != nil
}

// key checks a storage key without prefix ("default/policies/TrafficLog/x").
func (e *fieldErrors) key(field, key string) resource.Key {
	k, err := parseKey(key)
	if err != nil {
		e.add(field, err.Error())
	}
	return k
}

func parseKey(key string) (resource.Key, error) {
	if key == "" {
		return resource.Key{}, fmt.Errorf("is required: <mesh>/mesh, <mesh>/scopes/<name>, <mesh>/policies/<type>/<name> or <mesh>/workloads/<name>")
	}
	return resource.ParseKey(key)
}

func (e *fieldErrors) apply(r *verdictv1.ApplyRequest) {
	n := len(r.GetResources()) + len(r.GetDeletes())
	if n == 0 {
		e.add("resources", "name at least one resource or delete")
	}
	if n > store.MaxOps {
		e.add("resources", fmt.Sprintf("%d resources and deletes, over the limit of %d per call (one etcd transaction): split the write into several calls", n, store.MaxOps))
	} else if size := proto.Size(r); size > store.MaxTxnBytes {
		e.add("resources", fmt.Sprintf("%d bytes, over the limit of %d per call (one etcd transaction): split the write into several calls", size, store.MaxTxnBytes))
	}
	seen := map[string]bool{}
	for i, k := range r.GetDeletes() {
		e.key(fmt.Sprintf("deletes[%d]", i), k)
		seen[k] = true
	}
	// Resource keys are known only once decoded (in the handler); expected
	// revisions naming a key that is not written are refused there.
	for k, rev := range r.GetExpectedRevisions() {
		if _, err := parseKey(k); err != nil {
			e.add(fmt.Sprintf("expectedRevisions[%q]", k), err.Error())
		}
		if rev < store.MustNotExist {
			e.add(fmt.Sprintf("expectedRevisions[%q]", k), fmt.Sprintf("%d is not a revision (-1: must not exist)", rev))
		}
	}
}

// expected checks expected revisions against the keys a call writes.
func (e *fieldErrors) expected(revs map[string]int64, keys map[string]bool) {
	for k, rev := range revs {
		if !keys[k] {
			e.add(fmt.Sprintf("expectedRevisions[%q]", k), "names a key this call does not write")
		}
		if rev < store.MustNotExist {
			e.add(fmt.Sprintf("expectedRevisions[%q]", k), fmt.Sprintf("%d is not a revision (-1: must not exist)", rev))
		}
	}
}
