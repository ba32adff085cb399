package etcd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/verdictpdp/verdict/store"
)

// Defaults of Retention.
const (
	DefaultRetention          = 168 * time.Hour
	DefaultRetentionRevisions = 100000
	DefaultMaintainInterval   = 10 * time.Second
	DefaultSampleInterval     = time.Minute
	DefaultDefragMinFree      = 16 << 20
	DefaultElectionTTL        = 10 * time.Second
)

// defragTimeout bounds one member's defragmentation: it rewrites the whole
// database file, and the member serves nothing meanwhile.
const defragTimeout = 2 * time.Minute

// Retention configures Maintain: how much history verdict keeps in etcd, and
// so how large etcd's database grows (docs/storage.md, "Retention").
//
// Every replica computes two bounds: the revision etcd was at Duration ago
// (from the revision-time samples the compacting replica records under the
// meta prefix), and the current revision less Revisions. It compacts to the
// newer of the two: history is kept for Duration, but never more than
// Revisions revisions — with many writes the revision count wins and the
// database stays flat. Without a sample older than Duration (the first
// Duration of a store's life) the time bound is unknown and taken as 0: the
// count alone decides, and nothing within Duration is lost that the count
// keeps.
type Retention struct {
	// Off leaves compaction to whoever runs etcd (a shared etcd): no
	// election, no samples, no compaction. The storage is still observed
	// (sizes, alarms).
	Off bool
	// Duration of history kept (default 168h).
	Duration time.Duration
	// Revisions: at most this many revisions kept (default 100000).
	Revisions int64
	// Interval between two maintenance rounds (default 10s): observe the
	// storage, and on the compacting replica sample, compact, defragment.
	Interval time.Duration
	// CompactStep: a compaction waits until its target moved by this many
	// revisions (default Revisions/20, at most 1000, at least 1), so that an
	// idle store is not compacted (nor its compacted revision recorded, a
	// write) every round.
	CompactStep int64
	// SampleInterval between two revision-time samples (default 1m).
	SampleInterval time.Duration
	// Defrag defragments the store's endpoints after a compaction that left
	// at least DefragMinFree bytes of the database file free (default
	// 16 MiB: etcd reuses free pages, so the file stops growing without a
	// defragmentation; one gives the space back), or at once under a
	// NOSPACE alarm. A member serves nothing
	// while it is defragmented: verdictd sets it for its embedded member
	// only; a shared etcd is its operator's (docs/storage.md).
	Defrag        bool
	DefragMinFree int64
	// ElectionTTL is the lease of the compacting replica's election
	// (default 10s, whole seconds): a replica that dies is replaced within it.
	ElectionTTL time.Duration
	// Now reads the clock (default time.Now).
	Now func() time.Time
}

// Validate checks the retention.
func (r Retention) Validate() error {
	switch {
	case r.Duration < 0:
		return fmt.Errorf("%w: retention %v is negative", ErrInvalidConfig, r.Duration)
	case r.Revisions < 0:
		return fmt.Errorf("%w: retention revisions %d is negative", ErrInvalidConfig, r.Revisions)
	case r.Interval < 0 || r.SampleInterval < 0 || r.ElectionTTL < 0 || r.DefragMinFree < 0 || r.CompactStep < 0:
		return fmt.Errorf("%w: a negative retention interval, TTL or size", ErrInvalidConfig)
	case r.ElectionTTL != 0 && r.ElectionTTL < time.Second:
		return fmt.Errorf("%w: election TTL %v is under a second (etcd leases count whole seconds)", ErrInvalidConfig, r.ElectionTTL)
	}
	return nil
}

func (r Retention) withDefaults() Retention {
	if r.Duration == 0 {
		r.Duration = DefaultRetention
	}
	if r.Revisions == 0 {
		r.Revisions = DefaultRetentionRevisions
	}
	if r.Interval == 0 {
		r.Interval = DefaultMaintainInterval
	}
	if r.CompactStep == 0 {
		r.CompactStep = max(1, min(r.Revisions/20, 1000))
	}
	if r.SampleInterval == 0 {
		r.SampleInterval = DefaultSampleInterval
	}
	if r.DefragMinFree == 0 {
		r.DefragMinFree = DefaultDefragMinFree
	}
	if r.ElectionTTL == 0 {
		r.ElectionTTL = DefaultElectionTTL
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	return r
}

// Keys under the meta prefix (MetaPrefix) that maintenance uses.
const (
	clockDir     = "clock/"     // clock/<revision, 20 digits> = the RFC 3339 time etcd was at that revision
	compactedKey = "compacted"  // the revision etcd was last compacted to
	electionDir  = "compactor/" // the election of the compacting replica
)

// Storage returns what the store knows of etcd's storage (store.Storage),
// as its last maintenance round saw it; zero before Maintain runs.
func (s *Store) Storage() store.Storage {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.storage
	st.Alarms = slices.Clone(st.Alarms)
	return st
}

func (s *Store) updateStorage(f func(st *store.Storage)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.storage)
}

