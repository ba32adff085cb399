package server

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func wl(name string, tags map[string]string, addrs ...string) *verdictv1.Resource {
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Workload{Workload: &verdictv1.Workload{
		Name: name, Tags: tags, Addresses: addrs}}}
}

func app(a string) map[string]string { return map[string]string{"app": a} }

type rulesStream = grpc.ServerStreamingClient[verdictv1.WatchRulesResponse]

// apply writes resources and fails the test on an error.
func (h *harness) apply(t *testing.T, ctx context.Context, rs ...*verdictv1.Resource) {
	t.Helper()
	resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: rs})
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot may lag the write: wait until it holds it, so that a
	// stream opened next sees the resources written.
	if _, err := h.pol.Status(ctx, &verdictv1.StatusRequest{MinRevision: resp.GetRevision()}); err != nil {
		t.Fatal(err)
	}
}

// setNamed finds a set of a RULES message.
func setNamed(m *verdictv1.WatchRulesResponse, name string) *verdictv1.AddressSet {
	for _, s := range m.GetSets() {
		if s.GetName() == name {
			return s
		}
	}
	return nil
}

func wantKind(t *testing.T, m *verdictv1.WatchRulesResponse, k verdictv1.WatchRulesKind) {
	t.Helper()
	if m.GetKind() != k {
		t.Fatalf("kind %v, want %v: %v", m.GetKind(), k, m)
	}
}

