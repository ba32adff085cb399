package fanout

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/syncer"
)

// DefaultMaxLag is how long a WatchRules stream's newer state may wait behind
// an unread message before the stream is dropped (HubConfig.MaxLag).
const DefaultMaxLag = 5 * time.Second

// HubConfig configures a Hub. Zero values take the defaults.
type HubConfig struct {
	Source Source
	Log    *slog.Logger
	// MaxLag: a stream whose client does not read ends with ErrFellBehind
	// once a newer state has waited this long behind its unread messages.
	MaxLag time.Duration
	// Limits caps the streams served at once.
	Limits Limits
	// Stop, when closed, ends every stream with ErrStopped.
	Stop <-chan struct{}
	// Dropped is called for each stream ended for falling behind, before it
	// ends: count it, and close the caller's connection (Serve says why).
	Dropped func(ctx context.Context)
}

// RulesRequest is what a WatchRules stream watches (validated).
type RulesRequest struct {
	Mesh, Type string // "" for the defaults
	Workload   Workload
	// AddressSets: peers as address sets (docs/api.md, "Address sets").
	AddressSets bool
	// IncludeAudit: audit rules are sent, marked.
	IncludeAudit bool
}

// Workload is a watched workload as given: one of tags, a workload name, or
// an address (canonical).
type Workload struct {
	Tags    resource.Tags
	Name    string
	Address string
}

// Hub computes WatchRules answers: one group per distinct (mesh, type,
// workload as given, address sets or not), its rules computed once per
// snapshot that may change them and handed to every stream of the group; a
// stream is woken only when its group has something to send. With address
// sets, the sets (addrsets.go) are shared by every group naming them and
// updated once per snapshot; a group whose rules are unchanged sends the
// deltas of its sets, and nothing when none changed.
//
// Every group and set reflects the hub's snapshot (snap): all of it is
// guarded by mu, and a new group is computed at snap, never at a newer
// snapshot the hub has not processed (its sets' deltas would be skipped).
type Hub struct {
	src    Source
	log    *slog.Logger
	maxLag time.Duration
	stop   <-chan struct{}
	onDrop func(context.Context)

	mu     sync.Mutex
	snap   *engine.Snapshot
	moved  chan struct{} // closed when snap moves on (await)
	groups map[string]*ruleGroup
	sets   *setRegistry
	bodies *bodyTable
	counts *streamCounts
	// woken: the mailboxes of the streams a refresh wakes, once it lets go
	// of mu (wakeAll).
	woken []chan struct{}
	// reresolved counts the groups resolved again after a workload change
	// that could not alter their rules; computed the groups' rules computed
	// again after a change (Stats).
	reresolved, computed int
}

// resolution is how a watched workload resolved at a snapshot.
type resolution struct {
	tags  resource.Tags
	rep   *verdictv1.EndpointResolution
	addrs []string // the workload's addresses (name and address forms)
}

func (r resolution) equal(o resolution) bool {
	return maps.Equal(r.tags, o.tags) && proto.Equal(r.rep, o.rep) && slices.Equal(r.addrs, o.addrs)
}

// rulesState is a group's rules at a revision, or the error that ends its streams.
type rulesState struct {
	rev int64
	// version counts the states the streams were told of; a stream that has
	// version-1 can take delta.
	version uint64
	res     resolution
	err     error
	rules   *rulesBody // interned: a reference held per state (bodies)
	named   []*peerSet // address sets: the distinct sets the rules name, by name
	// delta is the SET_DELTAS message from version-1 to this state; nil when
	// this state's rules or resolution changed.
	delta *Message
}

type ruleGroup struct {
	key      string
	mesh     string
	typ      string
	ep       Workload
	sets     bool
	audit    bool // audit rules included (WatchRulesRequest.include_audit)
	state    rulesState
	watchers map[*rulesWatcher]struct{}
	// full is the RULES message of the current state at fullRev, shared by
	// the streams that need it, encoded once; never modified once made.
	full        *Message
	fullVersion uint64
	fullRev     int64
}

