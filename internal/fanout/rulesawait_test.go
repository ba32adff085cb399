package fanout

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/store/syncer"
)

// laggingSyncer is a replica whose snapshot moves ahead of what it has sent
// its subscriber: the lag the rules hub has behind the replica on a busy
// machine. send delivers the update.
type laggingSyncer struct {
	mu      sync.Mutex
	snap    *engine.Snapshot
	updates chan syncer.Update
}

func (f *laggingSyncer) Snapshot() *engine.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}
func (f *laggingSyncer) set(s *engine.Snapshot) { f.mu.Lock(); f.snap = s; f.mu.Unlock() }
func (f *laggingSyncer) Synced() bool           { return true }
func (f *laggingSyncer) Stale() bool            { return false }
func (f *laggingSyncer) Status() syncer.Status {
	return syncer.Status{Revision: f.Snapshot().Revision()}
}
func (f *laggingSyncer) WaitFor(context.Context, int64) (*engine.Snapshot, error) {
	return f.Snapshot(), nil
}
func (f *laggingSyncer) Subscribe(int) syncer.Subscription { return laggingSub{f} }

type laggingSub struct{ f *laggingSyncer }

func (s laggingSub) Updates() <-chan syncer.Update { return s.f.updates }
func (s laggingSub) Err() error                    { return nil }
func (s laggingSub) Close()                        {}

// TestWatchRulesAwaitsTheReplica: a WatchRules stream opened once the
// replica serves a workload just applied finds it, though the rules hub has
// not processed that revision yet: the hub is awaited (docs/api.md); an
// unknown workload is still NotFound.
func TestWatchRulesAwaitsTheReplica(t *testing.T) {
	t.Parallel()
	before := engine.Build(1, decodeYAML(t, "kind: Policy\nmesh: aw\nname: w2b\nsources: [{match: {app: web}}]\ndestinations: [{match: {app: backend}}]\n"))
	b1 := decodeYAML(t, "kind: Workload\nmesh: aw\nname: b1\ntags: {app: backend}\naddresses: [10.9.0.1]\n")[0]
	change := []engine.Change{engine.Put(b1)}
	after := before.Apply(2, change)
	sy := &laggingSyncer{snap: before, updates: make(chan syncer.Update, 1)}
	h := NewHub(HubConfig{Source: sy, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		h.mu.Lock()
		at := h.snap != nil && h.snap.Revision() == 1
		h.mu.Unlock()
		if at {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hub never took the replica's first snapshot")
		}
	}

	sy.set(after) // the replica serves b1; the hub has not been sent it
	type result struct {
		w   *rulesWatcher
		err error
	}
	got := make(chan result, 1)
	go func() {
		w, err := h.watch(ctx, "aw", "", Workload{Name: "b1"}, false, false)
		got <- result{w, err}
	}()
	select {
	case r := <-got: // before the hub holds revision 2: from the hub's revision 1
		t.Fatalf("watch returned before the hub reached the replica's revision: %v", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	sy.updates <- syncer.Update{Snapshot: after, Previous: before, Changes: change}
	r := <-got
	if r.err != nil {
		t.Fatalf("a workload the replica serves: %v", r.err)
	}
	r.w.close()
	if _, err := h.watch(ctx, "aw", "", Workload{Name: "nobody"}, false, false); !errors.Is(err, inventory.ErrEndpointNotFound) {
		t.Fatalf("an unknown workload: %v", err)
	}
}
