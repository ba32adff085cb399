package server

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/internal/fanout"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The messages shared by streams are encoded once (fanout.Message) and
// passed through the codec as bytes: what a client decodes is the message the
// old path (gRPC's proto codec on each stream's own message) sent.

// TestSharedMessageMarshalsAsTheProtoCodec: the codec's bytes of a shared
// message decode to the message, as gRPC's proto codec's bytes of the
// message do.
func TestSharedMessageMarshalsAsTheProtoCodec(t *testing.T) {
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
			shared, err := c.Marshal(fanout.NewMessage(m))
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