// rulesWatcher is one stream's mailbox: a wake-up, and the version of its
// group's state it was last given (guarded by the hub's mu). A slow stream
// skips intermediate states (it is then sent the state in full); it never
// blocks the hub.
type rulesWatcher struct {
	hub    *Hub
	group  *ruleGroup
	notify chan struct{}
	sent   uint64
}

// NewHub makes a hub; Run follows its source.
func NewHub(cfg HubConfig) *Hub {
	if cfg.MaxLag <= 0 {
		cfg.MaxLag = DefaultMaxLag
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Dropped == nil {
		cfg.Dropped = func(context.Context) {}
	}
	return &Hub{src: cfg.Source, log: cfg.Log, maxLag: cfg.MaxLag, stop: cfg.Stop, onDrop: cfg.Dropped,
		groups: map[string]*ruleGroup{}, sets: newSetRegistry(), bodies: newBodyTable(), counts: newStreamCounts(cfg.Limits), moved: make(chan struct{})}
}

// Run follows the source's snapshots until ctx ends. A renewed subscription
// (the hub fell behind) recomputes every group.
func (h *Hub) Run(ctx context.Context) {
	follow(ctx, h.src, 64, h.log, "rules hub", false, func(snap *engine.Snapshot) { h.refresh(snap, nil, nil) },
		func(u syncer.Update) { h.refresh(u.Snapshot, u.Previous, u.Changes) })
}

// refresh brings every set and group to snap and wakes the watchers of the
// groups with something to send. With prev the hub's own snapshot and changes
// the changes from it to snap, only what they can alter is recomputed: a
// set's members touched by a workload change; a group's rules when the
// changes may alter the rules of its workload's tags (RulesImpact: a policy
// whose rules select it, before or after; anything of its mesh and type that
// concerns every workload) or its workload resolves differently. Otherwise
// (prev nil, or a gap) everything is.
func (h *Hub) refresh(snap, prev *engine.Snapshot, changes []engine.Change) {
	h.mu.Lock()
	h.refreshLocked(snap, prev, changes)
	woken := h.woken
	h.woken = nil
	h.mu.Unlock()
	wakeAll(woken)
	clear(woken)
	h.mu.Lock()
	if h.woken == nil {
		h.woken = woken[:0] // kept for the next refresh
	}
	h.mu.Unlock()
}

// wakeBatch is how many streams a refresh wakes before it lets every
// goroutine runnable meanwhile run (decision calls among them).
const wakeBatch = 64

// wakeAll wakes the streams of notify, wakeBatch at a time, yielding the
// processor between batches: a change that concerns 2,000 streams never
// makes 2,000 goroutines runnable at once ahead of the calls already
// waiting to run, which would wait behind them all. The streams learn of
// the change a batch later at most (each batch costs what its streams take
// to pick their message up).
func wakeAll(notify []chan struct{}) {
	for i, c := range notify {
		select {
		case c <- struct{}{}:
		default:
		}
		if (i+1)%wakeBatch == 0 && i+1 < len(notify) {
			runtime.Gosched()
		}
	}
}

func (h *Hub) refreshLocked(snap, prev *engine.Snapshot, changes []engine.Change) {
	if h.snap != nil && snap.Revision() <= h.snap.Revision() {
		return
	}
	incremental := prev != nil && h.snap != nil && prev.Revision() == h.snap.Revision()
	rev := snap.Revision()
	var impact *engine.RulesImpact
	if incremental {
		impact = snap.RulesImpact(prev, changes)
	}
	workloads := map[string][]string{}
	for _, c := range changes {
		if c.Key.Kind == resource.KindWorkload {
			workloads[c.Key.Mesh] = append(workloads[c.Key.Mesh], c.Key.Name)
		}
	}
	// The workloads a mesh's changes touch (the changed ones and those
	// claiming their addresses), computed once per mesh.
	touched := map[string]*touchedWorkloads{}
	touchedIn := func(mesh string) *touchedWorkloads {
		tw, ok := touched[mesh]
		if !ok {
			tw = newTouchedWorkloads(snap, prev, mesh, workloads[mesh])
			touched[mesh] = tw
		}
		return tw
	}
	for _, ps := range h.sets.byKey {
		if !incremental {
			ps.update(snap, nil, true)
			continue
		}
		var names []string
		if len(workloads[ps.mesh]) > 0 {
			names = touchedIn(ps.mesh).names
		}
		ps.update(snap, names, false)
	}
	for _, g := range h.groups {
		if g.state.rev >= rev {
			continue
		}
		if incremental && g.state.err == nil && !impact.May(g.mesh, g.typ, g.state.res.tags) {
			// No change can alter the rules of the workload's tags: neither
			// can they change unless the workload resolves differently (a
			// name or address, after a change of a workload it can resolve
			// to).
			if g.ep.Tags != nil || len(workloads[g.mesh]) == 0 || !touchedIn(g.mesh).mayResolve(g) {
				h.advance(g, g.state, rev)
				continue
			}
			h.reresolved++
			if res, err := resolveWatched(snap, g.mesh, g.ep); err == nil && res.equal(g.state.res) {
				h.advance(g, g.state, rev)
				continue
			}
		}
		h.computed++
		st := h.compute(g, snap)
		old := g.state
		if st.err == nil && old.err == nil && st.rules == old.rules && st.res.equal(old.res) {
			h.swapSets(&old, &st)
			h.bodies.release(old.rules)
			h.advance(g, st, rev)
			continue
		}
		if st.err != nil && old.err != nil {
			continue
		}
		h.swapSets(&old, &st)
		h.bodies.release(old.rules)
		st.version = old.version + 1
		g.state = st
		h.wake(g)
	}
	h.setSnap(snap)
}

// setSnap moves the hub to snap and wakes those awaiting it.
func (h *Hub) setSnap(snap *engine.Snapshot) {
	h.snap = snap
	close(h.moved)
	h.moved = make(chan struct{})
}

// hubCatchUp bounds how long a new stream waits for the hub to reach the
// replica's revision (await): the hub follows the replica within
// milliseconds; past the bound the stream starts from the hub's snapshot.
const hubCatchUp = 2 * time.Second

// await returns once the hub's snapshot is at revision rev or later (or it
// has none yet: a new group then starts from the replica's), ctx ends, or
// hubCatchUp passes. A stream opened after a write the replica serves then
// sees it: a workload just applied is found, not NOT_FOUND.
func (h *Hub) await(ctx context.Context, rev int64) {
	timeout := time.NewTimer(hubCatchUp)
	defer timeout.Stop()
	for {
		h.mu.Lock()
		if h.snap == nil || h.snap.Revision() >= rev {
			h.mu.Unlock()
			return
		}
		moved := h.moved
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-timeout.C:
			return
		case <-moved:
		}
	}
}

