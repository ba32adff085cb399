package server

// Identities and the compact decision path (docs/api.md, "The compact path";
// docs/workloads.md, "Identities"): Identify registers tag sets in the
// server's registry; DecideCompact and DecideCompactStream decide flows named
// by identities, packed, answered packed. The path per flow: identity →
// interned tag set (a per-call memo, then the inventory and the registry) →
// the engine's memoised decision → one word; a flow the identity-pair memo
// holds skips the resolution and reads its packed answer (engine.PairAnswer).
// The batch's table of deciding policies is a slice indexed by the policy's
// number in the scope's numbering (engine.PolicyNumbers), the metric counts
// are summed per policy once per batch and handed to the recorder (recorder.go)
// with the batch's other counts. No map is read or built per flow.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/observed"
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
	q := s.registrations.quota(ctx)
	for i, ep := range req.GetEndpoints() {
		out.Results[i] = s.identify(ctx, snap, req.GetMesh(), i, ep, q)
	}
	return out, nil
}

func (s decisionService) identify(ctx context.Context, snap *engine.Snapshot, mesh string, i int, ep *verdictv1.Endpoint, q inventory.Quota) *verdictv1.Identified {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	tags, eep := apiconv.Endpoint(ep)
	if eep == nil {
		eep = &inventory.Endpoint{Tags: tags}
	}
	res, err := snap.ResolveEndpoint(mesh, eep, false, 0, s.identities)
	if err == nil {
		var set *inventory.TagSet
		if set, err = snap.IdentifyWithin(mesh, res.Tags, s.identities, q); err == nil {
			r := apiconv.EndpointResolution(mesh, &res, false)
			r.Identity = set.Identity() // of the tags minus the reserved keys
			return &verdictv1.Identified{Identity: set.Identity(), Resolution: r}
		}
		if errors.Is(err, inventory.ErrIdentityCollision) {
			s.log.ErrorContext(ctx, "identity collision: a tag set refused", "err", err)
		}
	}
	if ve := (*resource.ValidationError)(nil); errors.As(err, &ve) {
		err = ve.Prefixed(fmt.Sprintf("endpoints[%d]", i))
	}
	return &verdictv1.Identified{Error: errorEntry(ctx, s.log, err)}
}

// compactScratch is the working memory of one compact batch, pooled.
type compactScratch struct {
	gen uint32
	ids [compactIDMemo]idMemo // identity → resolution, for this batch
	// byNumber is the batch's table of deciding policies, indexed by their
	// number in the scope's engine.PolicyNumbers: valid when its gen is the
	// batch's.
	byNumber []policySlot
	numbers  []uint32                // out.Policies[i]'s number
	ents     []*engine.PairEntry     // the pair memo's entry answering each flow, or nil (DecideIDsN)
	observed []observed.IdentityFlow // the batch's flows for the observed-flows table
	tallies  []observed.TallyFlow    // its memo entries to register with the table
	// cells are the per-policy metric cells by number, for the numbering
	// and the counters they were found in (kept from batch to batch).
	cellsOf struct {
		nums   *engine.PolicyNumbers
		counts *policyCounts
	}
	cells []*policyCell
}

const compactIDMemo = 1024 // a power of 2

// policySlot is a deciding policy's place in one batch's answer: its index in
// out.Policies plus one, and its decisions so far by final action.
type policySlot struct {
	gen uint32
	i   uint32
	n   [2]uint32 // ALLOW, DENY
}

type idMemo struct {
	gen  uint32
	id   uint64
	set  *inventory.TagSet
	code verdictv1.CompactCode // for the source; the destination's is code+1
}

var compactPool = sync.Pool{New: func() any { return &compactScratch{} }}

