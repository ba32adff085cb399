package server

// Identities and the compact decision path (docs/api.md, "The compact path";
// docs/workloads.md, "Identities"): Identify registers tag sets in the
// server's registry; DecideCompact and DecideCompactStream decide flows named
// by identities, packed, answered packed. The path per flow: identity →
// interned tag set (a per-call memo, then the inventory and the registry) →
// the engine's memoised decision → one word. No map is built per flow.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The layout of a compact answer (decision.proto, DecideCompactResponse).
const (
	compactAllow       = 1
	compactDeny        = 2
	compactAudit       = 1 << 2
	compactCodeShift   = 3
	compactPolicyShift = 8
)

// Identify returns the identity of each endpoint's tags (reserved keys
// excluded) and registers the set, so flows may name it by identity.
func (s decisionService) Identify(ctx context.Context, req *verdictv1.IdentifyRequest) (*verdictv1.IdentifyResponse, error) {
	snap, err := s.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	if err := snap.CheckMeshType(req.GetMesh(), ""); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	out := &verdictv1.IdentifyResponse{Results: make([]*verdictv1.Identified, len(req.GetEndpoints())), Revision: snap.Revision()}
	for i, ep := range req.GetEndpoints() {
		out.Results[i] = s.identify(ctx, snap, req.GetMesh(), i, ep)
	}
	return out, nil
}

func (s decisionService) identify(ctx context.Context, snap *engine.Snapshot, mesh string, i int, ep *verdictv1.Endpoint) *verdictv1.Identified {
	if mesh == "" {
		mesh = engine.DefaultMesh
	}
	tags, eep := apiconv.Endpoint(ep)
	if eep == nil {
		eep = &engine.Endpoint{Tags: tags}
	}
	res, err := snap.ResolveEndpoint(mesh, eep, false, 0, s.identities)
	if err == nil {
		var set *engine.TagSet
		if set, err = snap.Identify(mesh, res.Tags, s.identities); err == nil {
			r := apiconv.EndpointResolution(mesh, &res, false)
			r.Identity = set.Identity() // of the tags minus the reserved keys
			return &verdictv1.Identified{Identity: set.Identity(), Resolution: r}
		}
		if errors.Is(err, engine.ErrIdentityCollision) {
			s.log.ErrorContext(ctx, "identity collision: a tag set refused", "err", err)
		}
	}
	if ve := (*engine.ValidationError)(nil); errors.As(err, &ve) {
		err = ve.Prefixed(fmt.Sprintf("endpoints[%d]", i))
	}
	return &verdictv1.Identified{Error: errorEntry(ctx, s.log, err)}
}

// compactScratch is the working memory of one compact batch, pooled.
type compactScratch struct {
	gen      uint32
	ids      [compactIDMemo]idMemo         // identity → resolution, for this batch
	policies map[string]uint32             // deciding policy → its index in the response, plus one
	recent   [compactPolicyMemo]policyMemo // in front of policies: no string hashed per flow
	counts   []int64                       // per policy index ×2 (allow, deny): the byPolicy metric
}

const (
	compactIDMemo     = 1024 // a power of 2
	compactPolicyMemo = 1024 // a power of 2
)

// policyMemo is a deciding policy's index, found by where its name's bytes
// sit (a policy's name is one string shared by its decisions) and verified
// by the name.
type policyMemo struct {
	gen uint32
	i   uint32
	p   string
}

type idMemo struct {
	gen  uint32
	id   uint64
	set  *engine.TagSet
	code verdictv1.CompactCode // for the source; the destination's is code+1
}

var compactPool = sync.Pool{New: func() any { return &compactScratch{policies: map[string]uint32{}} }}

// resolve returns the tag set of identity id, or the code of why it has none
// (as a source); an error only for the batch as a whole.
func (sc *compactScratch) resolve(s decisionService, ctx context.Context, scope *engine.PairScope, id uint64) (*engine.TagSet, verdictv1.CompactCode, error) {
	m := &sc.ids[(id^id>>32)&(compactIDMemo-1)]
	if m.gen == sc.gen && m.id == id {
		return m.set, m.code, nil
	}
	set, err := scope.Lookup(id)
	code := verdictv1.CompactCode_COMPACT_CODE_UNSPECIFIED
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrIdentityNotFound):
		code = verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE
	case errors.Is(err, engine.ErrIdentityCollision):
		s.log.ErrorContext(ctx, "identity collision: not answered", "err", err)
		code = verdictv1.CompactCode_COMPACT_CODE_IDENTITY_COLLISION
	default:
		return nil, 0, err
	}
	*m = idMemo{gen: sc.gen, id: id, set: set, code: code}
	return set, code, nil
}

