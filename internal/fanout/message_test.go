package fanout

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestSharedStreamsReceiveTheOldMessages: several WatchResources streams from
// revision 0 and several WatchRules streams of one workload receive exactly
// the messages the old path built per stream, and the streams share one
// encoding.
func TestSharedStreamsReceiveTheOldMessages(t *testing.T) {
	t.Parallel()
	var docs strings.Builder
	docs.WriteString(`kind: Policy
name: web-to-backend
sources: [{match: {app: web}}]
destinations: [{match: {app: backend}}]
---
kind: Workload
name: web-1
tags: {app: web}
addresses: [10.0.0.1]
---
kind: Workload
name: backend-1
tags: {app: backend}
addresses: [10.0.1.1]
`)
	for i := range 2*snapshotChunk + 10 { // three SNAPSHOT parts
		fmt.Fprintf(&docs, "---\nkind: Workload\nname: w-%d\ntags: {app: a%d}\naddresses: [10.1.%d.%d]\n", i, i%7, i/250, i%250)
	}
	src := newTestSource(t, docs.String())
	ctx := context.Background()

	f := NewFeed(FeedConfig{Source: src})
	running(t, f.Run)
	<-f.ready
	// The old path: the feed's snapshot cut into parts, each stream's own.
	snapshot, rev, _ := f.start(0)
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
		got := collect[*verdictv1.WatchResourcesResponse](t, len(old), func(send func(any) error) error {
			return f.Serve(ctx, 0, "", send)
		})
		for j := range old {
			if !proto.Equal(old[j], got[j]) {
				t.Fatalf("stream %d message %d: received %v, the old path sent %v", i, j, got[j], old[j])
			}
		}
	}
	f.mu.Lock()
	parts, partsRev := f.parts, f.partsRev
	f.mu.Unlock()
	if len(parts) != len(old) || partsRev != rev {
		t.Errorf("the feed keeps %d parts of revision %d, want %d of %d", len(parts), partsRev, len(old), rev)
	}

	// WatchRules: the group's RULES message, encoded once, as each stream receives it.
	h := NewHub(HubConfig{Source: src})
	running(t, h.Run)
	req := RulesRequest{Workload: Workload{Name: "backend-1"}, AddressSets: true}
	var first *verdictv1.WatchRulesResponse
	for i := range 3 {
		m := collect[*verdictv1.WatchRulesResponse](t, 1, func(send func(any) error) error { return h.Serve(ctx, req, Caller{ID: "test"}, send) })[0]
		if m.GetKind() != verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES || len(m.GetInbound().GetRules()) != 1 || len(m.GetSets()) != 1 {
			t.Fatalf("stream %d received %v", i, m)
		}
		if i == 0 {
			first = m
		} else if !proto.Equal(first, m) {
			t.Fatalf("stream %d received %v, the first %v", i, m, first)
		}
	}
}