// touchedWorkloads is what a snapshot's workload changes in one mesh can
// alter the resolution of: the workloads touched (Snapshot.TouchedWorkloads:
// the changed ones and those claiming their addresses, sorted) and the
// addresses those hold before or after.
type touchedWorkloads struct {
	names []string
	addrs map[string]bool
}

func newTouchedWorkloads(snap, prev *engine.Snapshot, mesh string, changed []string) *touchedWorkloads {
	tw := &touchedWorkloads{addrs: map[string]bool{}}
	if len(changed) == 0 {
		return tw
	}
	tw.names = snap.TouchedWorkloads(prev, mesh, changed)
	for _, n := range tw.names {
		for _, s := range []*engine.Snapshot{prev, snap} {
			addrs, _ := s.WorkloadAddresses(mesh, n)
			for _, a := range addrs {
				tw.addrs[a] = true
			}
		}
	}
	return tw
}

// mayResolve reports whether g's workload, given by name or address, may
// resolve differently after the change: its name is touched, or its address
// is held by a touched workload (before or after), or it resolved to one. A
// workload given by tags never changes with the inventory. Any other group's
// resolution is the same as before, so a workload put costs the groups
// nothing but this test (it was a resolution per group).
func (tw *touchedWorkloads) mayResolve(g *ruleGroup) bool {
	has := func(name string) bool {
		_, ok := slices.BinarySearch(tw.names, name)
		return ok
	}
	switch {
	case g.ep.Name != "":
		return has(g.ep.Name)
	case g.ep.Address != "":
		return tw.addrs[g.ep.Address] || g.state.res.rep.GetWorkload() != "" && has(g.state.res.rep.GetWorkload())
	}
	return false
}

