package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/verdictpdp/verdict/internal/listen"
)

// Cluster is an n-member etcd cluster on loopback, for tests: fast elections,
// no fsync, quiet.
type Cluster struct {
	Members []*Etcd
}

// StartCluster starts n members with data directories under dir and waits
// until every one serves clients or ctx ends.
func StartCluster(ctx context.Context, n int, dir string) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: a cluster needs at least one member, not %d", ErrInvalidConfig, n)
	}
	for attempt := 0; ; attempt++ {
		c, err := startCluster(ctx, n, filepath.Join(dir, fmt.Sprintf("try%d", attempt)))
		if err == nil {
			return c, nil
		}
		if !isBindConflict(err) || attempt >= 5 {
			return nil, err
		}
	}
}

func startCluster(ctx context.Context, n int, dir string) (*Cluster, error) {
	ports, err := listen.FreePorts(3 * n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	cfgs := make([]Config, n)
	var initial []string
	for i := range cfgs {
		cfgs[i] = Config{
			Name:         fmt.Sprintf("m%d", i),
			Dir:          filepath.Join(dir, fmt.Sprintf("m%d", i)),
			ClientURL:    LoopbackURL(ports[3*i]),
			PeerURL:      LoopbackURL(ports[3*i+1]),
			HTTPURL:      LoopbackURL(ports[3*i+2]),
			Fast:         true,
			NoFsync:      true,
			ClusterToken: filepath.Base(dir) + "-" + fmt.Sprint(ports[0]),
		}
		initial = append(initial, cfgs[i].Name+"="+cfgs[i].PeerURL)
	}
	c := &Cluster{}
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(initial, ",")
		m := &Etcd{cfg: cfgs[i]}
		// Members wait for each other: start all, then wait.
		if err := m.start(ctx, false); err != nil {
			return nil, errors.Join(err, c.Close())
		}
		c.Members = append(c.Members, m)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Go(func() { errs[i] = m.waitReady(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Endpoints()...)
	}
	return out
}

// Leader returns the index of the running member that is the leader, or -1.
func (c *Cluster) Leader() int {
	for i, m := range c.Members {
		if m.IsLeader() {
			return i
		}
	}
	return -1
}

// Close stops every member.
func (c *Cluster) Close() error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Members))
	for i, m := range c.Members {
		wg.Go(func() { errs[i] = m.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Lingering names the functions of goroutines that can outlive a stopped
// cluster member for up to etcd's peer read timeout (5 s): the standard
// library's HTTP/1 connections of etcd's peer transport, whose pending reads
// etcd's timeout listener keeps re-arming. Leak checks around clusters ignore
// them (goleak.IgnoreAnyFunction); verdict itself uses no HTTP/1.
func Lingering() []string {
	return []string{
		"net/http.(*persistConn).readLoop",
		"net/http.(*persistConn).writeLoop",
		"net/http.(*conn).serve",
		"net/http.(*connReader).backgroundRead",
	}
}