// compactRequest checks a batch as a whole.
func compactRequest(r *verdictv1.DecideCompactRequest, prefix string) error {
	if fe, ok := undecodable(r); ok {
		return &engine.ValidationError{Errors: []engine.FieldError{fe}}
	}
	var errs fieldErrors
	errs.names(r.GetMesh(), r.GetType())
	n := len(r.GetSourceIds())
	if n > MaxBatch {
		errs.add("sourceIds", fmt.Sprintf("%d flows, over the limit of %d per batch", n, MaxBatch))
	}
	if len(r.GetDestinationIds()) != n || len(r.GetPortProtocols()) != n {
		errs.add("destinationIds", fmt.Sprintf("sourceIds, destinationIds and portProtocols have %d, %d and %d entries: one per flow in each",
			n, len(r.GetDestinationIds()), len(r.GetPortProtocols())))
	}
	errs.minRevision("minRevision", r.GetMinRevision())
	if prefix != "" {
		errs.prefix(func() string { return prefix })
	}
	return errs.err()
}

// decideCompact answers a checked batch from snap into out (reset first).
func (s decisionService) decideCompact(ctx context.Context, snap *engine.Snapshot, r *verdictv1.DecideCompactRequest, out *verdictv1.DecideCompactResponse) error {
	sc := compactPool.Get().(*compactScratch)
	defer compactPool.Put(sc)
	if sc.gen++; sc.gen == 0 {
		sc.ids = [compactIDMemo]idMemo{}
		sc.recent = [compactPolicyMemo]policyMemo{}
		sc.gen = 1
	}
	clear(sc.policies)
	sc.counts = sc.counts[:0]
	mesh, typ := r.GetMesh(), r.GetType()
	// The mesh, the type and the registry's part for the mesh, once per batch.
	scope, err := snap.PairScope(mesh, typ, s.identities)
	if err != nil {
		return err
	}
	out.Revision = snap.Revision()
	out.Policies = out.Policies[:0]
	srcs, dsts, pps := r.GetSourceIds(), r.GetDestinationIds(), r.GetPortProtocols()
	answers := out.Answers[:0]
	if cap(answers) < len(srcs) {
		answers = make([]uint32, 0, len(srcs))
	}
	var allow, deny, memoHits int64
	var audits [2]int64 // by shadow action: ALLOW, DENY
	logging := s.record.decisions != nil
	for i := range srcs {
		port, proto := pps[i]&0xffff, engine.Protocol(pps[i]>>16)
		// A flow the pair memo holds, its identities resolving as when it
		// was stored, is answered without resolving them.
		d, src, dst, memo := scope.DecideIDs(srcs[i], dsts[i], proto, port)
		if !memo {
			var code, dcode verdictv1.CompactCode
			if src, code, err = sc.resolve(s, ctx, scope, srcs[i]); err != nil {
				return err
			}
			if dst, dcode, err = sc.resolve(s, ctx, scope, dsts[i]); err != nil {
				return err
			}
			if code == 0 && dcode != 0 {
				code = dcode
				if code == verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE {
					code = verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_DESTINATION
				}
			}
			if code == 0 && proto > engine.ICMP {
				code = verdictv1.CompactCode_COMPACT_CODE_INVALID_PORT_PROTOCOL
			}
			if code != 0 {
				answers = append(answers, uint32(code)<<compactCodeShift)
				continue
			}
			d, memo = scope.Decide(src, dst, proto, port) // shared with the memo: read only
		}
		memoHits += b2i(memo)
		a := uint32(compactAllow)
		if d.Action == engine.Deny {
			a = compactDeny
			deny++
		} else {
			allow++
		}
		if auditDiffers(d) {
			a |= compactAudit
			audits[b2i(d.Audit.Action == engine.Deny)]++ // counted once per batch, below
		}
		pi := sc.policy(d.Policy, out)
		a |= pi << compactPolicyShift
		sc.counts[2*int(pi-1)+int(b2i(d.Action == engine.Deny))]++
		answers = append(answers, a)
		if logging && s.record.decisions.Wants(d.Action == engine.Deny, auditDiffers(d)) {
			dd := *d
			dd.Revision = out.Revision
			s.logCompact(ctx, mesh, typ, src, dst, proto, port, dd)
		}
	}
	out.Answers = answers
	s.metrics.decidedN(ctx, allow, deny)
	s.metrics.memoN(ctx, memoHits, allow+deny-memoHits)
	for shadowDeny, n := range audits {
		if n > 0 {
			s.record.byPolicy.auditN(ctx, shadowDeny == 1, n)
		}
	}
	for i, p := range out.Policies {
		for deny := 0; deny < 2; deny++ {
			if n := sc.counts[2*i+deny]; n > 0 {
				s.record.byPolicy.addN(ctx, p, deny == 1, n)
			}
		}
	}
	return nil
}

