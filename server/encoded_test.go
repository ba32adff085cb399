package server

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The messages shared by streams are encoded once (encodedMsg) and passed
// through the codec as bytes: what a client decodes is the message the old
// path (gRPC's proto codec on each stream's own message) sent.

// TestEncodedMsgMarshalsAsTheProtoCodec: the codec's bytes of an encodedMsg
// decode to the message, as gRPC's proto codec's bytes of the message do.
func TestEncodedMsgMarshalsAsTheProtoCodec(t *testing.T) {
	t.Parallel()
	c := newRequestCodec()
	msgs := []proto.Message{
		&verdictv1.WatchRulesResponse{Revision: 7, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES,
			Workload:          &verdictv1.EndpointResolution{Workload: "backend-1", ResolvedAs: verdictv1.ResolvedAs_RESOLVED_AS_WORKLOAD, Identity: 9},
			WorkloadAddresses: []string{"10.0.1.1"}, Sets: []*verdictv1.AddressSet{{Name: "s1", Addresses: []string{"10.0.0.1"}, Identities: []uint64{42}}}},
		&verdictv1.WatchRulesResponse{Revision: 8, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS,
			SetDeltas: []*verdictv1.AddressSetDelta{{Name: "s1", Added: []string{"10.0.0.2"}}}},
		&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT, Revision: 3, Fresh: true,
			Changes: []*verdictv1.ResourceChange{{Key: "default/policies/TrafficPermission/x", Resource: &verdictv1.StoredResource{}}, {Key: "k", Deleted: true}}},
		&verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED, Revision: 3},
		&verdictv1.WatchResourcesResponse{}, // encodes as no bytes
	}
	for i, m := range msgs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			shared, err := c.Marshal(newEncoded(m))
			if err != nil {
				t.Fatal(err)
			}
			own, err := c.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got, want := m.ProtoReflect().New().Interface(), m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(shared.Materialize(), got); err != nil {
				t.Fatal(err)
			}
			if err := proto.Unmarshal(own.Materialize(), want); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) || !proto.Equal(got, m) {
				t.Errorf("shared bytes decode to %v, own to %v", got, want)
			}
			if shared.Len() != own.Len() {
				t.Errorf("%d bytes shared, %d own", shared.Len(), own.Len())
			}
		})
	}
}

// TestSharedStreamsReceiveTheOldMessages: several WatchResources streams from
// revision 0 and several WatchRules streams of one workload decode exactly
// the messages the old path built per stream, and the streams share one
// encoding.
func TestSharedStreamsReceiveTheOldMessages(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) { c.Token = "s3cret" })
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer s3cret")
	var many []*verdictv1.Resource
	for i := range 2*snapshotChunk + 10 { // three SNAPSHOT parts
		many = append(many, wl(fmt.Sprintf("w-%d", i), app(fmt.Sprintf("a%d", i%7)), fmt.Sprintf("10.1.%d.%d", i/250, i%250)))
	}
	for i := 0; i < len(many); i += 100 {
		h.apply(t, ctx, many[i:min(i+100, len(many))]...)
	}
	h.apply(t, ctx, wl("web-1", app("web"), "10.0.0.1"), wl("backend-1", app("backend"), "10.0.1.1"))

	// The old path: the feed's snapshot cut into parts, each stream's own.
	snapshot, rev, _ := h.srv.feed.start(0)
	var old []*verdictv1.WatchResourcesResponse
	for first, changes := true, snapshot; first || len(changes) > 0; first = false {
		n := min(len(changes), snapshotChunk)
		old = append(old, &verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT,
			Revision: rev, Fresh: first, Changes: changes[:n:n]})
		changes = changes[n:]
	}
	old = append(old, &verdictv1.WatchResourcesResponse{Type: verdictv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED, Revision: rev})
	if len(old) < 4 {
		t.Fatalf("%d messages, want 3 parts and SYNCED: the test needs a larger store", len(old))
	}
	for i := range 3 {
		s, err := h.wat.WatchResources(ctx, &verdictv1.WatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := recvN(t, s, len(old))
		for j := range old {
			if !proto.Equal(old[j], got[j]) {
				t.Fatalf("stream %d message %d: received %v, the old path sent %v", i, j, got[j], old[j])
			}
		}
	}
	h.srv.feed.mu.Lock()
	parts, partsRev := h.srv.feed.parts, h.srv.feed.partsRev
	h.srv.feed.mu.Unlock()
	if len(parts) != len(old) || partsRev != rev {
		t.Errorf("the feed keeps %d parts of revision %d, want %d of %d", len(parts), partsRev, len(old), rev)
	}

	// WatchRules: the group's RULES message, encoded once, as each stream receives it.
	var first *verdictv1.WatchRulesResponse
	for i := range 3 {
		s, err := h.wat.WatchRules(ctx, &verdictv1.WatchRulesRequest{Workload: &verdictv1.Endpoint{Workload: "backend-1"}, AddressSets: true})
		if err != nil {
			t.Fatal(err)
		}
		m := recvN(t, s, 1)[0]
		wantKind(t, m, verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES)
		if i == 0 {
			first = m
		} else if !proto.Equal(first, m) {
			t.Fatalf("stream %d received %v, the first %v", i, m, first)
		}
	}
	h.srv.hub.mu.Lock()
	var full *encodedMsg
	for _, g := range h.srv.hub.groups {
		full = g.full
	}
	h.srv.hub.mu.Unlock()
	if full == nil {
		t.Fatal("no shared RULES message")
	}
	if !proto.Equal(full.msg, first) {
		t.Errorf("received %v, built %v", first, full.msg)
	}
}