// An agent-like client watches a workload by name with address sets: the
// rules name sets holding the peers' addresses; a workload added to a peer
// selector arrives as a delta-only message, while a stream whose sets it does
// not touch is sent nothing (its next message is the delta of a later,
// barrier write); a policy change sends the rules in full.
func TestWatchRulesAddressSets(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Token = "s3cret" })
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer s3cret")
	h.apply(t, ctx, wl("web-1", app("web"), "10.0.0.1"), wl("backend-1", app("backend"), "10.0.1.1"))

	agent, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{Workload: "backend-1"}, AddressSets: true})
	if err != nil {
		t.Fatal(err)
	}
	first := recvN(t, agent, 1)[0]
	wantKind(t, first, verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES)
	in := first.GetInbound().GetRules()
	if len(in) != 1 || in[0].GetPolicy() != "web-to-backend" || len(in[0].GetPeerSets()) != 1 || len(in[0].GetPeerCidrs()) != 0 {
		t.Fatalf("inbound %v", first.GetInbound())
	}
	webSet := in[0].GetPeerSets()[0]
	idWeb := resource.Identity("default", app("web"))
	if s := setNamed(first, webSet); s == nil || !slices.Equal(s.GetAddresses(), []string{"10.0.0.1"}) || !slices.Equal(s.GetIdentities(), []uint64{idWeb}) {
		t.Fatalf("set %s: %v", webSet, first.GetSets())
	}
	if r := first.GetWorkload(); r.GetResolvedAs() != verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD || r.GetWorkload() != "backend-1" ||
		!slices.Equal(first.GetWorkloadAddresses(), []string{"10.0.1.1"}) {
		t.Fatalf("workload %v %v", r, first.GetWorkloadAddresses())
	}
	// Every rule's set is in the message; the outbound deny-db rule names the db set.
	out := first.GetOutbound().GetRules()
	if len(out) != 1 || out[0].GetPolicy() != "deny-db" || setNamed(first, out[0].GetPeerSets()[0]) == nil {
		t.Fatalf("outbound %v sets %v", first.GetOutbound(), first.GetSets())
	}
	dbSet := out[0].GetPeerSets()[0]

	// A stream of tags {app: other}: its only set is the db set.
	other, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tags("app", "other"), AddressSets: true})
	if err != nil {
		t.Fatal(err)
	}
	o1 := recvN(t, other, 1)[0]
	if got := o1.GetOutbound().GetRules(); len(got) != 1 || !slices.Equal(got[0].GetPeerSets(), []string{dbSet}) {
		t.Fatalf("other: %v", o1)
	}
	if n := h.srv.hub.Stats().Sets; n != 2 { // web and db: the db set shared by both streams
		t.Fatalf("%d sets in use, want 2", n)
	}

	// A second web workload: a delta for the agent (no new identity), nothing for other.
	h.apply(t, ctx, wl("web-2", app("web"), "10.0.0.2"))
	d := recvN(t, agent, 1)[0]
	wantKind(t, d, verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS)
	if d.GetInbound() != nil || len(d.GetSets()) != 0 || len(d.GetSetDeltas()) != 1 {
		t.Fatalf("delta message %v", d)
	}
	if sd := d.GetSetDeltas()[0]; sd.GetName() != webSet || !slices.Equal(sd.GetAdded(), []string{"10.0.0.2"}) ||
		len(sd.GetRemoved())+len(sd.GetIdentitiesAdded())+len(sd.GetIdentitiesRemoved()) != 0 {
		t.Fatalf("delta %v", sd)
	}
	// The barrier: a db workload touches both streams' db set.
	h.apply(t, ctx, wl("db-1", app("db"), "10.0.2.1"))
	idDB := resource.Identity("default", app("db"))
	for name, s := range map[string]rulesStream{"agent": agent, "other": other} {
		m := recvN(t, s, 1)[0]
		wantKind(t, m, verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS)
		want := []*verdictv1.AddressSetDelta{{Name: dbSet, Added: []string{"10.0.2.1"}, IdentitiesAdded: []uint64{idDB}}}
		if len(m.GetSetDeltas()) != 1 || !reflect.DeepEqual(m.GetSetDeltas()[0].GetAdded(), want[0].Added) ||
			m.GetSetDeltas()[0].GetName() != dbSet || !slices.Equal(m.GetSetDeltas()[0].GetIdentitiesAdded(), want[0].IdentitiesAdded) {
			t.Fatalf("%s: want only the db delta (nothing for web-2), got %v", name, m)
		}
	}

	// A policy change: the rules in full, every named set with it.
	h.apply(t, ctx, sdPolicy("deny-api", "api", "backend", "DENY"))
	full := recvN(t, agent, 1)[0]
	wantKind(t, full, verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES)
	if len(full.GetInbound().GetRules()) != 2 || len(full.GetSets()) != 3 {
		t.Fatalf("after the policy change: %v", full)
	}
	if n := h.srv.hub.Stats().Sets; n != 3 {
		t.Fatalf("%d sets in use, want 3", n)
	}
	if s := setNamed(full, webSet); !slices.Equal(s.GetAddresses(), []string{"10.0.0.1", "10.0.0.2"}) {
		t.Fatalf("web set %v", s)
	}
	// The same selector has the same set name in every stream and revision.
	if got := full.GetOutbound().GetRules()[0].GetPeerSets()[0]; got != dbSet {
		t.Fatalf("db set renamed %s → %s", dbSet, got)
	}
	// Removing web-1: a delta that removes its address, not its identity (web-2 has it).
	if _, err := h.pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{"default/workloads/web-1"}}); err != nil {
		t.Fatal(err)
	}
	d = recvN(t, agent, 1)[0]
	if sd := d.GetSetDeltas(); len(sd) != 1 || !slices.Equal(sd[0].GetRemoved(), []string{"10.0.0.1"}) || len(sd[0].GetIdentitiesRemoved()) != 0 {
		t.Fatalf("delete: %v", d)
	}
}

// With address sets WatchRules exposes the inventory: refused without
// credentials, exactly as WatchResources; without them it stays open.
func TestWatchRulesAddressSetsNeedAuthorization(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Token = "s3cret" })
	tests := []struct {
		name string
		ctx  context.Context
		sets bool
		code codes.Code
	}{
		{"address sets, no credentials", ctxT(t), true, codes.Unauthenticated},
		{"address sets, wrong token", metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer nope"), true, codes.Unauthenticated},
		{"address sets, token", metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer s3cret"), true, codes.OK},
		{"rules only, no credentials", ctxT(t), false, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := h.wat.WatchRules(tc.ctx, &verdictv1.WatchRulesRequest{Workload: tags("app", "web"), AddressSets: tc.sets})
			if err == nil {
				_, err = s.Recv()
			}
			wantCode(t, err, tc.code)
		})
	}
}