// Maintain keeps etcd's storage within r until ctx ends or the store is
// closed (docs/storage.md, "Retention"): every r.Interval it observes the
// database (sizes, alarms: Storage, and the log), and unless r.Off, the one
// replica elected through an etcd lease records a revision-time sample,
// compacts to the newer of the two bounds, defragments when r.Defrag says
// so, and disarms a NOSPACE alarm once the space is back. Failures are
// logged and retried at the next round; it returns only a refused r, or nil.
//
// The store's own watch survives the compaction: it is at the current
// revision, and one that lagged beyond the compacted revision re-lists (a
// Reset), as for any compaction.
func (s *Store) Maintain(ctx context.Context, r Retention) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel) // the store closed
	defer stop()
	m := &maintainer{s: s, r: r}
	var wg sync.WaitGroup
	if !r.Off {
		host, _ := os.Hostname()
		m.id = fmt.Sprintf("%s/%d", host, os.Getpid())
		wg.Go(func() { m.campaign(ctx) })
	}
	defer wg.Wait()
	tick := time.NewTicker(r.Interval)
	defer tick.Stop()
	for {
		m.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// maintainer is one Maintain's state.
type maintainer struct {
	s  *Store
	r  Retention
	id string // the election's value: host/pid

	mu     sync.Mutex
	leader bool // this replica holds the election

	compacted  int64 // the revision last compacted to, as known here
	lastSample int64 // the revision of this replica's last sample write
	alarms     []string
}

func (m *maintainer) isLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leader
}

func (m *maintainer) setLeader(v bool) {
	m.mu.Lock()
	m.leader = v
	m.mu.Unlock()
	m.s.updateStorage(func(st *store.Storage) { st.Compactor = v })
}

// campaign holds the election while it can: a session (a lease kept alive),
// a campaign that waits to lead, leadership until the session ends (the lease
// lost: another replica takes over) or ctx ends (resigned at once).
func (m *maintainer) campaign(ctx context.Context) {
	ttl := int(m.r.ElectionTTL / time.Second)
	for ctx.Err() == nil {
		// The session outlives ctx so that its lease is revoked on the way out.
		sess, err := concurrency.NewSession(m.s.cli, concurrency.WithTTL(ttl), concurrency.WithContext(m.s.ctx))
		if err != nil {
			m.s.log.Warn("retention: no election session (retrying)", "err", err)
			_ = sleep(ctx, m.r.Interval)
			continue
		}
		e := concurrency.NewElection(sess, m.s.meta+electionDir)
		if err := e.Campaign(ctx, m.id); err != nil {
			_ = sess.Close() // the campaign ended (ctx or the session): revoke what is left
			if ctx.Err() == nil {
				m.s.log.Warn("retention: election campaign failed (retrying)", "err", err)
				_ = sleep(ctx, m.r.Interval)
			}
			continue
		}
		m.setLeader(true)
		m.s.log.Info("retention: this replica compacts etcd", "retention", m.r.Duration.String(), "revisions", m.r.Revisions)
		select {
		case <-ctx.Done():
		case <-sess.Done():
			m.s.log.Warn("retention: lost the compactor's lease; campaigning again")
		}
		m.setLeader(false)
		rctx, cancel := context.WithTimeout(m.s.ctx, m.s.cfg.RequestTimeout)
		_ = e.Resign(rctx) // best effort: the lease's revocation below ends it too
		cancel()
		_ = sess.Close()
	}
}

// round is one maintenance round.
func (m *maintainer) round(ctx context.Context) {
	nospace := m.observe(ctx)
	if !m.r.Off && (m.isLeader() || nospace && m.noCompactor(ctx)) {
		m.compact(ctx, nospace)
	}
	m.s.updateStorage(func(st *store.Storage) { st.Checks++ })
}