// advance moves a group whose rules and resolution are unchanged to rev: the
// deltas of its sets at rev, if any, make a new state the streams are sent.
func (h *Hub) advance(g *ruleGroup, st rulesState, rev int64) {
	st.rev = rev
	st.version = g.state.version
	st.delta = nil
	if g.sets {
		var deltas []*verdictv1.AddressSetDelta
		for _, ps := range st.named {
			if d := ps.deltaAt(rev); d != nil {
				deltas = append(deltas, d)
			}
		}
		if len(deltas) > 0 {
			st.version++
			st.delta = NewMessage(&verdictv1.WatchRulesResponse{Revision: rev, Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS,
				SetDeltas: deltas})
		}
	}
	changed := st.version != g.state.version
	g.state = st
	if changed {
		h.wake(g)
	}
}

// swapSets moves the group's set references from old's sets to st's.
func (h *Hub) swapSets(old, st *rulesState) {
	for _, ps := range st.named {
		ps.refs++
	}
	for _, ps := range old.named {
		h.sets.release(ps)
	}
}

// wake marks the watchers of g to be woken once the refresh lets go of mu
// (wakeAll). h.mu is held.
func (h *Hub) wake(g *ruleGroup) {
	for w := range g.watchers {
		h.woken = append(h.woken, w.notify)
	}
}

// compute is a group's state at snap: its workload resolved, its rules, and
// with address sets each rule's peer as sets and CIDRs (the sets made as
// needed; the caller takes their references with swapSets).
func (h *Hub) compute(g *ruleGroup, snap *engine.Snapshot) rulesState {
	st := rulesState{rev: snap.Revision()}
	st.res, st.err = resolveWatched(snap, g.mesh, g.ep)
	if st.err != nil {
		return st
	}
	set, err := snap.RulesFor(g.mesh, g.typ, st.res.tags)
	if err != nil {
		return rulesState{rev: st.rev, err: err}
	}
	if !g.audit {
		set = withoutAudit(set)
	}
	resp := apiconv.RulesResponse(0, &set)
	fail := func(err error) rulesState {
		for _, ps := range st.named { // made for this state only: not kept
			if ps.refs == 0 {
				h.sets.refs0(ps)
			}
		}
		return rulesState{rev: st.rev, err: err}
	}
	if g.sets {
		seen := map[*peerSet]bool{}
		for side, sr := range []*engine.SideRules{&set.Outbound, &set.Inbound} {
			rules := []*verdictv1.SideRules{resp.Outbound, resp.Inbound}[side].GetRules()
			for i, r := range sr.Rules {
				for _, sel := range r.Peer {
					cidrs, ps, err := h.sets.peer(snap, g.mesh, sel)
					if err != nil {
						return fail(fmt.Errorf("%s rule %s of policy %q: %w", sideName(side), r.Rule, r.Policy, err))
					}
					rules[i].PeerCidrs = append(rules[i].PeerCidrs, cidrs...)
					if ps != nil {
						rules[i].PeerSets = append(rules[i].PeerSets, ps.name)
						if !seen[ps] {
							seen[ps] = true
							st.named = append(st.named, ps)
						}
					}
				}
			}
		}
		sort.Slice(st.named, func(i, j int) bool { return st.named[i].name < st.named[j].name })
	}
	b, err := encodeBody(resp.Inbound, resp.Outbound)
	if err != nil {
		return fail(err)
	}
	st.rules = h.bodies.intern(b)
	return st
}