// resolve returns the tag set of identity id, or the code of why it has none
// (as a source); an error only for the batch as a whole.
func (sc *compactScratch) resolve(s decisionService, ctx context.Context, scope *engine.PairScope, id uint64) (*inventory.TagSet, verdictv1.CompactCode, error) {
	m := &sc.ids[(id^id>>32)&(compactIDMemo-1)]
	if m.gen == sc.gen && m.id == id {
		return m.set, m.code, nil
	}
	set, err := scope.Lookup(id)
	code := verdictv1.CompactCode_COMPACT_CODE_UNSPECIFIED
	switch {
	case err == nil:
	case errors.Is(err, inventory.ErrIdentityNotFound):
		code = verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE
	case errors.Is(err, inventory.ErrIdentityCollision):
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
		return &resource.ValidationError{Errors: []resource.FieldError{fe}}
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
		clear(sc.byNumber)
		sc.gen = 1
	}
	sc.numbers = sc.numbers[:0]
	mesh, typ := r.GetMesh(), r.GetType()
	// The mesh, the type and the registry's part for the mesh, once per batch.
	scope, err := snap.PairScope(mesh, typ, s.identities)
	if err != nil {
		return err
	}
	nums := scope.Policies()
	out.Revision = snap.Revision()
	out.Policies = out.Policies[:0]
	srcs, dsts, pps := r.GetSourceIds(), r.GetDestinationIds(), r.GetPortProtocols()
	answers := out.Answers[:0]
	if cap(answers) < len(srcs) {
		answers = make([]uint32, 0, len(srcs))
	}
	var t tally // the batch's counts, added once, below
	logging := s.record.log != nil
	// A flow the pair memo answered is counted in its entry (Seen), which is
	// registered with the observed-flows table on its first count since the
	// table last took it; the batch's other flows are counted there at its
	// end, all at once, through a stripe held for that long (observe.go).
	observing := s.record.observed != nil && len(srcs) > 0
	sc.observed, sc.tallies = sc.observed[:0], sc.tallies[:0]
	defer clear(sc.observed) // no tag set kept alive by the pool
	defer clear(sc.tallies)
	// A flow the pair memo holds, its identities resolving as when it was
	// stored, is answered without resolving them: its packed answer alone,
	// no Decision read. The whole batch is looked up first.
	if cap(sc.ents) < 2*len(srcs) {
		sc.ents = make([]*engine.PairEntry, 2*len(srcs))
	}
	ents := sc.ents[:2*len(srcs)]
	defer clear(ents) // no entry kept alive by the pool
	scope.DecideIDsN(srcs, dsts, pps, ents)
	for i := range srcs {
		port, proto := pps[i]&0xffff, resource.Protocol(pps[i]>>16)
		pe := ents[i]
		var a engine.PairAnswer
		var d *engine.Decision
		var src, dst *inventory.TagSet
		memo := pe != nil
		if memo {
			a = pe.Answer()
		} else {
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
			if code == 0 && proto > resource.ICMP {
				code = verdictv1.CompactCode_COMPACT_CODE_INVALID_PORT_PROTOCOL
			}
			if code != 0 {
				answers = append(answers, uint32(code)<<compactCodeShift)
				continue
			}
			a, d, memo = scope.Answer(src, dst, proto, port) // shared with the memo: read only
		}
		t.memo[b2i(!memo)]++
		n := a.Policy()
		if int(n) >= len(sc.byNumber) {
			sc.byNumber = append(sc.byNumber, make([]policySlot, int(n)+1-len(sc.byNumber))...)
		}
		p := &sc.byNumber[n]
		if p.gen != sc.gen {
			out.Policies = append(out.Policies, nums.Name(n))
			sc.numbers = append(sc.numbers, n)
			*p = policySlot{gen: sc.gen, i: uint32(len(out.Policies))}
		}
		deny := a.Deny()
		p.n[b2i(deny)]++
		w := uint32(compactAllow)
		if deny {
			w = compactDeny
		}
		w |= p.i << compactPolicyShift
		if a.AuditDiffers() { // the shadow result has another final action (docs/audit.md)
			w |= compactAudit
			t.audits[b2i(a.AuditDeny())]++
		}
		answers = append(answers, w)
		switch {
		case !observing:
		case pe != nil:
			if pe.Seen() {
				src, dst := pe.Sets()
				sc.tallies = append(sc.tallies, observed.TallyFlow{C: pe, Src: src, Dst: dst, PP: pps[i], Policy: p.i - 1, Deny: deny})
			}
		default:
			sc.observed = append(sc.observed, observed.IdentityFlow{Src: src, Dst: dst, PP: pps[i], Policy: p.i - 1, Deny: deny})
		}
		if logging && s.record.log.Wants(deny, a.AuditDiffers()) {
			if d == nil {
				d = pe.Decision()
				src, dst = pe.Sets()
			}
			s.logCompact(ctx, &t, mesh, typ, src, dst, proto, port, d, out.Revision)
		}
	}
	out.Answers = answers
	if observing && len(sc.observed)+len(sc.tallies) > 0 {
		ob := s.record.observed.Batch(mesh, typ, srcs[0])
		ob.IdentitiesN(sc.observed, out.Policies, out.Revision)
		ob.TallyN(sc.tallies, out.Policies, out.Revision)
		ob.Done()
	}
	// The counts by policy, from the batch's table; the others from t.
	for i, n := range sc.numbers {
		p := &sc.byNumber[n]
		t.n[0], t.n[1] = t.n[0]+int64(p.n[0]), t.n[1]+int64(p.n[1])
		c := sc.cell(s.record.byPolicy, nums, n, out.Policies[i])
		for act, k := range p.n {
			if k > 0 {
				c.n[act].Add(int64(k))
			}
		}
	}
	s.record.done(ctx, &t)
	return nil
}

