package server

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/syncer"
)

// rulesHub computes WatchRules answers: one group per distinct (mesh, type,
// tag set), its rules computed once per snapshot and handed to every stream
// of the group; a stream is woken only when its group's rules change.
type rulesHub struct {
	syncer syncer.API
	log    *slog.Logger

	mu     sync.Mutex
	groups map[string]*ruleGroup
}

// rulesState is a group's rules at a revision, or the error that ends its streams.
type rulesState struct {
	rev int64
	set engine.RuleSet
	err error
	// resp is the answer every stream of the group sends: converted once,
	// never modified (marshaling it from many streams at once is safe).
	resp *verdictv1.WatchRulesResponse
}

type ruleGroup struct {
	key      string
	mesh     string
	typ      string
	tags     engine.Tags
	state    rulesState
	watchers map[*rulesWatcher]struct{}
}

// rulesWatcher is one stream's mailbox: the newest state and a wake-up. A
// slow stream skips intermediate states; it never blocks the hub.
type rulesWatcher struct {
	hub    *rulesHub
	group  *ruleGroup
	notify chan struct{}

	mu    sync.Mutex
	state rulesState
}

func newRulesHub(sy syncer.API, log *slog.Logger) *rulesHub {
	return &rulesHub{syncer: sy, log: log, groups: map[string]*ruleGroup{}}
}

// run follows the syncer's snapshots until ctx ends. A dropped subscription
// (the hub fell behind) is renewed and every group recomputed.
func (h *rulesHub) run(ctx context.Context) {
	for ctx.Err() == nil {
		sub := h.syncer.Subscribe(64)
		h.refresh(h.syncer.Snapshot())
		h.follow(ctx, sub)
		sub.Close()
		if err := sub.Err(); err != nil && ctx.Err() == nil {
			h.log.WarnContext(ctx, "rules hub resubscribes", "err", err)
		}
		select { // never spin on a subscription that keeps ending
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (h *rulesHub) follow(ctx context.Context, sub syncer.Subscription) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-sub.Updates():
			if !ok {
				return
			}
			h.refresh(u.Snapshot)
		}
	}
}

// refresh recomputes every group at snap and wakes the watchers of the
// groups whose rules changed.
func (h *rulesHub) refresh(snap *engine.Snapshot) {
	h.mu.Lock()
	groups := make([]*ruleGroup, 0, len(h.groups))
	for _, g := range h.groups {
		if g.state.rev < snap.Revision() {
			groups = append(groups, g)
		}
	}
	h.mu.Unlock()
	for _, g := range groups {
		st := compute(snap, g.mesh, g.typ, g.tags)
		h.mu.Lock()
		if g.state.rev < st.rev {
			changed := (st.err == nil) != (g.state.err == nil) || (st.err == nil && !st.set.Equal(g.state.set))
			if changed {
				st = st.withResponse()
			} else {
				st.resp = g.state.resp // same rules: the streams have them already
			}
			g.state = st
			if changed {
				for w := range g.watchers {
					w.set(st)
				}
			}
		}
		h.mu.Unlock()
	}
}

func compute(snap *engine.Snapshot, mesh, typ string, tags engine.Tags) rulesState {
	set, err := snap.RulesFor(mesh, typ, tags)
	return rulesState{rev: snap.Revision(), set: set, err: err}
}

// withResponse converts the state's rules for the streams, once.
func (st rulesState) withResponse() rulesState {
	if st.err == nil && st.resp == nil {
		st.resp = apiconv.RulesResponse(st.rev, &st.set)
	}
	return st
}

