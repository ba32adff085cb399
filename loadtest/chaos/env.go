package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
)

// env is what a run drives: an etcd cluster embedded in this process, a
// proxy in front of member 0, the verdictd replicas, and an admin etcd client.
//
// Topology (3 members): r0 talks to m0 only, through the proxy (so that
// "partition r0" is stopping m0, or blackholing the proxy); r1 talks to m1 and
// m2 (it survives either one's loss). With one member, both talk to it.
type env struct {
	dir      string
	cluster  *embedetcd.Cluster
	proxy    *embedetcd.Proxy
	replicas []*replica
	admin    *clientv3.Client
	prefix   string

	mu          sync.Mutex
	blackholed  bool
	compactions int
}

// newEnv starts the cluster and the replicas, and waits until every replica
// serves; each replica gets the verdictd flags extra besides its own. On
// error everything started is stopped.
func newEnv(ctx context.Context, dir, bin string, members, replicas int, extra ...string) (_ *env, err error) {
	e := &env{dir: dir, prefix: store.DefaultPrefix + "/"}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.cluster, err = embedetcd.StartCluster(ctx, members, filepath.Join(dir, "etcd")); err != nil {
		return nil, err
	}
	if e.proxy, err = embedetcd.NewProxy(e.cluster.Members[0].Endpoints()[0]); err != nil {
		return nil, err
	}
	e.admin, err = clientv3.New(clientv3.Config{Endpoints: e.cluster.Endpoints(), DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	for i := range replicas {
		eps := []string{e.proxy.Endpoint()}
		if i > 0 && members > 1 {
			eps = nil
			for _, m := range e.cluster.Members[1:] {
				eps = append(eps, m.Endpoints()...)
			}
		}
		r, err := newReplica(fmt.Sprintf("r%d", i), bin, dir, eps, extra)
		if err != nil {
			return nil, err
		}
		e.replicas = append(e.replicas, r)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(e.replicas))
	for i, r := range e.replicas {
		wg.Go(func() { errs[i] = r.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return e, nil
}

// close stops everything; safe on a partly started env.
func (e *env) close() {
	var wg sync.WaitGroup
	for _, r := range e.replicas {
		wg.Go(r.stop)
	}
	wg.Wait()
	if e.admin != nil {
		_ = e.admin.Close()
	}
	if e.proxy != nil {
		_ = e.proxy.Close()
	}
	if e.cluster != nil {
		_ = e.cluster.Close()
	}
}

// etcdReachable reports whether replica i has a running member to talk to.
func (e *env) etcdReachable(i int) bool {
	e.mu.Lock()
	blackholed := e.blackholed
	e.mu.Unlock()
	if i == 0 || len(e.cluster.Members) == 1 {
		return !blackholed && e.cluster.Members[0].Running()
	}
	for _, m := range e.cluster.Members[1:] {
		if m.Running() {
			return true
		}
	}
	return false
}

// waitLeader waits until the cluster has a leader.
func (e *env) waitLeader(ctx context.Context, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	for {
		if l := e.cluster.Leader(); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return -1, fmt.Errorf("no etcd leader after %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// etcdState reads every key under the prefix at one revision and computes
// the digest engine.Snapshot.Digest documents, from etcd's raw bytes: the hex
// SHA-256 of, in key byte order, key + " " + hex(SHA-256(value)) + "\n", the
// key without the prefix.
func (e *env) etcdState(ctx context.Context) (etcdState, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := e.admin.Get(cctx, e.prefix, clientv3.WithPrefix())
	if err != nil {
		return etcdState{}, err
	}
	st := etcdState{Revision: resp.Header.Revision, Values: map[string][]byte{}, ModRevisions: map[string]int64{}}
	for _, kv := range resp.Kvs {
		path := strings.TrimPrefix(string(kv.Key), e.prefix)
		st.Values[path] = kv.Value
		st.ModRevisions[path] = kv.ModRevision
	}
	st.Digest = Digest(st.Values)
	return st, nil
}

// etcdState is etcd's contents under the prefix at one revision.
type etcdState struct {
	Revision     int64
	Digest       string
	Values       map[string][]byte // path → value
	ModRevisions map[string]int64
}

// Digest is engine.Snapshot.Digest computed from raw stored values (path,
// without prefix → bytes).
func Digest(values map[string][]byte) string {
	paths := make([]string, 0, len(values))
	for p := range values {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	d := sha256.New()
	for _, p := range paths {
		h := sha256.Sum256(values[p])
		d.Write([]byte(p + " " + hex.EncodeToString(h[:]) + "\n"))
	}
	return hex.EncodeToString(d.Sum(nil))
}

// compact compacts etcd at its current revision (physically, as an operator's
// aggressive compaction would), and returns that revision.
func (e *env) compact(ctx context.Context) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := e.admin.Get(cctx, "compaction-probe")
	if err != nil {
		return 0, err
	}
	if _, err := e.admin.Compact(cctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return 0, err
	}
	e.mu.Lock()
	e.compactions++
	e.mu.Unlock()
	return resp.Header.Revision, nil
}

// putRaw writes a value under the prefix as etcdctl would: no encoding, no
// validation.
func (e *env) putRaw(ctx context.Context, path string, value []byte) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := e.admin.Put(cctx, e.prefix+path, string(value))
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// makeDir returns dir, or a new temporary directory and its removal.
func makeDir(dir string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, os.MkdirAll(dir, 0o755)
	}
	d, err := os.MkdirTemp("", "verdict-chaos")
	if err != nil {
		return "", nil, err
	}
	return d, func() { os.RemoveAll(d) }, nil
}