// cell is the metric cell of policy number n (named name) in nums, found in
// counts once per numbering: a policy's cell never changes (policyCounts.cell).
func (sc *compactScratch) cell(counts *policyCounts, nums *engine.PolicyNumbers, n uint32, name string) *policyCell {
	if sc.cellsOf.nums != nums || sc.cellsOf.counts != counts {
		sc.cellsOf.nums, sc.cellsOf.counts = nums, counts
		clear(sc.cells)
	}
	if int(n) >= len(sc.cells) {
		sc.cells = append(sc.cells, make([]*policyCell, int(n)+1-len(sc.cells))...)
	}
	c := sc.cells[n]
	if c == nil {
		c = counts.cell(name)
		sc.cells[n] = c
	}
	return c
}

// logCompact hands a compact decision (shared with the memo: read only) to
// the recorder's log, as the decision of a request naming the identities
// given, resolved to the tags they stand for, at revision rev.
func (s decisionService) logCompact(ctx context.Context, t *tally, mesh, typ string, src, dst *inventory.TagSet, proto resource.Protocol,
	port uint32, d *engine.Decision, rev int64) {
	er := engine.Request{Mesh: mesh, Type: typ, Protocol: proto, Port: port,
		SourceEndpoint: &inventory.Endpoint{Identity: src.Identity()}, DestinationEndpoint: &inventory.Endpoint{Identity: dst.Identity()}}
	resolved := func(t *inventory.TagSet) inventory.EndpointResolution {
		return inventory.EndpointResolution{Form: inventory.FormIdentity, ResolvedAs: inventory.AsIdentity, Identity: t.Identity(), Tags: t.Tags()}
	}
	dd := *d
	dd.Revision, dd.SourceResolution, dd.DestinationResolution = rev, resolved(src), resolved(dst)
	s.record.logged(ctx, t, &er, &dd, 0)
}

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
// min_revision is ahead of the snapshot waits for it (up to WaitTimeout,
// whatever the stream's deadline: messageAt) and holds the batches behind
// it. The response message is reused from batch to batch (Send has encoded
// it when it returns), and so are the requests, with their arrays (nothing
// keeps a request past its answer). The stream ends when the client closes
// or cancels it, or with UNAVAILABLE when the server stops.
func (s decisionService) DecideCompactStream(stream verdictv1.DecisionService_DecideCompactStreamServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	// Two requests: one answered, the next received meanwhile (so never empty).
	ring := make(chan *verdictv1.DecideCompactStreamRequest, 2)
	ring <- new(verdictv1.DecideCompactStreamRequest)
	ring <- new(verdictv1.DecideCompactStreamRequest)
	msgs, recvErr := receive(ctx, func() (*verdictv1.DecideCompactStreamRequest, error) {
		m := <-ring
		return m, stream.RecvMsg(m)
	})
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
		ring <- m
	}
}

// compactBatch answers one batch of a stream into out, checked against the
// method's row.
func (s decisionService) compactBatch(ctx context.Context, m *verdictv1.DecideCompactStreamRequest, out *verdictv1.DecideCompactResponse) error {
	if err := checkRequest(ctx, m); err != nil {
		return err
	}
	r := m.GetBatch()
	snap, err := s.messageAt(ctx, r.GetMinRevision())
	if err != nil {
		return err
	}
	adm, err := admitMessage(ctx)
	if err != nil {
		return err
	}
	defer adm.releaseMessage()
	return s.decideCompact(ctx, snap, r, out)
}