// noCompactor reports that no replica holds the election. Under NOSPACE none
// can win it (a campaign is a write), so every replica that sees the alarm
// then frees the space itself: compactions and defragmentations repeated by
// two replicas do no harm.
func (m *maintainer) noCompactor(ctx context.Context) bool {
	cctx, cancel := m.s.callCtx(ctx)
	defer cancel()
	resp, err := m.s.cli.Get(cctx, m.s.meta+electionDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count > 0 {
		return false
	}
	m.s.log.Warn("retention: etcd is out of space and no replica compacts (none can be elected while writes are refused): freeing space from this one")
	return true
}

// observe reads the members' database sizes and the cluster's alarms into
// Storage, logs alarms as they come and go, and reports a NOSPACE alarm.
func (m *maintainer) observe(ctx context.Context) (nospace bool) {
	s := m.s
	var size, inUse, quota int64
	for _, ep := range s.cli.Endpoints() {
		cctx, cancel := s.callCtx(ctx)
		st, err := s.cli.Status(cctx, ep)
		cancel()
		if err != nil {
			s.log.Debug("retention: no status from an endpoint", "endpoint", ep, "err", err)
			continue
		}
		if st.DbSize > size {
			size, inUse, quota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
		}
	}
	var alarms []string
	cctx, cancel := s.callCtx(ctx)
	resp, err := s.cli.AlarmList(cctx)
	cancel()
	if err == nil {
		for _, a := range resp.Alarms {
			alarms = append(alarms, fmt.Sprintf("%s (member %x)", a.Alarm, a.MemberID))
			nospace = nospace || a.Alarm == pb.AlarmType_NOSPACE
		}
		slices.Sort(alarms)
		if !slices.Equal(alarms, m.alarms) {
			if len(alarms) > 0 {
				s.log.Error("etcd raised alarms: a NOSPACE alarm refuses every write until space is freed and the alarm disarmed (docs/storage.md)",
					"alarms", alarms, "db_size", size, "db_size_quota", quota)
			} else {
				s.log.Info("etcd alarms cleared", "was", m.alarms)
			}
			m.alarms = alarms
		}
	} else {
		alarms = m.alarms // keep what was last seen
	}
	oldest := int64(0)
	cctx, cancel = s.callCtx(ctx)
	if g, err := s.cli.Get(cctx, s.meta+compactedKey); err == nil && len(g.Kvs) > 0 {
		oldest, _ = strconv.ParseInt(string(g.Kvs[0].Value), 10, 64)
	}
	cancel()
	s.updateStorage(func(st *store.Storage) {
		if size > 0 {
			st.DBSize, st.DBSizeInUse, st.DBSizeQuota = size, inUse, quota
		}
		st.Alarms = alarms
		st.OldestRevision = max(st.OldestRevision, oldest)
	})
	return nospace
}

// sample is one revision-time sample: etcd was at rev at time at.
type sample struct {
	key string
	rev int64
	at  time.Time
}

// compact records a sample when one is due, compacts to the newer of the
// two bounds when it moved enough (or under NOSPACE), defragments, prunes
// the samples no bound needs any more, and disarms NOSPACE once there is
// room again.
func (m *maintainer) compact(ctx context.Context, nospace bool) {
	s, r := m.s, m.r
	cctx, cancel := s.callCtx(ctx)
	resp, err := s.cli.Txn(cctx).Then(
		clientv3.OpGet(s.meta+clockDir, clientv3.WithPrefix()),
		clientv3.OpGet(s.meta+compactedKey)).Commit()
	cancel()
	if err != nil {
		s.log.Warn("retention: reading the samples", "err", err)
		return
	}
	cur := resp.Header.Revision
	var samples []sample
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		rev, err1 := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), s.meta+clockDir), 10, 64)
		at, err2 := time.Parse(time.RFC3339Nano, string(kv.Value))
		if err1 == nil && err2 == nil {
			samples = append(samples, sample{key: string(kv.Key), rev: rev, at: at})
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		if rev, err := strconv.ParseInt(string(kvs[0].Value), 10, 64); err == nil {
			m.compacted = max(m.compacted, rev)
		}
	}
	now := r.Now()
	if n := len(samples); (n == 0 || now.Sub(samples[n-1].at) >= r.SampleInterval) && cur != m.lastSample && !nospace {
		at := now.UTC()
		if n > 0 && at.Before(samples[n-1].at) {
			at = samples[n-1].at // recorded times never go backwards
		}
		key := fmt.Sprintf("%s%s%020d", s.meta, clockDir, cur)
		cctx, cancel := s.callCtx(ctx)
		pr, err := s.cli.Put(cctx, key, at.Format(time.RFC3339Nano))
		cancel()
		if err != nil {
			s.log.Warn("retention: recording a revision-time sample", "err", err)
		} else {
			m.lastSample = pr.Header.Revision
			samples = append(samples, sample{key: key, rev: cur, at: at})
		}
	}
	// The time bound: the newest sample at least Duration old (etcd was at
	// its revision then, or later), 0 when there is none yet.
	anchor, byTime := -1, int64(0)
	for i, sm := range samples {
		if !sm.at.After(now.Add(-r.Duration)) {
			anchor, byTime = i, sm.rev
		}
	}
	byCount := cur - r.Revisions
	target := max(byTime, byCount)
	if target > 1 && (target-m.compacted >= r.CompactStep || nospace && target > m.compacted) {
		m.compactTo(ctx, target, byTime, byCount, nospace)
	}
	if anchor > 0 {
		// Samples before the anchor bound nothing any more.
		cctx, cancel := s.callCtx(ctx)
		_, err := s.cli.Delete(cctx, s.meta+clockDir, clientv3.WithRange(samples[anchor].key))
		cancel()
		if err != nil {
			s.log.Warn("retention: pruning samples", "err", err)
		}
	}
	if nospace {
		m.defrag(ctx, true)
		m.disarm(ctx)
	}
}

