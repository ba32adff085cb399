package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/codes"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// compactAnswer unpacks one answer word.
type compactAnswer struct {
	action verdictv1.Action
	audit  bool
	code   verdictv1.CompactCode
	policy string
}

func unpack(t testing.TB, resp *verdictv1.DecideCompactResponse) []compactAnswer {
	t.Helper()
	out := make([]compactAnswer, len(resp.GetAnswers()))
	for i, a := range resp.GetAnswers() {
		out[i] = compactAnswer{action: verdictv1.Action(a & 3), audit: a&4 != 0, code: verdictv1.CompactCode(a >> 3 & 15)}
		if pi := a >> 8; pi > 0 {
			if int(pi) > len(resp.GetPolicies()) {
				t.Fatalf("answer %d names policy %d of %d", i, pi, len(resp.GetPolicies()))
			}
			out[i].policy = resp.GetPolicies()[pi-1]
		}
	}
	return out
}

func packPP(proto resource.Protocol, port uint32) uint32 { return port | uint32(proto)<<16 }

func ownTags(tags map[string]string) map[string]string {
	out := maps.Clone(tags)
	delete(out, resource.IPTag)
	delete(out, resource.PrincipalTag)
	return out
}

func applyAll(t testing.TB, be *backend, rs []resource.Resource) {
	t.Helper()
	for i := 0; i < len(rs); i += store.MaxOps {
		ops := []store.Op{}
		for _, r := range rs[i:min(i+store.MaxOps, len(rs))] {
			ops = append(ops, store.Op{Key: r.Key(), Resource: r})
		}
		if _, err := be.Apply(context.Background(), ops); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCompactMatchesTagForm is the differential test of issue 13 item 4: on
// generated policy sets (scopes, wildcards, expressions), flows named by
// identities through DecideCompact and DecideCompactStream get the action and
// deciding policy DecideBatch gives their tags.
func TestCompactMatchesTagForm(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			set := policygen.Generate(policygen.Config{Seed: seed, Policies: 300, Scopes: int(seed % 3 * 4), WildcardPercent: 30})
			be := newBackend()
			applyAll(t, be, set.Resources)
			h := start(t, be, nil)
			ctx := ctxT(t)
			flows := set.Flows(seed, 400)
			// Identify every endpoint (one call, up to 1000 endpoints).
			var eps []*verdictv1.Endpoint
			for _, f := range flows {
				eps = append(eps, &verdictv1.Endpoint{Tags: f.Source}, &verdictv1.Endpoint{Tags: f.Destination})
			}
			ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: eps})
			if err != nil {
				t.Fatal(err)
			}
			creq := &verdictv1.DecideCompactRequest{}
			breq := &verdictv1.DecideBatchRequest{}
			for i, f := range flows {
				src, dst := ids.GetResults()[2*i], ids.GetResults()[2*i+1]
				if src.GetError() != nil || dst.GetError() != nil {
					t.Fatalf("Identify: %v %v", src.GetError(), dst.GetError())
				}
				if want := resource.Identity("default", f.Source); src.GetIdentity() != want {
					t.Fatalf("identity %d, resource.Identity %d", src.GetIdentity(), want)
				}
				creq.SourceIds = append(creq.SourceIds, src.GetIdentity())
				creq.DestinationIds = append(creq.DestinationIds, dst.GetIdentity())
				creq.PortProtocols = append(creq.PortProtocols, packPP(f.Protocol, f.Port))
				breq.Requests = append(breq.Requests, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Tags: ownTags(f.Source)},
					Destination: &verdictv1.Endpoint{Tags: ownTags(f.Destination)}, Protocol: f.Protocol.String(), Port: f.Port})
			}
			want, err := h.dec.DecideBatch(ctx, breq)
			if err != nil {
				t.Fatal(err)
			}
			check := func(form string, resp *verdictv1.DecideCompactResponse) {
				t.Helper()
				got := unpack(t, resp)
				if len(got) != len(flows) {
					t.Fatalf("%s: %d answers for %d flows", form, len(got), len(flows))
				}
				if resp.GetRevision() != want.GetRevision() {
					t.Errorf("%s: revision %d, the tag form's %d", form, resp.GetRevision(), want.GetRevision())
				}
				for i, g := range got {
					w := want.GetResults()[i].GetResponse()
					if g.code != 0 || g.action != w.GetAction() || g.policy != w.GetPolicy() || g.audit != (w.GetAudit() != nil) {
						t.Fatalf("%s flow %d (%v): compact %+v, tags %v %q", form, i, flows[i], g, w.GetAction(), w.GetPolicy())
					}
				}
			}
			for round := 0; round < 2; round++ { // the second round from the memo
				resp, err := h.dec.DecideCompact(ctx, creq)
				if err != nil {
					t.Fatal(err)
				}
				check("DecideCompact", resp)
			}
			stream, err := h.dec.DecideCompactStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for id := uint64(1); id <= 2; id++ {
				if err := stream.Send(&verdictv1.DecideCompactStreamRequest{Id: id, Batch: creq}); err != nil {
					t.Fatal(err)
				}
			}
			for id := uint64(1); id <= 2; id++ {
				m, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if m.GetId() != id || m.GetError() != nil {
					t.Fatalf("stream answer %d: %+v", id, m)
				}
				check("DecideCompactStream", m.GetBatch())
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after CloseSend: %v", err)
			}
		})
	}
}