func sideName(side int) string {
	if side == 0 {
		return "outbound"
	}
	return "inbound"
}

// resolveWatched resolves a WatchRules workload at snap as Decide resolves an
// endpoint (engine.Snapshot.ResolveEndpoint, docs/workloads.md), with no flow port: tags
// as given; a workload name → its tags (an unknown or invalid one is
// NotFound); an address → its workload's tags plus ip, else the external
// endpoint {ip: ADDRESS}. A workload's addresses come with it.
func resolveWatched(snap *engine.Snapshot, mesh string, ep Workload) (resolution, error) {
	r, err := snap.ResolveEndpoint(mesh, &inventory.Endpoint{Tags: ep.Tags, Workload: ep.Name, Address: ep.Address}, false, 0, nil)
	if err != nil {
		return resolution{}, err
	}
	out := resolution{tags: r.Tags, rep: &verdictv1.EndpointResolution{Form: apiconv.EndpointForm(r.Form),
		ResolvedAs: apiconv.ResolvedAs(r.ResolvedAs), Workload: r.Workload, Identity: r.Identity}}
	if r.Workload != "" {
		out.addrs, _ = snap.WorkloadAddresses(mesh, r.Workload)
	}
	return out, nil
}

// watch registers a stream for a workload, once the hub holds what the
// replica serves (await); its first message is ready at once. A mesh that
// holds no resource, or an unknown workload, is NotFound.
func (h *Hub) watch(ctx context.Context, mesh, typ string, ep Workload, sets, audit bool) (*rulesWatcher, error) {
	h.await(ctx, h.src.Snapshot().Revision())
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	key := groupKey(mesh, typ, ep, sets, audit)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.snap == nil { // the hub has not run yet: it starts from this snapshot
		h.setSnap(h.src.Snapshot())
	}
	g, ok := h.groups[key]
	if !ok {
		g = &ruleGroup{key: key, mesh: mesh, typ: typ, ep: ep, sets: sets, audit: audit, watchers: map[*rulesWatcher]struct{}{}}
		st := h.compute(g, h.snap)
		if st.err != nil {
			return nil, st.err
		}
		h.swapSets(&rulesState{}, &st)
		st.version = 1
		g.state = st
		h.groups[key] = g
	}
	if g.state.err != nil {
		return nil, g.state.err
	}
	w := &rulesWatcher{hub: h, group: g, notify: make(chan struct{}, 1)}
	g.watchers[w] = struct{}{}
	w.notify <- struct{}{}
	return w, nil
}

// next is what the stream sends next: nil when it has the group's state;
// the state's deltas when it has the state before; else the state in full.
func (h *Hub) next(w *rulesWatcher) (*Message, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := &w.group.state
	switch {
	case st.err != nil:
		return nil, st.err
	case st.version == w.sent:
		return nil, nil
	case st.delta != nil && st.version == w.sent+1:
		w.sent = st.version
		return st.delta, nil
	}
	w.sent = st.version
	return w.group.fullMessage(h.snap.Revision()), nil
}

// revision is the revision of the watcher's group (for errors).
func (w *rulesWatcher) revision() int64 {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	return w.group.state.rev
}

// close unregisters the watcher; the last one out removes its group.
func (w *rulesWatcher) close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(w.group.watchers, w)
	if len(w.group.watchers) == 0 && h.groups[w.group.key] == w.group {
		delete(h.groups, w.group.key)
		h.swapSets(&w.group.state, &rulesState{})
		h.bodies.release(w.group.state.rules)
	}
}

// HubStats is what a hub holds and has done (tests, metrics).
type HubStats struct {
	Revision int64 // the revision its groups and sets reflect
	Groups   int   // distinct workloads watched
	Streams  int   // streams registered
	Sets     int   // address sets in use
	// Reresolved counts the groups resolved again after a workload change
	// that could not alter their rules; Computed the groups whose rules
	// were computed again after a change (engine.Snapshot.RulesImpact says
	// which a change may alter).
	Reresolved, Computed int
}