// compactTo compacts etcd to target and records it, then defragments.
func (m *maintainer) compactTo(ctx context.Context, target, byTime, byCount int64, nospace bool) {
	s := m.s
	cctx, cancel := context.WithTimeout(ctx, defragTimeout)
	_, err := s.cli.Compact(cctx, target, clientv3.WithCompactPhysical())
	cancel()
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		// Another compactor (a lost lease's) got there first.
	case err != nil:
		s.log.Warn("retention: compaction failed", "revision", target, "err", err)
		return
	default:
		s.updateStorage(func(st *store.Storage) { st.Compactions++ })
		s.log.Info("retention: compacted etcd", "revision", target, "by_time", byTime, "by_count", byCount)
	}
	m.compacted = max(m.compacted, target)
	if !nospace { // a NOSPACE etcd refuses the put; the next round records it
		cctx, cancel := s.callCtx(ctx)
		_, err = s.cli.Put(cctx, s.meta+compactedKey, strconv.FormatInt(m.compacted, 10))
		cancel()
		if err != nil {
			s.log.Warn("retention: recording the compacted revision", "err", err)
		}
	}
	s.updateStorage(func(st *store.Storage) { st.OldestRevision = max(st.OldestRevision, m.compacted) })
	m.defrag(ctx, false)
}

// defrag defragments each endpoint's member when r.Defrag and its free pages
// are worth it (or force), one member at a time.
func (m *maintainer) defrag(ctx context.Context, force bool) {
	s := m.s
	if !m.r.Defrag {
		return
	}
	for _, ep := range s.cli.Endpoints() {
		cctx, cancel := s.callCtx(ctx)
		st, err := s.cli.Status(cctx, ep)
		cancel()
		if err != nil {
			continue
		}
		free := st.DbSize - st.DbSizeInUse
		if !force && free < m.r.DefragMinFree {
			continue
		}
		cctx, cancel = context.WithTimeout(ctx, defragTimeout)
		_, err = s.cli.Defragment(cctx, ep)
		cancel()
		if err != nil {
			s.log.Warn("retention: defragmentation failed", "endpoint", ep, "err", err)
			continue
		}
		s.updateStorage(func(st *store.Storage) { st.Defrags++ })
		s.log.Info("retention: defragmented etcd", "endpoint", ep, "db_size_before", st.DbSize, "free_before", free)
	}
}

// disarm disarms NOSPACE alarms once every member's database is below 90% of
// its quota again (etcd's own procedure: compact, defragment, disarm).
func (m *maintainer) disarm(ctx context.Context) {
	s := m.s
	for _, ep := range s.cli.Endpoints() {
		cctx, cancel := s.callCtx(ctx)
		st, err := s.cli.Status(cctx, ep)
		cancel()
		if err != nil || st.DbSizeQuota == 0 || st.DbSize >= st.DbSizeQuota/10*9 {
			return
		}
	}
	cctx, cancel := s.callCtx(ctx)
	resp, err := s.cli.AlarmList(cctx)
	cancel()
	if err != nil {
		return
	}
	for _, a := range resp.Alarms {
		if a.Alarm != pb.AlarmType_NOSPACE {
			continue
		}
		cctx, cancel := s.callCtx(ctx)
		_, err := s.cli.AlarmDisarm(cctx, (*clientv3.AlarmMember)(a))
		cancel()
		if err != nil {
			s.log.Warn("retention: disarming NOSPACE", "member", fmt.Sprintf("%x", a.MemberID), "err", err)
			continue
		}
		s.log.Warn("retention: disarmed etcd's NOSPACE alarm after compaction and defragmentation", "member", fmt.Sprintf("%x", a.MemberID))
	}
}