// watch registers a stream for a workload; its first state is ready at once.
// A mesh that holds no resource is NotFound.
func (h *rulesHub) watch(mesh, typ string, tags engine.Tags) (*rulesWatcher, error) {
	if mesh == "" {
		mesh = engine.DefaultMesh
	}
	if typ == "" {
		typ = engine.DefaultType
	}
	key := groupKey(mesh, typ, tags)
	h.mu.Lock()
	defer h.mu.Unlock()
	g, ok := h.groups[key]
	if !ok {
		// The syncer's current snapshot is at least as new as any the hub has
		// seen, so the new group is never behind the others.
		st := compute(h.syncer.Snapshot(), mesh, typ, tags).withResponse()
		if st.err != nil {
			return nil, st.err
		}
		g = &ruleGroup{key: key, mesh: mesh, typ: typ, tags: copyTags(tags), state: st, watchers: map[*rulesWatcher]struct{}{}}
		h.groups[key] = g
	}
	if g.state.err != nil {
		return nil, g.state.err
	}
	if g.state.resp.GetRevision() != g.state.rev {
		// The rules are unchanged since resp was made: a new stream gets them
		// at the current revision.
		st := g.state
		st.resp = nil
		g.state = st.withResponse()
	}
	w := &rulesWatcher{hub: h, group: g, notify: make(chan struct{}, 1)}
	g.watchers[w] = struct{}{}
	w.set(g.state)
	return w, nil
}

func (w *rulesWatcher) set(st rulesState) {
	w.mu.Lock()
	w.state = st
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

func (w *rulesWatcher) latest() rulesState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state
}

// close unregisters the watcher; the last one out removes its group.
func (w *rulesWatcher) close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(w.group.watchers, w)
	if len(w.group.watchers) == 0 && h.groups[w.group.key] == w.group {
		delete(h.groups, w.group.key)
	}
}

// groupCount is the number of distinct workloads watched (for tests).
func (h *rulesHub) groupCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.groups)
}

// groupKey is an unambiguous key of (mesh, type, tags).
func groupKey(mesh, typ string, tags engine.Tags) string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	write := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	write(mesh)
	write(typ)
	for _, k := range keys {
		write(k)
		write(tags[k])
	}
	return b.String()
}

func copyTags(t engine.Tags) engine.Tags {
	out := make(engine.Tags, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}

// serveRules sends a workload's rules to one WatchRules stream: the newest
// state each time, never a backlog (a stream that reads slowly skips
// intermediate states). A client that stops reading blocks the send in
// gRPC's flow control; once a newer state has waited RulesMaxLag behind that
// send, the stream ends with RESOURCE_EXHAUSTED (Typha's model: a slow
// consumer is dropped, counted in verdict_watch_dropped_total{rpc="WatchRules"},
// and reconnects to a fresh copy), so the server holds no state and no
// goroutine for it any more. Other streams are never held up by it.
func (s *Server) serveRules(ctx context.Context, w *rulesWatcher, send func(*verdictv1.WatchRulesResponse) error) error {
	sent := make(chan error, 1) // buffered: a send still blocked when the stream ends exits when gRPC ends it
	sending, pending := false, false
	var behind *time.Timer
	var behindC <-chan time.Time
	defer func() {
		if behind != nil {
			behind.Stop()
		}
	}()
	start := func() error {
		st := w.latest()
		if st.err != nil {
			return st.err
		}
		sending = true
		go func() { sent <- send(st.resp) }()
		return nil
	}
	for {
		select {
		case <-s.stop:
			return errShuttingDown
		case <-ctx.Done():
			return ctx.Err()
		case <-w.notify:
			if !sending {
				if err := start(); err != nil {
					return err
				}
				continue
			}
			pending = true
			if behind == nil {
				behind = time.NewTimer(s.cfg.RulesMaxLag)
				behindC = behind.C
			}
		case err := <-sent:
			sending = false
			if err != nil {
				return err
			}
			if behind != nil {
				behind.Stop()
				behind, behindC = nil, nil
			}
			if pending {
				pending = false
				if err := start(); err != nil {
					return err
				}
			}
		case <-behindC:
			s.metrics.rulesDropped(ctx)
			return fmt.Errorf("%w: the rules of revision %d waited %v behind an unread message; reconnect",
				errFellBehind, w.latest().rev, s.cfg.RulesMaxLag)
		}
	}
}

// watcherCount is the number of streams registered (for tests).
func (h *rulesHub) watcherCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, g := range h.groups {
		n += len(g.watchers)
	}
	return n
}