// logCompact offers a compact decision to the decision log: the endpoints as
// the identities given, with the tags they stand for.
func (s decisionService) logCompact(ctx context.Context, mesh, typ string, src, dst *engine.TagSet, proto engine.Protocol, port uint32, d engine.Decision) {
	er := engine.Request{Mesh: mesh, Type: typ, Protocol: proto, Port: port,
		SourceEndpoint: &engine.Endpoint{Identity: src.Identity()}, DestinationEndpoint: &engine.Endpoint{Identity: dst.Identity()}}
	resolved := func(t *engine.TagSet) engine.EndpointResolution {
		return engine.EndpointResolution{Form: engine.FormIdentity, ResolvedAs: engine.AsIdentity, Identity: t.Identity(), Tags: t.Tags()}
	}
	d.SourceResolution, d.DestinationResolution = resolved(src), resolved(dst)
	s.record.logDecision(ctx, &er, &d, 0)
}

// policy returns the index of the deciding policy p in out.Policies, plus
// one, adding it on first sight ("" too: a decision by no policy is counted
// under "" as Decide's are).
func (sc *compactScratch) policy(p string, out *verdictv1.DecideCompactResponse) uint32 {
	m := &sc.recent[(uintptr(unsafe.Pointer(unsafe.StringData(p)))>>3^uintptr(len(p)))&(compactPolicyMemo-1)]
	if m.gen == sc.gen && m.p == p {
		return m.i
	}
	if i, ok := sc.policies[p]; ok {
		*m = policyMemo{gen: sc.gen, i: i, p: p}
		return i
	}
	out.Policies = append(out.Policies, p)
	i := uint32(len(out.Policies))
	sc.policies[p] = i
	*m = policyMemo{gen: sc.gen, i: i, p: p}
	sc.counts = append(sc.counts, 0, 0)
	return i
}

// auditDiffers reports whether a decision's shadow result (audit rules
// enforced) has another final action: the compact answer's audit bit
// (docs/audit.md).
func auditDiffers(d *engine.Decision) bool { return d.Audit != nil }

// DecideCompact answers a packed batch of flows between identities.
func (s decisionService) DecideCompact(ctx context.Context, req *verdictv1.DecideCompactRequest) (*verdictv1.DecideCompactResponse, error) {
	if err := compactRequest(req, ""); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	snap, err := s.snapshotAt(ctx, req.GetMinRevision())
	if err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	out := &verdictv1.DecideCompactResponse{}
	if err := s.decideCompact(ctx, snap, req, out); err != nil {
		return nil, toStatus(ctx, s.log, err)
	}
	return out, nil
}

// DecideCompactStream answers each batch, in order, with its id; a batch that
// fails as a whole gets its error and the stream goes on. A batch whose
// min_revision is ahead of the snapshot waits for it (up to WaitTimeout) and
// holds the batches behind it. The response message is reused from batch to
// batch (Send has encoded it when it returns). The stream ends when the client
// closes or cancels it, or with UNAVAILABLE when the server stops.
func (s decisionService) DecideCompactStream(stream verdictv1.DecisionService_DecideCompactStreamServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	msgs := make(chan *verdictv1.DecideCompactStreamRequest)
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
	batch := &verdictv1.DecideCompactResponse{}
	out := &verdictv1.DecideCompactStreamResponse{}
	for {
		var m *verdictv1.DecideCompactStreamRequest
		select {
		case <-s.stop:
			return toStatus(ctx, s.log, errShuttingDown)
		case <-ctx.Done():
			return toStatus(ctx, s.log, ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return toStatus(ctx, s.log, err)
		case m = <-msgs:
		}
		out.Reset()
		out.Id = m.GetId()
		if err := s.compactBatch(ctx, m, batch); err != nil {
			out.Error = errorEntry(ctx, s.log, err)
		} else {
			out.Batch = batch
		}
		if err := stream.Send(out); err != nil {
			return toStatus(ctx, s.log, err)
		}
	}
}

// compactBatch answers one batch of a stream into out.
func (s decisionService) compactBatch(ctx context.Context, m *verdictv1.DecideCompactStreamRequest, out *verdictv1.DecideCompactResponse) error {
	if fe, ok := undecodable(m); ok {
		return &engine.ValidationError{Errors: []engine.FieldError{fe}}
	}
	r := m.GetBatch()
	if err := compactRequest(r, "batch."); err != nil {
		return err
	}
	snap, err := s.snapshotAt(ctx, r.GetMinRevision())
	if err != nil {
		return err
	}
	return s.decideCompact(ctx, snap, r, out)
}