// Stats returns the hub's figures now.
func (h *Hub) Stats() HubStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HubStats{Groups: len(h.groups), Sets: len(h.sets.byKey), Reresolved: h.reresolved, Computed: h.computed}
	if h.snap != nil {
		st.Revision = h.snap.Revision()
	}
	for _, g := range h.groups {
		st.Streams += len(g.watchers)
	}
	return st
}

// groupKey is an unambiguous key of (mesh, type, workload as given, sets,
// audit).
func groupKey(mesh, typ string, ep Workload, sets, audit bool) string {
	keys := make([]string, 0, len(ep.Tags))
	for k := range ep.Tags {
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
	switch {
	case ep.Name != "":
		b.WriteString("w")
		write(ep.Name)
	case ep.Address != "":
		b.WriteString("a")
		write(ep.Address)
	default:
		b.WriteString("t")
		for _, k := range keys {
			write(k)
			write(ep.Tags[k])
		}
	}
	if sets {
		b.WriteString("s")
	}
	if audit {
		b.WriteString("u")
	}
	return b.String()
}

// withoutAudit is rs without its audit rules: what a client that did not ask
// for them may enforce. rs is shared: the lists are copied when they change.
func withoutAudit(rs engine.RuleSet) engine.RuleSet {
	for _, sr := range []*engine.SideRules{&rs.Outbound, &rs.Inbound} {
		n := 0
		for _, r := range sr.Rules {
			if !r.Audit {
				n++
			}
		}
		if n == len(sr.Rules) {
			continue
		}
		kept := make([]engine.RuleView, 0, n)
		for _, r := range sr.Rules {
			if !r.Audit {
				kept = append(kept, r)
			}
		}
		sr.Rules = kept
	}
	return rs
}

// Serve sends a workload's rules to one WatchRules stream of caller
// (docs/api.md): in full first, then whenever they change, and with address
// sets the deltas of their sets. A stream over one of the Limits is refused
// with ErrTooManyStreams, naming the cap. A mesh that holds no resource, or
// an unknown workload, is the engine's NotFound error, at the start or
// later.
//
// The stream is sent the newest state each time, never a backlog (a stream
// that reads slowly skips intermediate states). A client that stops reading
// blocks the send in the transport's flow control; once a newer state has
// waited MaxLag behind that send, the stream ends with ErrFellBehind
// (Typha's model: a slow consumer is dropped, and reconnects to a fresh
// copy) after Dropped closed its connection, so the server holds no state,
// no goroutine and no buffer for it any more. Streams on other connections
// are never held up by it.
func (h *Hub) Serve(ctx context.Context, req RulesRequest, caller Caller, send func(any) error) error {
	h.mu.Lock()
	err := h.counts.admit(caller)
	h.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		h.mu.Lock()
		h.counts.release(caller)
		h.mu.Unlock()
	}()
	w, err := h.watch(ctx, req.Mesh, req.Type, req.Workload, req.AddressSets, req.IncludeAudit)
	if err != nil {
		return err
	}
	defer w.close()
	return h.serve(ctx, w, send)
}

func (h *Hub) serve(ctx context.Context, w *rulesWatcher, send func(any) error) error {
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
		msg, err := w.hub.next(w)
		if err != nil || msg == nil {
			return err
		}
		sending = true
		go func() { sent <- send(msg) }()
		return nil
	}
	for {
		select {
		case <-h.stop:
			return ErrStopped
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
				behind = time.NewTimer(h.maxLag)
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
			// The transport keeps what it queued for the stream (gRPC: up
			// to its 64 KiB write quota, plus the message blocked in send)
			// and sends the stream's end behind it: until the client reads
			// or disconnects. A client that stopped reading does neither:
			// Dropped closes its connection, as Typha does, so that the
			// memory goes with it.
			h.onDrop(ctx)
			return fmt.Errorf("%w: the rules of revision %d waited %v behind an unread message; reconnect",
				ErrFellBehind, w.revision(), h.maxLag)
		}
	}
}