// A workload given by address is re-resolved: external while no workload
// holds it, then the workload that does, then its new tags.
func TestWatchRulesByAddressReresolved(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{Address: "10.0.3.1"}, AddressSets: true})
	if err != nil {
		t.Fatal(err)
	}
	m := recvN(t, s, 1)[0]
	if m.GetWorkload().GetResolvedAs() != verdictv1.ResolvedAs_RESOLVED_AS_EXTERNAL || len(m.GetInbound().GetRules()) != 0 {
		t.Fatalf("external: %v", m)
	}
	h.apply(t, ctx, wl("x-1", app("backend"), "10.0.3.1"))
	m = recvN(t, s, 1)[0]
	wantKind(t, m, verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES)
	if m.GetWorkload().GetWorkload() != "x-1" || len(m.GetInbound().GetRules()) != 1 || m.GetInbound().GetRules()[0].GetPolicy() != "web-to-backend" {
		t.Fatalf("x-1 as backend: %v", m)
	}
	h.apply(t, ctx, wl("x-1", app("db"), "10.0.3.1"))
	m = recvN(t, s, 1)[0]
	wantKind(t, m, verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES)
	if in := m.GetInbound().GetRules(); len(in) != 1 || in[0].GetPolicy() != "deny-db" ||
		m.GetWorkload().GetIdentity() != resource.Identity("default", app("db")) {
		t.Fatalf("x-1 as db: %v", m)
	}
	// An unknown workload name is NotFound; a principal is refused.
	for _, tc := range []struct {
		ep   *verdictv1.Endpoint
		code codes.Code
	}{
		{&verdictv1.Endpoint{Workload: "nope"}, codes.NotFound},
		{&verdictv1.Endpoint{Principal: "spiffe://default/x"}, codes.InvalidArgument},
		{&verdictv1.Endpoint{Address: "not-an-ip"}, codes.InvalidArgument},
	} {
		s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: tc.ep})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, err, tc.code)
	}
}

// TestWorkloadPutResolvesOnlyTheGroupsItTouches: after a workload put with
// no policy change, a WatchRules group given by name or address is resolved
// again only when the put can change its resolution — its workload, or one
// holding its address before or after — so 1k workload puts/s do not cost a
// resolution per watched workload each (it was every name and address group
// of the mesh, per put). Streams still follow their workload.
func TestWorkloadPutResolvesOnlyTheGroupsItTouches(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	h.apply(t, ctx, wl("a", app("backend"), "10.0.4.1"), wl("b", app("backend"), "10.0.4.2"), wl("c", app("web"), "10.0.4.3"))
	open := func(ep *verdictv1.Endpoint) rulesStream {
		s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: ep})
		if err != nil {
			t.Fatal(err)
		}
		recvN(t, s, 1)
		return s
	}
	byName := open(&verdictv1.Endpoint{Workload: "a"})
	open(&verdictv1.Endpoint{Workload: "b"})
	byAddr := open(&verdictv1.Endpoint{Address: "10.0.4.1"})
	external := open(&verdictv1.Endpoint{Address: "10.0.4.9"})
	open(&verdictv1.Endpoint{Tags: app("backend")})
	put := func(what string, r *verdictv1.Resource, want int) {
		t.Helper()
		before := h.srv.hub.Stats().Reresolved
		h.apply(t, ctx, r)
		rev := h.b.Snapshot().Revision()
		for h.srv.hub.Stats().Revision < rev { // the hub follows the syncer
			time.Sleep(time.Millisecond)
		}
		if got := h.srv.hub.Stats().Reresolved - before; got != want {
			t.Errorf("%s: %d groups resolved again, want %d", what, got, want)
		}
	}
	put("a put of c, held by no group", wl("c", app("web"), "10.0.4.3", "10.0.4.4"), 0)
	put("a put of a, watched by name and by address", wl("a", app("db"), "10.0.4.1"), 2)
	for _, s := range []rulesStream{byName, byAddr} {
		if m := recvN(t, s, 1)[0]; len(m.GetInbound().GetRules()) != 1 || m.GetInbound().GetRules()[0].GetPolicy() != "deny-db" {
			t.Fatalf("a as db: %v", m)
		}
	}
	put("a new workload taking a watched external address", wl("d", app("db"), "10.0.4.9"), 1)
	if m := recvN(t, external, 1)[0]; m.GetWorkload().GetWorkload() != "d" {
		t.Fatalf("10.0.4.9 as d: %v", m)
	}
	put("a put of c again, held by no group", wl("c", app("web"), "10.0.4.3"), 0)
}
