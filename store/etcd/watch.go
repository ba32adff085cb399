package etcd

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// Why a watch is dropped and replaced by a re-list.
var (
	errSilent = errors.New("watch silent: no event and no progress")
	errClosed = errors.New("watch channel closed")
)

// maxPending bounds the changes a watch coalesces while its reader is busy;
// beyond it the watch stops reading and etcd's client buffers.
const maxPending = 10000

// Watch implements store.Store; see the package comment for how.
func (s *Store) Watch(ctx context.Context, fromRevision int64) <-chan store.Event {
	out := make(chan store.Event)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		close(out)
		return out
	}
	s.wg.Add(1)
	kick := make(chan struct{}, 1)
	s.kicks[kick] = struct{}{}
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer func() {
			s.mu.Lock()
			delete(s.kicks, kick)
			s.mu.Unlock()
		}()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.ctx, cancel) // Close ends the watch
		defer stop()
		w := &watcher{s: s, out: out, kick: kick, rev: fromRevision, id: s.watchID.Add(1)}
		w.run(ctx, fromRevision <= 0)
	}()
	return out
}

// watcher is one Watch: what it has delivered, and what waits for its reader.
type watcher struct {
	s    *Store
	out  chan<- store.Event
	kick chan struct{}
	id   int64
	// rev: every change up to it has been delivered or is pending.
	rev     int64
	pending *store.Event
}