// TestCompactErrors: an unknown identity or a bad port/protocol is a code in
// its flow's answer, never an action; a batch that is wrong as a whole fails
// the call (unary) or gets an error message and the stream goes on.
func TestCompactErrors(t *testing.T) {
	t.Parallel()
	be := newBackend(decodeYAML(t, testPolicies+`---
kind: Workload
name: web-1
tags: {app: web}
addresses: [10.0.0.1]
`)...)
	h := start(t, be, nil)
	ctx := ctxT(t)
	web := resource.Identity("default", map[string]string{"app": "web"}) // a workload's own: resolves unregistered
	ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{
		tags("app", "backend", "ip", "10.9.9.9"), tags("app", "db"), tags("ip", "1.2.3.4"), {Address: "10.0.0.1"}}})
	if err != nil {
		t.Fatal(err)
	}
	backend, db := ids.GetResults()[0].GetIdentity(), ids.GetResults()[1].GetIdentity()
	if backend != resource.Identity("default", map[string]string{"app": "backend"}) {
		t.Errorf("the identity of {app: backend, ip: ...} is not that of {app: backend}: reserved keys count")
	}
	if got := ids.GetResults()[2].GetIdentity(); got != resource.Identity("default", nil) {
		t.Errorf("the identity of {ip: ...} is not that of the empty set")
	}
	// An address: the workload's tags, without ip: web-1's own identity.
	if got := ids.GetResults()[3]; got.GetIdentity() != web || got.GetResolution().GetResolvedAs() != verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD ||
		got.GetResolution().GetWorkload() != "web-1" {
		t.Errorf("an address endpoint: %v", got)
	}
	bad, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{
		{Workload: "nope"}, {Address: "not-an-ip"}, {Principal: "spiffe://default/web"}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := bad.GetResults()[0].GetError(); e.GetCode() != "NotFound" {
		t.Errorf("an unknown workload: %v", bad.GetResults()[0])
	}
	if e := bad.GetResults()[1].GetError(); e.GetCode() != "InvalidArgument" || len(e.GetFieldViolations()) == 0 ||
		e.GetFieldViolations()[0].GetField() != "endpoints[1].address" {
		t.Errorf("a bad address: %v", bad.GetResults()[1])
	}
	// Kuma's spiffe form: {kuma.io/service: web, principal: ...} → the identity of {kuma.io/service: web}.
	if got := bad.GetResults()[2].GetIdentity(); got != resource.Identity("default", map[string]string{"kuma.io/service": "web"}) {
		t.Errorf("a principal endpoint: %v", bad.GetResults()[2])
	}
	const unknown = 12345
	resp, err := h.dec.DecideCompact(ctx, &verdictv1.DecideCompactRequest{
		SourceIds:      []uint64{web, unknown, web, web, web},
		DestinationIds: []uint64{backend, backend, unknown, db, backend},
		PortProtocols:  []uint32{packPP(resource.TCP, 8080), packPP(resource.TCP, 8080), 0, 0, 9<<16 | 80},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := unpack(t, resp)
	want := []compactAnswer{
		{action: verdictv1.Action_ACTION_ALLOW, policy: "web-to-backend"},
		{code: verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE},
		{code: verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_DESTINATION},
		{action: verdictv1.Action_ACTION_DENY, policy: "deny-db"},
		{code: verdictv1.CompactCode_COMPACT_CODE_INVALID_PORT_PROTOCOL},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("flow %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, tc := range []struct {
		name string
		req  *verdictv1.DecideCompactRequest
		code codes.Code
	}{
		{"unequal lists", &verdictv1.DecideCompactRequest{SourceIds: []uint64{web}, DestinationIds: []uint64{web}}, codes.InvalidArgument},
		{"too many flows", &verdictv1.DecideCompactRequest{SourceIds: make([]uint64, MaxBatch+1),
			DestinationIds: make([]uint64, MaxBatch+1), PortProtocols: make([]uint32, MaxBatch+1)}, codes.InvalidArgument},
		{"unknown mesh", &verdictv1.DecideCompactRequest{Mesh: "nope"}, codes.NotFound},
		{"unknown type", &verdictv1.DecideCompactRequest{Type: "TraficPermission"}, codes.NotFound},
		{"bad mesh name", &verdictv1.DecideCompactRequest{Mesh: "a/b"}, codes.InvalidArgument},
	} {
		_, err := h.dec.DecideCompact(ctx, tc.req)
		wantCode(t, err, tc.code)
	}
	stream, err := h.dec.DecideCompactStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*verdictv1.DecideCompactStreamRequest{
		{Id: 1, Batch: &verdictv1.DecideCompactRequest{Mesh: "nope"}},
		{Id: 2, Batch: &verdictv1.DecideCompactRequest{SourceIds: []uint64{web}, DestinationIds: []uint64{db}, PortProtocols: []uint32{0}}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	first, err := stream.Recv()
	if err != nil || first.GetId() != 1 || first.GetError().GetCode() != "NotFound" || first.GetBatch() != nil {
		t.Fatalf("a failing batch: %+v %v", first, err)
	}
	second, err := stream.Recv()
	if err != nil || second.GetId() != 2 || second.GetError() != nil {
		t.Fatalf("the stream after a failing batch: %+v %v", second, err)
	}
	if a := unpack(t, second.GetBatch()); a[0].action != verdictv1.Action_ACTION_DENY || a[0].policy != "deny-db" {
		t.Errorf("answer %+v", a[0])
	}
}

// TestIdentifyRegistryBounds: the server's registry keeps to its configured
// bound (engine tests cover eviction order and collisions); Identify's
// request limits and unknown mesh.
func TestIdentifyRegistryBounds(t *testing.T) {
	t.Parallel()
	be := newBackend(decodeYAML(t, testPolicies)...)
	h := start(t, be, func(c *Config) { c.IdentityMaxSets = 3 })
	ctx := ctxT(t)
	var eps []*verdictv1.Endpoint
	for i := 0; i < 10; i++ {
		eps = append(eps, tags("app", fmt.Sprint(i)))
	}
	if _, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: eps}); err != nil {
		t.Fatal(err)
	}
	if st := h.srv.identities.Stats(); st.Sets != 3 || st.Evicted != 7 {
		t.Fatalf("registry %+v, want 3 sets and 7 evicted", st)
	}
	_, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: make([]*verdictv1.Endpoint, MaxBatch+1)})
	wantCode(t, err, codes.InvalidArgument)
	_, err = h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Mesh: "nope", Endpoints: eps[:1]})
	wantCode(t, err, codes.NotFound)
}

