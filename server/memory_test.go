package server

import (
	"context"
	"testing"
	"time"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/syncer"
)

// TestOverMemoryStore runs the server on store/memory and the real syncer:
// broken values are listed with their error; a watch resumed after the store
// compacted is served from the server's own history, and one from before that
// history gets a fresh snapshot.
func TestOverMemoryStore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := memory.New(memory.Config{})
	defer st.Close()
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sy.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	h := start(t, nil, func(c *Config) { c.Syncer, c.Store = sy, st; c.WatchHistory = 1 })
	c := ctxT(t)
	first, err := h.wat.WatchResources(c, &verdictv1.WatchResourcesRequest{}) // the feed follows the store from now on
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, first, 2)

	// Each write is waited for, so that the syncer publishes each in a change
	// set of its own (it coalesces writes that arrive together).
	var last int64
	for _, name := range []string{"a", "b", "c"} {
		r, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy(name, "x", "y", "")}})
		if err != nil {
			t.Fatal(err)
		}
		last = r.GetRevision()
		if _, err := h.pol.Status(c, &verdictv1.StatusRequest{MinRevision: last}); err != nil {
			t.Fatal(err)
		}
	}
	broken := st.PutRaw("default/policies/TrafficPermission/hand-written", []byte(`{"kind":"Policy","name":`))
	s, err := h.pol.Status(c, &verdictv1.StatusRequest{MinRevision: broken})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GetInvalid()) != 1 || s.GetInvalid()[0].GetKey() != "default/policies/TrafficPermission/hand-written" {
		t.Errorf("invalid: %v", s.GetInvalid())
	}
	l, err := h.pol.List(c, &verdictv1.ListRequest{})
	if err != nil || len(l.GetResources()) != 4 {
		t.Fatalf("list: %v %v", l, err)
	}
	if err := st.Compact(last); err != nil {
		t.Fatal(err)
	}
	// The feed follows the syncer on its own: until it holds broken, its
	// one-set history may still trim sets a resumed stream is about to read.
	for h.srv.feed.Revision() < broken {
		if c.Err() != nil {
			t.Fatalf("the feed never reached revision %d", broken)
		}
		time.Sleep(5 * time.Millisecond)
	}
	w, err := h.wat.WatchResources(c, &verdictv1.WatchResourcesRequest{FromRevision: 2})
	if err != nil {
		t.Fatal(err)
	}
	m, err := w.Recv()
	if err != nil || m.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_SNAPSHOT || !m.GetFresh() || len(m.GetChanges()) != 4 {
		t.Fatalf("from before the history: %v %v", m, err)
	}
	w, err = h.wat.WatchResources(c, &verdictv1.WatchResourcesRequest{FromRevision: last})
	if err != nil {
		t.Fatal(err)
	}
	m, err = w.Recv()
	// The broken value closes its type: the other policies' conditions
	// move with it, as conditions_only changes beside the one written.
	var written []*verdictv1.ResourceChange
	for _, ch := range m.GetChanges() {
		if !ch.GetConditionsOnly() {
			written = append(written, ch)
		}
	}
	if err != nil || m.GetType() != verdictv1.WatchEventType_WATCH_EVENT_TYPE_CHANGES || m.GetRevision() != broken ||
		len(written) != 1 || written[0].GetResource().GetError() == "" {
		t.Fatalf("after compaction, from the history: %v %v", m, err)
	}
}
