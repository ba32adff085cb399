package server

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/syncer"
)

// backend is a small in-memory store and syncer for handler tests: Apply
// writes a new revision, and the snapshot follows at once (or, with hold,
// only when released). Watches replay a history that compact can cut.
type backend struct {
	mu        sync.Mutex
	rev       int64
	items     map[string]store.Item
	history   []store.Event
	compacted int64
	watchers  []chan store.Event
	snap      *engine.Snapshot
	synced    bool
	stale     bool
	hold      bool
	pending   []engine.Change
	subs      []*fakeSub
	wake      chan struct{}
}

func newBackend(resources ...resource.Resource) *backend {
	b := &backend{items: map[string]store.Item{}, snap: engine.Empty(), synced: true, wake: make(chan struct{})}
	if len(resources) > 0 {
		ops := make([]store.Op, len(resources))
		for i, r := range resources {
			ops[i] = store.Op{Key: r.Key(), Resource: r}
		}
		if _, err := b.Apply(context.Background(), ops); err != nil {
			panic(err)
		}
	}
	return b
}

func (b *backend) Apply(_ context.Context, ops []store.Op) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(ops) > store.MaxOps {
		return 0, fmt.Errorf("%w: %d ops", store.ErrTooLarge, len(ops))
	}
	if len(ops) == 0 { // as the real stores: nothing written, the current revision
		return b.rev, nil
	}
	for _, op := range ops {
		cur, ok := b.items[op.Key.String()]
		switch {
		case op.ExpectedRevision == store.MustNotExist && ok,
			op.ExpectedRevision > 0 && (!ok || cur.ModRevision != op.ExpectedRevision):
			return 0, fmt.Errorf("%w: %s", store.ErrConflict, op.Key)
		}
	}
	b.rev++
	var changes []engine.Change
	for _, op := range ops {
		k := op.Key.String()
		if op.Resource == nil {
			delete(b.items, k)
			changes = append(changes, engine.Delete(op.Key))
			continue
		}
		m := op.Resource.Metadata()
		m.ModRevision = b.rev
		m.CreateRevision = b.rev
		if cur, ok := b.items[k]; ok {
			m.CreateRevision = cur.CreateRevision
		}
		r := op.Resource.WithMeta(m)
		b.items[k] = store.Item{Key: op.Key, Path: k, Resource: r, CreateRevision: m.CreateRevision, ModRevision: b.rev}
		changes = append(changes, engine.Put(r))
	}
	ev := store.Event{Revision: b.rev, Changes: changes}
	b.history = append(b.history, ev)
	for _, w := range b.watchers {
		w <- ev
	}
	b.pending = append(b.pending, changes...)
	if !b.hold {
		b.publishLocked()
	}
	return b.rev, nil
}

// putBroken stores a value that does not decode.
func (b *backend) putBroken(path string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rev++
	c := engine.Change{Path: path, Err: fmt.Errorf("invalid: bad value"), ModRevision: b.rev}
	if k, err := resource.ParseKey(path); err == nil {
		c.Key = k
	}
	b.items[path] = store.Item{Path: path, Err: c.Err, ModRevision: b.rev}
	b.history = append(b.history, store.Event{Revision: b.rev, Changes: []engine.Change{c}})
	b.pending = append(b.pending, c)
	b.publishLocked()
}

func (b *backend) publishLocked() {
	prev := b.snap
	b.snap = b.snap.Apply(b.rev, b.pending)
	u := syncer.Update{Snapshot: b.snap, Previous: prev, Changes: b.pending}
	b.pending = nil
	for _, s := range b.subs {
		select {
		case s.ch <- u:
		default:
		}
	}
	close(b.wake)
	b.wake = make(chan struct{})
}

// release publishes the writes held back since hold was set.
func (b *backend) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hold = false
	b.publishLocked()
}

func (b *backend) setHold(h bool) {
	b.mu.Lock()
	b.hold = h
	b.mu.Unlock()
}

func (b *backend) compact() {
	b.mu.Lock()
	b.compacted = b.rev
	b.history = nil
	b.mu.Unlock()
}

func (b *backend) Get(_ context.Context, k resource.Key) (store.Item, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	it, ok := b.items[k.String()]
	if !ok {
		return store.Item{}, fmt.Errorf("%w: %s", store.ErrNotFound, k)
	}
	return it, nil
}

func (b *backend) Watch(ctx context.Context, from int64) <-chan store.Event {
	out := make(chan store.Event, 1024)
	b.mu.Lock()
	if from == 0 || from < b.compacted {
		var all []engine.Change
		paths := make([]string, 0, len(b.items))
		for p := range b.items {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			it := b.items[p]
			if it.Err != nil {
				all = append(all, engine.Change{Path: p, Key: it.Key, Err: it.Err, ModRevision: it.ModRevision})
			} else {
				all = append(all, engine.Put(it.Resource))
			}
		}
		out <- store.Event{Revision: b.rev, Reset: true, Changes: all}
	} else {
		for _, ev := range b.history {
			if ev.Revision > from {
				out <- ev
			}
		}
	}
	b.watchers = append(b.watchers, out)
	b.mu.Unlock()
	go func() {
		<-ctx.Done()
		b.mu.Lock()
		for i, w := range b.watchers {
			if w == out {
				b.watchers = append(b.watchers[:i], b.watchers[i+1:]...)
				break
			}
		}
		close(out)
		b.mu.Unlock()
	}()
	return out
}

func (b *backend) Health() store.Health {
	b.mu.Lock()
	defer b.mu.Unlock()
	return store.Health{Connected: true, Revision: b.rev}
}

func (b *backend) Close() error { return nil }

func (b *backend) Snapshot() *engine.Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.snap
}

func (b *backend) Synced() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.synced
}

func (b *backend) setSynced(v bool) {
	b.mu.Lock()
	b.synced = v
	b.mu.Unlock()
}

func (b *backend) Stale() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stale
}

func (b *backend) Status() syncer.Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	return syncer.Status{Revision: b.snap.Revision(), Synced: b.synced, Stale: b.stale, LastEventAt: time.Now(),
		Invalid: len(b.snap.Invalid())}
}

func (b *backend) WaitFor(ctx context.Context, rev int64) (*engine.Snapshot, error) {
	for {
		b.mu.Lock()
		snap, wake := b.snap, b.wake
		b.mu.Unlock()
		if snap.Revision() >= rev {
			return snap, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

func (b *backend) Subscribe(buffer int) syncer.Subscription {
	s := &fakeSub{b: b, ch: make(chan syncer.Update, buffer)}
	b.mu.Lock()
	b.subs = append(b.subs, s)
	b.mu.Unlock()
	return s
}

type fakeSub struct {
	b    *backend
	ch   chan syncer.Update
	once sync.Once
}

func (s *fakeSub) Updates() <-chan syncer.Update { return s.ch }
func (s *fakeSub) Err() error                    { return nil }
func (s *fakeSub) Close() {
	s.once.Do(func() {
		s.b.mu.Lock()
		defer s.b.mu.Unlock()
		for i, x := range s.b.subs {
			if x == s {
				s.b.subs = append(s.b.subs[:i], s.b.subs[i+1:]...)
				break
			}
		}
		close(s.ch)
	})
}

var (
	_ Store      = (*backend)(nil)
	_ syncer.API = (*backend)(nil)
)
