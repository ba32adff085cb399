package memory

import (
	"context"
	"sort"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// maxEventChanges bounds the changes of one coalesced event.
const maxEventChanges = 10000

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, fromRevision int64) <-chan store.Event {
	out := make(chan store.Event)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		close(out)
		return out
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.watch(ctx, fromRevision, out)
	return out
}

type pending struct {
	path        string
	rev, create int64
	value       []byte // nil: delete
}

func (s *Store) watch(ctx context.Context, from int64, out chan<- store.Event) {
	defer s.wg.Done()
	defer close(out)
	pos, reset := from, from <= 0
	tick := time.NewTicker(s.cfg.ProgressInterval)
	defer tick.Stop()
	for {
		s.mu.Lock()
		changed := s.changed
		var ev store.Event
		var todo []pending
		have := false
		if !s.disconnected && !s.closed {
			switch {
			case reset || pos+1 < s.compacted:
				// Everything live now, in key order.
				ev = store.Event{Revision: s.rev, Reset: true}
				for p := range s.kvs {
					if v := s.current(p); v != nil {
						todo = append(todo, pending{path: p, rev: v.rev, create: v.create, value: v.value})
					}
				}
				sort.Slice(todo, func(i, j int) bool { return todo[i].path < todo[j].path })
				pos, reset, have = s.rev, false, true
			case pos < s.rev:
				i := sort.Search(len(s.history), func(i int) bool { return s.history[i].rev > pos })
				for ; i < len(s.history); i++ {
					r := s.history[i]
					// Bounded, but a revision is never split across events.
					if len(todo) >= maxEventChanges && r.rev != todo[len(todo)-1].rev {
						break
					}
					todo = append(todo, pending{path: r.path, rev: r.rev, create: r.create, value: r.value})
				}
				pos = todo[len(todo)-1].rev
				ev = store.Event{Revision: pos}
				have = true
			}
		}
		s.mu.Unlock()
		if have {
			ev.Changes = make([]engine.Change, len(todo))
			for i, p := range todo {
				if p.value == nil {
					ev.Changes[i] = store.DeleteChange(p.path, p.rev)
					continue
				}
				ev.Changes[i] = s.item(p.path, &version{rev: p.rev, create: p.create, value: p.value}).Change()
			}
			if !s.send(ctx, out, ev) {
				return
			}
			tick.Reset(s.cfg.ProgressInterval)
			continue
		}
		select {
		case <-changed:
		case <-tick.C:
			s.mu.Lock()
			idle := !s.disconnected && pos == s.rev
			s.mu.Unlock()
			if idle && !s.send(ctx, out, store.Event{Revision: pos, Progress: true}) {
				return
			}
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
	}
}

func (s *Store) send(ctx context.Context, out chan<- store.Event, ev store.Event) bool {
	select {
	case out <- ev:
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}
