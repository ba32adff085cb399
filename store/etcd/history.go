package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// The store's past (store.History), read from etcd's MVCC within what
// compaction keeps (docs/history.md).

var _ store.History = (*Store)(nil)

// Revision implements store.History.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.recordKey(), clientv3.WithKeysOnly())
	if err != nil {
		err = mapErr("read revision", err)
		s.observe(ctx, err, 0)
		return 0, err
	}
	s.observe(ctx, nil, resp.Header.Revision)
	return resp.Header.Revision, nil
}

// Oldest implements store.History: 1 while nothing is compacted, else the
// revision etcd names to a watch from a compacted one.
func (s *Store) Oldest(ctx context.Context) (int64, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	_, err := s.cli.Get(cctx, s.recordKey(), clientv3.WithRev(1), clientv3.WithKeysOnly())
	switch {
	case err == nil:
		return 1, nil
	case !errors.Is(err, rpctypes.ErrCompacted):
		return 0, mapErr("read the oldest revision", err)
	}
	wch := s.cli.Watch(cctx, s.recordKey(), clientv3.WithRev(1))
	for resp := range wch {
		if resp.CompactRevision > 0 {
			return resp.CompactRevision, nil
		}
		if err := resp.Err(); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			return 0, mapErr("read the oldest revision", err)
		}
	}
	return 0, mapErr("read the oldest revision", cctx.Err())
}

// pastErr is the error of a read at rev: a *store.CompactedError naming the
// oldest revision when rev is compacted.
func (s *Store) pastErr(ctx context.Context, rev int64, err error) error {
	if !errors.Is(err, store.ErrCompacted) && !errors.Is(err, rpctypes.ErrCompacted) {
		return err
	}
	oldest, oerr := s.Oldest(ctx)
	if oerr != nil {
		oldest = 0
	}
	return &store.CompactedError{Revision: rev, Oldest: oldest}
}

// checkRev refuses a revision the store has not reached (store.ErrFutureRevision).
func (s *Store) checkRev(ctx context.Context, rev int64) error {
	if rev <= s.Health().Revision {
		return nil
	}
	cur, err := s.Revision(ctx)
	if err != nil {
		return err
	}
	if rev > cur {
		return fmt.Errorf("%w: revision %d, the store is at %d", store.ErrFutureRevision, rev, cur)
	}
	return nil
}

// StateAt implements store.History.
func (s *Store) StateAt(ctx context.Context, rev int64, prefix string) ([]engine.Change, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if rev <= 0 {
		return nil, fmt.Errorf("%w: revision %d", store.ErrInvalidArgument, rev)
	}
	if err := s.checkRev(ctx, rev); err != nil {
		return nil, err
	}
	ev, err := s.listAt(ctx, rev, prefix)
	if err != nil {
		return nil, s.pastErr(ctx, rev, err)
	}
	return ev.Changes, nil
}

// Versions implements store.History with a watch from from+1 that asks for
// the previous value of every change (etcd replays puts and deletes from a
// past revision), read until etcd confirms it has sent everything up to to: a
// change after to, or a progress notification at to or later (requested on
// the watch's own gRPC stream until one comes).
func (s *Store) Versions(ctx context.Context, key string, prefix bool, from, to int64, limit int) ([]store.Version, bool, error) {
	if err := s.checkOpen(); err != nil {
		return nil, false, err
	}
	if from < 0 || to < from {
		return nil, false, fmt.Errorf("%w: revisions (%d, %d]", store.ErrInvalidArgument, from, to)
	}
	if err := s.checkRev(ctx, to); err != nil {
		return nil, false, err
	}
	if from == to {
		return nil, false, nil
	}
	// A change at from+1 has its previous value read at from: from must be held.
	if from > 0 {
		cctx, cancel := s.callCtx(ctx)
		_, err := s.cli.Get(cctx, s.recordKey(), clientv3.WithRev(from), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return nil, false, s.pastErr(ctx, from, mapErr("versions", err))
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wctx = metadata.AppendToOutgoingContext(wctx, "verdict-history", strconv.FormatInt(s.watchID.Add(1), 10))
	opts := []clientv3.OpOption{clientv3.WithRev(from + 1), clientv3.WithPrevKV()}
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	wch := s.cli.Watch(wctx, s.prefix+key, opts...)

	var asking sync.WaitGroup
	defer asking.Wait()
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	askingNow := false
	asked := make(chan struct{}, 1)
	var out []store.Version
	for {
		select {
		case <-ctx.Done():
			return nil, false, mapErr("versions", ctx.Err())
		case <-tick.C:
			if !askingNow {
				askingNow = true
				asking.Go(func() {
					rctx, rcancel := context.WithTimeout(wctx, s.cfg.RequestTimeout)
					_ = s.cli.RequestProgress(rctx) // a lost request is asked again at the next tick
					rcancel()
					asked <- struct{}{}
				})
			}
		case <-asked:
			askingNow = false
		case resp, ok := <-wch:
			if !ok {
				return nil, false, mapErr("versions", errors.Join(errClosed, ctx.Err()))
			}
			if resp.CompactRevision > 0 {
				return nil, false, &store.CompactedError{Revision: from, Oldest: resp.CompactRevision}
			}
			if err := resp.Err(); err != nil {
				return nil, false, mapErr("versions", err)
			}
			if resp.IsProgressNotify() {
				if resp.Header.Revision >= to {
					return out, false, nil
				}
				continue
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > to {
					return out, false, nil
				}
				if limit > 0 && len(out) == limit {
					return out, true, nil
				}
				out = append(out, s.version(ev))
			}
		}
	}
}

// version is a watch event as a store.Version.
func (s *Store) version(ev *clientv3.Event) store.Version {
	kv := ev.Kv
	v := store.Version{Path: s.path(kv.Key), Revision: kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		v.Deleted = true
	} else {
		v.Item = s.item(string(kv.Key), kv.Value, kv.CreateRevision, kv.ModRevision, nil)
	}
	if p := ev.PrevKv; p != nil {
		it := s.item(string(p.Key), p.Value, p.CreateRevision, p.ModRevision, nil)
		v.Prev = &it
	}
	return v
}

// recordBatch bounds the reads of one Records transaction (a shared etcd's
// --max-txn-ops is 128 by default).
const recordBatch = 100

// Records implements store.History: the version of the record key at each
// revision, where that version was written at that revision.
func (s *Store) Records(ctx context.Context, revisions []int64) (map[int64]store.WriteRecord, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	out := map[int64]store.WriteRecord{}
	for len(revisions) > 0 {
		batch := revisions[:min(len(revisions), recordBatch)]
		revisions = revisions[len(batch):]
		gets := make([]clientv3.Op, len(batch))
		for i, r := range batch {
			gets[i] = clientv3.OpGet(s.recordKey(), clientv3.WithRev(r))
		}
		cctx, cancel := s.callCtx(ctx)
		resp, err := s.cli.Txn(cctx).Then(gets...).Commit()
		cancel()
		if err != nil {
			return nil, s.pastErr(ctx, slicesMin(batch), mapErr("read write records", err))
		}
		for i, r := range resp.Responses {
			kvs := r.GetResponseRange().GetKvs()
			if len(kvs) == 0 || kvs[0].ModRevision != batch[i] {
				continue
			}
			if rec, ok := decodeRecord(kvs[0].Value); ok {
				rec.Revision = batch[i]
				out[batch[i]] = rec
			}
		}
	}
	return out, nil
}

func slicesMin(xs []int64) int64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = min(m, x)
	}
	return m
}

