package etcd

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The fleet (docs/analysis.md, "The fleet"): each replica registers under
// the meta prefix, replicas/<id> = {address}, on a lease of its own that it
// keeps alive; the key goes with the replica — at once when it stops, within
// the lease's TTL when it dies. Replicas lists those alive.

const replicasDir = "replicas/" // under the meta prefix

// DefaultReplicaTTL is the lease of a registration: a replica that dies is
// listed at most this long.
const DefaultReplicaTTL = 10 * time.Second

// Replica is one live replica: its id, the address it advertises, and the
// revision it registered at.
type Replica struct {
	ID       string `json:"-"`
	Address  string `json:"address"`
	Revision int64  `json:"-"`
}

// Register registers a replica as id, advertising addr, until ctx ends
// (then the registration is revoked); a registration lost (etcd
// unreachable beyond the lease's TTL) is made again. It blocks, and returns
// only once ctx ends. ttl 0 is DefaultReplicaTTL.
func (s *Store) Register(ctx context.Context, id, addr string, ttl time.Duration) {
	if ttl <= 0 {
		ttl = DefaultReplicaTTL
	}
	key := s.meta + replicasDir + id
	val, _ := json.Marshal(Replica{Address: addr}) // cannot fail: a string field
	for ctx.Err() == nil {
		// The session outlives ctx so that its lease is revoked on the way out.
		sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(s.ctx))
		if err != nil {
			s.log.Warn("fleet: no lease to register this replica with (retrying)", "err", err)
			_ = sleep(ctx, time.Second)
			continue
		}
		cctx, cancel := s.callCtx(ctx)
		resp, err := s.cli.Put(cctx, key, string(val), clientv3.WithLease(sess.Lease()))
		cancel()
		if err == nil {
			s.seen(resp.Header.Revision) // the store's revision is past this write
		}
		if err != nil {
			_ = sess.Close()
			if ctx.Err() == nil {
				s.log.Warn("fleet: registering this replica failed (retrying)", "err", err)
				_ = sleep(ctx, time.Second)
			}
			continue
		}
		s.log.Info("fleet: registered", "id", id, "address", addr)
		select {
		case <-ctx.Done():
		case <-sess.Done():
			s.log.Warn("fleet: lost this replica's registration; registering again")
		}
		_ = sess.Close() // revokes the lease, and the key with it
	}
}

// Replicas lists the live replicas, by id.
func (s *Store) Replicas(ctx context.Context) ([]Replica, error) {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	prefix := s.meta + replicasDir
	resp, err := s.cli.Get(cctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, mapErr("list the replicas", err)
	}
	out := make([]Replica, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r Replica
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			s.log.Warn("fleet: a registration that is not one (skipped)", "key", string(kv.Key), "err", err)
			continue
		}
		r.ID, r.Revision = strings.TrimPrefix(string(kv.Key), prefix), kv.ModRevision
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Register waits for the connection, then runs the store's Register.
func (l *Lazy) Register(ctx context.Context, id, addr string, ttl time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-l.ready:
	}
	l.s.Register(ctx, id, addr, ttl)
}

// Replicas is the connected store's Replicas; ErrUnavailable before the
// connection.
func (l *Lazy) Replicas(ctx context.Context) ([]Replica, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.Replicas(ctx)
}