func (w *watcher) run(ctx context.Context, list bool) {
	s := w.s
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if list {
			ev, err := s.listAll(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.lost(err)
				s.log.Warn("watch: list failed, retrying", "error", err, "retry_in", backoff)
				if !sleep(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
			s.seen(ev.Revision)
			w.rev, w.pending = ev.Revision, nil
			// A Reset is delivered alone, before anything after it is read.
			select {
			case w.out <- ev:
			case <-ctx.Done():
				return
			}
		}
		started := time.Now()
		err := w.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		if !errors.Is(err, store.ErrCompacted) {
			s.lost(err)
		}
		s.log.Warn("watch interrupted: re-listing", "revision", w.rev, "error", err)
		list = true
		// A watch that fails at once (refused, or compacted again and again)
		// must not turn into a loop of full lists.
		if time.Since(started) > s.cfg.LivenessTimeout {
			backoff = 50 * time.Millisecond
			continue
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// follow watches the changes after w.rev until the watch must be replaced; it returns why.
func (w *watcher) follow(ctx context.Context) error {
	s := w.s
	// Its own metadata gives the watch its own gRPC stream, which
	// RequestProgress must be called with: progress requests reach only the
	// watches of the stream whose context metadata they carry.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wctx = metadata.AppendToOutgoingContext(wctx, "verdict-watch", strconv.FormatInt(w.id, 10))
	// The watch starts at w.rev, not w.rev+1: etcd sends no progress to a
	// watch whose start is beyond its current revision, so a watch from R+1
	// on an idle store at R would stay silent. The changes at w.rev, already
	// delivered, are skipped by take.
	//
	// Watch returns once etcd has confirmed the watch: a hung etcd would block
	// it for good, so the liveness timeout covers the creation too.
	//
	// The silence is said meanwhile as it is once the watch runs (below): a
	// watch whose creation waits on an etcd that went away right after the
	// list would otherwise leave Health connected for the whole liveness
	// timeout.
	quietAfter := s.cfg.ProgressInterval + s.cfg.ProgressInterval/2
	expire := time.AfterFunc(s.cfg.LivenessTimeout, cancel)
	creating := time.AfterFunc(quietAfter, func() {
		s.lost(fmt.Errorf("%w for %v creating the watch (it is replaced after %v)", errSilent, quietAfter, s.cfg.LivenessTimeout))
	})
	wch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(max(w.rev, 1)), clientv3.WithProgressNotify())
	creating.Stop()
	if !expire.Stop() {
		return fmt.Errorf("%w (creating the watch)", errSilent)
	}

	progress := time.NewTicker(s.cfg.ProgressInterval)
	defer progress.Stop()
	alive := time.NewTimer(s.cfg.LivenessTimeout)
	defer alive.Stop()
	// A watch that asks for progress every ProgressInterval and hears nothing
	// for one and a half of them is not known current: Health says
	// disconnected (Status: stale) until it hears again, well before the
	// liveness timeout replaces it. A stopped member leaves the client
	// redialling with no error, a partition leaves it silent: either way,
	// this is what notices first.
	quiet := time.NewTimer(quietAfter)
	defer quiet.Stop()
	heard := func() {
		alive.Reset(s.cfg.LivenessTimeout)
		quiet.Reset(quietAfter)
	}
	// Progress requests run beside the loop, one at a time: while etcd is
	// away a request blocks until its timeout, and the loop must go on
	// noticing the silence meanwhile.
	var asking sync.WaitGroup
	defer asking.Wait()
	defer cancel() // ends a request in flight before the wait above
	askingNow := false
	asked := make(chan struct{}, 1)
	ask := func() {
		if askingNow {
			return
		}
		askingNow = true
		asking.Go(func() {
			w.requestProgress(wctx)
			asked <- struct{}{}
		})
	}
	for {
		var out chan<- store.Event
		var next store.Event
		if w.pending != nil {
			out, next = w.out, *w.pending
		}
		in, silent, hushed := wch, alive.C, quiet.C
		if w.pending != nil && len(w.pending.Changes) >= maxPending {
			// The reader is behind: stop reading; silence does not count.
			in, silent, hushed = nil, nil, nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case out <- next:
			w.pending = nil
			if in == nil {
				heard()
			}
		case resp, ok := <-in:
			if !ok {
				return errClosed
			}
			if err := resp.Err(); err != nil {
				// Pending changes are dropped: the Reset that follows holds them.
				w.pending = nil
				return mapErr("watch", err)
			}
			heard()
			w.take(resp)
			s.seen(w.rev)
		case <-progress.C:
			ask()
		case <-w.kick:
			ask()
		case <-asked:
			askingNow = false
		case <-hushed:
			// Again each time: a write that reached etcd by another endpoint
			// does not make this watch current.
			s.lost(fmt.Errorf("%w for %v (still waiting: the watch is replaced after %v)", errSilent, quietAfter, s.cfg.LivenessTimeout))
			quiet.Reset(quietAfter)
		case <-silent:
			return errSilent
		}
	}
}

func (w *watcher) requestProgress(wctx context.Context) {
	s := w.s
	rctx, cancel := context.WithTimeout(wctx, min(s.cfg.RequestTimeout, s.cfg.ProgressInterval))
	defer cancel()
	if err := s.cli.RequestProgress(rctx); err != nil && wctx.Err() == nil {
		s.log.Debug("watch: progress request failed", "error", err)
	}
}

// take adds a watch response to the pending event.
func (w *watcher) take(resp clientv3.WatchResponse) {
	if resp.Created {
		// Its header is the store's revision, not the watch's: events up to
		// it may still be on their way.
		return
	}
	if w.pending == nil {
		w.pending = &store.Event{Revision: w.rev}
	}
	p := w.pending
	if resp.IsProgressNotify() {
		// Every event up to the header's revision has been sent.
		w.rev = max(w.rev, resp.Header.Revision)
		p.Revision = w.rev
		p.Progress = len(p.Changes) == 0
		return
	}
	base := w.rev
	for _, ev := range resp.Events {
		kv := ev.Kv
		if kv.ModRevision <= base {
			continue // already delivered: never twice
		}
		if ev.Type == mvccpb.DELETE {
			p.Changes = append(p.Changes, store.DeleteChange(w.s.path(kv.Key), kv.ModRevision))
		} else {
			p.Changes = append(p.Changes, w.s.item(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision, nil).Change())
		}
		w.rev = max(w.rev, kv.ModRevision)
	}
	p.Revision = w.rev
	p.Progress = len(p.Changes) == 0
}

func (s *Store) path(key []byte) string {
	return string(key[len(s.prefix):])
}

// key is the etcd key of k under the store's prefix (docs/storage.md).
func (s *Store) key(k resource.Key) string {
	return s.prefix + k.String()
}

// listAll reads everything under the prefix at one revision, in pages, and
// returns it as a Reset. Pages are decoded in parallel while the next ones
// are fetched.
func (s *Store) listAll(ctx context.Context) (store.Event, error) {
	return s.listAt(ctx, 0, "")
}

// listAt is listAll at revision rev (0: the current one) of the keys under
// the store's prefix and then sub.
func (s *Store) listAt(ctx context.Context, rev int64, sub string) (store.Event, error) {
	type page struct {
		kvs     []*mvccpb.KeyValue
		changes []engine.Change
	}
	work := make(chan *page, runtime.GOMAXPROCS(0))
	tags := &store.TagInterner{} // the list's workloads share their tag sets' maps
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for p := range work {
				p.changes = make([]engine.Change, len(p.kvs))
				for i, kv := range p.kvs {
					p.changes[i] = s.item(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision, tags).Change()
				}
				p.kvs = nil // the response can go
			}
		})
	}
	var pages []*page
	start, end := s.prefix+sub, clientv3.GetPrefixRangeEnd(s.prefix+sub)
	var err error
	for {
		cctx, cancel := s.callCtx(ctx)
		var resp *clientv3.GetResponse
		resp, err = s.cli.Get(cctx, start, clientv3.WithRange(end), clientv3.WithLimit(int64(s.cfg.ListPageSize)), clientv3.WithRev(rev))
		cancel()
		if err != nil {
			err = mapErr("list", err)
			break
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		if len(resp.Kvs) > 0 {
			p := &page{kvs: resp.Kvs}
			pages = append(pages, p)
			work <- p
			start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		if !resp.More {
			break
		}
	}
	close(work)
	wg.Wait()
	if err != nil {
		return store.Event{}, fmt.Errorf("list at revision %d: %w", rev, err)
	}
	n := 0
	for _, p := range pages {
		n += len(p.changes)
	}
	ev := store.Event{Revision: rev, Reset: true, Changes: make([]engine.Change, 0, n)}
	for _, p := range pages {
		ev.Changes = append(ev.Changes, p.changes...)
	}
	return ev, nil
}