// recordAt is the newest write record at or before rev (ok false: none).
func (s *Store) recordAt(ctx context.Context, rev int64) (store.WriteRecord, bool, error) {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.recordKey(), clientv3.WithRev(rev))
	if err != nil {
		return store.WriteRecord{}, false, s.pastErr(ctx, rev, mapErr("read a write record", err))
	}
	if len(resp.Kvs) == 0 {
		return store.WriteRecord{}, false, nil
	}
	rec, ok := decodeRecord(resp.Kvs[0].Value)
	rec.Revision = resp.Kvs[0].ModRevision
	return rec, ok, nil
}

// RevisionAt implements store.History (docs/history.md, "at_time"): the
// newest of (a) the newest write recorded at or before t, found by a binary
// search over the record key's versions (recorded times never go backwards),
// and (b) the revision of the newest revision-time sample at or before t
// (retention.go: the compacting replica samples etcd's revision every minute),
// which counts the writes made around verdict. A time before every revision
// known is a *store.CompactedError naming the oldest revision; with nothing
// compacted, it is revision 1, the empty store before the first write.
func (s *Store) RevisionAt(ctx context.Context, t time.Time) (int64, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	cur, err := s.Revision(ctx)
	if err != nil {
		return 0, err
	}
	oldest, err := s.Oldest(ctx)
	if err != nil {
		return 0, err
	}
	before := func(rec store.WriteRecord, ok bool) bool { return !ok || !rec.Time.After(t) }
	// The largest revision in [oldest, cur] whose newest record is at or
	// before t (none counts as before).
	lo, hi := oldest, cur
	if rec, ok, err := s.recordAt(ctx, lo); err != nil {
		return 0, err
	} else if !before(rec, ok) {
		return 0, s.tooEarly(t, oldest)
	}
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		rec, ok, err := s.recordAt(ctx, mid)
		if err != nil {
			return 0, err
		}
		if before(rec, ok) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	rec, ok, err := s.recordAt(ctx, lo)
	if err != nil {
		return 0, err
	}
	known := int64(0) // the newest revision known committed at or before t
	if ok {
		known = rec.Revision
	}
	if sampled, err := s.sampledBefore(ctx, t, known, lo); err == nil {
		known = max(known, sampled)
	} else {
		return 0, err
	}
	switch {
	case known >= oldest:
		return known, nil
	case oldest == 1:
		return 1, nil // nothing compacted: the store was empty before its first write
	}
	return 0, s.tooEarly(t, oldest)
}

func (s *Store) tooEarly(t time.Time, oldest int64) error {
	return &store.CompactedError{At: t, Oldest: oldest}
}

// sampledBefore is the revision of the newest revision-time sample taken at
// or before t among those of revisions in [from, to]; 0 when none.
func (s *Store) sampledBefore(ctx context.Context, t time.Time, from, to int64) (int64, error) {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	dir := s.meta + clockDir
	resp, err := s.cli.Get(cctx, fmt.Sprintf("%s%020d", dir, max(from, 0)),
		clientv3.WithRange(fmt.Sprintf("%s%020d", dir, to+1)))
	if err != nil {
		return 0, mapErr("read revision-time samples", err)
	}
	best := int64(0)
	for _, kv := range resp.Kvs {
		rev, err1 := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), dir), 10, 64)
		at, err2 := time.Parse(time.RFC3339Nano, string(kv.Value))
		if err1 == nil && err2 == nil && !at.After(t) {
			best = max(best, rev)
		}
	}
	return best, nil
}