// TestCompactAuditBit: the audit bit is set exactly when Decide's answer has
// an audit result (the shadow decision differs), which the client fetches by
// reference with Decide.
func TestCompactAuditBit(t *testing.T) {
	t.Parallel()
	be := newBackend(decodeYAML(t, testPolicies+`---
kind: Policy
name: audit-web-backend
mode: Audit
priority: -1
sources: [{match: {app: web}}]
destinations: [{match: {app: backend}}]
action: DENY
`)...)
	h := start(t, be, nil)
	ctx := ctxT(t)
	ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{
		tags("app", "web"), tags("app", "backend"), tags("app", "db")}})
	if err != nil {
		t.Fatal(err)
	}
	web, backend, db := ids.GetResults()[0].GetIdentity(), ids.GetResults()[1].GetIdentity(), ids.GetResults()[2].GetIdentity()
	resp, err := h.dec.DecideCompact(ctx, &verdictv1.DecideCompactRequest{SourceIds: []uint64{web, web},
		DestinationIds: []uint64{backend, db}, PortProtocols: []uint32{packPP(resource.TCP, 8080), packPP(resource.TCP, 8080)}})
	if err != nil {
		t.Fatal(err)
	}
	got := unpack(t, resp)
	for i, dst := range []*verdictv1.Endpoint{tags("app", "backend"), tags("app", "db")} {
		w, err := h.dec.Decide(ctx, &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: dst, Protocol: "TCP", Port: 8080})
		if err != nil {
			t.Fatal(err)
		}
		if got[i].audit != (w.GetAudit() != nil) || got[i].action != w.GetAction() {
			t.Errorf("flow %d: compact %+v, Decide %v audit %v", i, got[i], w.GetAction(), w.GetAudit())
		}
	}
	if !got[0].audit || got[1].audit {
		t.Errorf("audit bits %v %v, want true false", got[0].audit, got[1].audit)
	}
}

// TestCompactDecisionLog: a compact decision the log's filter wants is
// recorded with the identities given and the tags they stand for.
func TestCompactDecisionLog(t *testing.T) {
	h, buf := startLogged(t, decisionlog.Denies, "")
	ctx := ctxT(t)
	ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{tags("app", "web"), tags("app", "db")}})
	if err != nil {
		t.Fatal(err)
	}
	web, db := ids.GetResults()[0].GetIdentity(), ids.GetResults()[1].GetIdentity()
	if _, err := h.dec.DecideCompact(ctx, &verdictv1.DecideCompactRequest{SourceIds: []uint64{web}, DestinationIds: []uint64{db},
		PortProtocols: []uint32{0}}); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for deadline := time.Now().Add(time.Minute); len(lines) < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		lines = buf.lines()
	}
	if len(lines) != 1 {
		t.Fatalf("%d records", len(lines))
	}
	r := parseRecord(t, lines[0])
	if r.Source.Identity != web || r.Source.Tags["app"] != "web" || r.Destination.Identity != db || r.Destination.Tags["app"] != "db" ||
		r.Action != "DENY" || r.Rpc != "DecideCompact" {
		t.Fatalf("record %+v", r)
	}
}

// TestCompactPolicyTableAcrossChanges: a batch's table of deciding policies
// names each policy once and every answer its own policy, when batches on a
// snapshot whose deciding policy was renamed, then removed, alternate with
// batches on the snapshot before (each partition's pair memo still holding
// its entries, one pooled table reused): no policy index or metric cell is
// carried from one policy numbering to another. The counts by policy add up
// to what the answers say.
func TestCompactPolicyTableAcrossChanges(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	set := policygen.Generate(policygen.Config{Seed: 6, Policies: 200, WildcardPercent: 30})
	be := newBackend()
	applyAll(t, be, set.Resources)
	h := start(t, be, func(c *Config) { c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	ctx := ctxT(t)
	flows := set.Flows(6, 500)
	req := &verdictv1.DecideCompactRequest{}
	for _, f := range flows {
		src, err := be.Snapshot().Identify("", f.Source, h.srv.identities)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := be.Snapshot().Identify("", f.Destination, h.srv.identities)
		if err != nil {
			t.Fatal(err)
		}
		req.SourceIds = append(req.SourceIds, src.Identity())
		req.DestinationIds = append(req.DestinationIds, dst.Identity())
		req.PortProtocols = append(req.PortProtocols, packPP(f.Protocol, f.Port))
	}
	// byPolicy is what the tag form of snap decides by policy, "" included.
	want := func(snap *engine.Snapshot) (answers []compactAnswer, byPolicy map[string]int64) {
		byPolicy = map[string]int64{}
		for _, f := range flows {
			d, err := snap.Decide(&engine.Request{Source: ownTags(f.Source), Destination: ownTags(f.Destination), Protocol: f.Protocol, Port: f.Port})
			if err != nil {
				t.Fatal(err)
			}
			answers = append(answers, compactAnswer{action: verdictv1.Action(d.Action), audit: d.Audit != nil, policy: d.Policy})
			byPolicy[d.Policy]++
		}
		return answers, byPolicy
	}
	var counted map[string]int64 // verdict.decisions.by_policy at the last check
	expect := map[string]int64{} // what the batches since added to it
	batch := func(what string, snap *engine.Snapshot) {
		t.Helper()
		wantAnswers, byPolicy := want(snap)
		out := &verdictv1.DecideCompactResponse{}
		if err := h.srv.decision.decideCompact(ctx, snap, req, out); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, p := range out.GetPolicies() {
			if seen[p] {
				t.Fatalf("%s: policy %q twice in the batch's table %q", what, p, out.GetPolicies())
			}
			seen[p] = true
		}
		for i, g := range unpack(t, out) {
			if g != wantAnswers[i] {
				t.Fatalf("%s: flow %d answered %+v, the tag form %+v", what, i, g, wantAnswers[i])
			}
		}
		for p, n := range byPolicy {
			expect[p] += n
		}
	}
	checkCounts := func(what string) {
		t.Helper()
		got := collectInt64Sums(t, reader, "verdict.decisions.by_policy", "policy")
		for p, n := range expect {
			if got[p]-counted[p] != n {
				t.Errorf("%s: %d decisions counted by %q, the answers say %d", what, got[p]-counted[p], p, n)
			}
		}
		counted, expect = got, map[string]int64{}
	}
	checkCounts("before")

	before := be.Snapshot()
	answers, byPolicy := want(before)
	top := ""
	for p, n := range byPolicy { // the policy that decides the most flows
		if p != "" && (top == "" || n > byPolicy[top]) {
			top = p
		}
	}
	var old *resource.Policy
	for _, r := range set.Resources {
		if p, ok := r.(*resource.Policy); ok && p.Name == top {
			old = p
		}
	}
	if old == nil || byPolicy[top] < 2 || len(answers) != len(flows) {
		t.Fatalf("no policy decides two flows (%v): the test's premise is wrong", byPolicy)
	}
	renamedPolicy := *old
	renamedPolicy.Name = top + "-renamed"
	if _, err := be.Apply(ctx, []store.Op{{Key: old.Key()}, {Key: renamedPolicy.Key(), Resource: &renamedPolicy}}); err != nil {
		t.Fatal(err)
	}
	renamed := be.Snapshot()
	if _, err := be.Apply(ctx, []store.Op{{Key: renamedPolicy.Key()}}); err != nil {
		t.Fatal(err)
	}
	removed := be.Snapshot()
	if _, byRenamed := want(renamed); byRenamed[top] != 0 || byRenamed[renamedPolicy.Name] != byPolicy[top] {
		t.Fatalf("after the rename the tag form decides by %v: the test's premise is wrong", byRenamed)
	}

	for round := range 4 { // warm from the second round: pair memo hits
		for _, s := range []struct {
			name string
			snap *engine.Snapshot
		}{{"before", before}, {"renamed", renamed}, {"removed", removed}} {
			batch(fmt.Sprintf("round %d, %s", round, s.name), s.snap)
		}
		checkCounts(fmt.Sprintf("round %d", round))
	}
}
