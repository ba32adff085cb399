package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The writer's policies: w-<n> lets cw-<n> reach chaos-dst (created, and some
// deleted later); hot-<k> are updated again and again, each version naming
// its own source. Every op's effect is known, so the final state of etcd can
// be checked against every acknowledged write.
const (
	chaosDst  = "chaos-dst"
	hotKeys   = 8
	writeType = resource.DefaultType
)

// writer writes policies through the replicas' PolicyService and keeps a
// model of every op and its outcome.
type writer struct {
	e       *env
	obs     *observer
	timeout time.Duration

	mu      sync.Mutex
	seq     int
	created []string // acknowledged w-<n>, not yet chosen for deletion
	ops     map[string][]op
	stats   WriteStats
}

// op is one write of a key: a put of the policy whose source is src, or a
// delete; acked with the revision, or failed (its effect unknown).
type op struct {
	src   string // "" for a delete
	acked bool
	rev   int64
}

// WriteStats are the writer's figures.
type WriteStats struct {
	Attempted int64            `json:"attempted"`
	Acked     int64            `json:"acked"`
	Failed    int64            `json:"failed"` // no acknowledgment: the effect is unknown
	Retried   int64            `json:"retried"`
	Deletes   int64            `json:"deletes"`
	Errors    map[string]int64 `json:"errors,omitempty"` // attempts that failed, by code
	Lost      []string         `json:"lost,omitempty"`   // acknowledged writes etcd does not hold
	Probed    int              `json:"probed"`           // acknowledged writes checked with a Decide on every replica
}

func newWriter(e *env, obs *observer) *writer {
	return &writer{e: e, obs: obs, timeout: 2 * time.Second, ops: map[string][]op{}, stats: WriteStats{Errors: map[string]int64{}}}
}

// run writes at rate per second until ctx ends.
func (w *writer) run(ctx context.Context, rate float64) {
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.next(ctx)
	}
}

// next makes the next op of the mix: mostly creates, every 4th an update of
// a hot key, every 5th a delete of an acknowledged create.
func (w *writer) next(ctx context.Context) {
	w.mu.Lock()
	w.seq++
	n := w.seq
	var victim string
	if n%5 == 0 && len(w.created) > 0 {
		victim, w.created = w.created[0], w.created[1:]
	}
	w.mu.Unlock()
	switch {
	case victim != "":
		w.delete(ctx, victim)
	case n%4 == 0:
		w.put(ctx, fmt.Sprintf("hot-%d", n%hotKeys), fmt.Sprintf("hot-%d-v%d", n%hotKeys, n))
	default:
		w.create(ctx)
	}
}

// create writes a new w-<n>.
func (w *writer) create(ctx context.Context) {
	w.mu.Lock()
	w.seq++
	n := w.seq
	w.mu.Unlock()
	name := fmt.Sprintf("w-%d", n)
	if w.put(ctx, name, fmt.Sprintf("cw-%d", n)) {
		w.mu.Lock()
		w.created = append(w.created, name)
		w.mu.Unlock()
	}
}

func policyKey(name string) string {
	return resource.Key{Kind: resource.KindPolicy, Mesh: resource.DefaultMesh, Type: writeType, Name: name}.String()
}

func (w *writer) put(ctx context.Context, name, src string) bool {
	p := &resource.Policy{Mesh: resource.DefaultMesh, Type: writeType, Name: name, Action: resource.Allow,
		Sources:      []resource.Selector{{Match: map[string]string{resource.ServiceTag: src}}},
		Destinations: []resource.Selector{{Match: map[string]string{resource.ServiceTag: chaosDst}}}}
	res, err := apiconv.ResourceToProto(p)
	if err != nil {
		panic(err) // a constant policy that does not convert is a bug here
	}
	return w.do(ctx, policyKey(name), src, func(ctx context.Context, c *clients) (int64, error) {
		resp, err := c.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{res}})
		return resp.GetRevision(), err
	})
}

func (w *writer) delete(ctx context.Context, name string) {
	w.mu.Lock()
	w.stats.Deletes++
	w.mu.Unlock()
	w.do(ctx, policyKey(name), "", func(ctx context.Context, c *clients) (int64, error) {
		resp, err := c.pol.Delete(ctx, &verdictv1.DeleteRequest{Keys: []string{policyKey(name)}})
		if status.Code(err) == codes.NotFound {
			return 0, nil // an earlier attempt did it
		}
		return resp.GetRevision(), err
	})
}

// do sends one op to a replica that can reach etcd (another one if it
// fails, up to 3 attempts) and records its outcome.
func (w *writer) do(ctx context.Context, key, src string, send func(context.Context, *clients) (int64, error)) bool {
	w.mu.Lock()
	w.stats.Attempted++
	w.mu.Unlock()
	var rev int64
	err := fmt.Errorf("no replica to write to")
	for attempt := range 3 {
		if ctx.Err() != nil {
			break
		}
		r := w.target(attempt)
		if r == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, w.timeout)
		rev, err = send(cctx, r.current())
		cancel()
		if err == nil {
			break
		}
		w.mu.Lock()
		w.stats.Errors[status.Code(err).String()]++
		if attempt < 2 {
			w.stats.Retried++
		}
		w.mu.Unlock()
	}
	acked := err == nil
	at := time.Now()
	w.mu.Lock()
	w.ops[key] = append(w.ops[key], op{src: src, acked: acked, rev: rev})
	if acked {
		w.stats.Acked++
	} else {
		w.stats.Failed++
	}
	w.mu.Unlock()
	if acked {
		w.obs.acked(rev, at)
	}
	return acked
}

// target picks the replica for an attempt: live replicas that reach etcd,
// in turn.
func (w *writer) target(attempt int) *replica {
	var ok []*replica
	for i, r := range w.e.replicas {
		if r.isLive.Load() && w.e.etcdReachable(i) {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return ok[(w.seq+attempt)%len(ok)]
}

// check compares the model with etcd's contents: for every key, etcd must
// hold the effect of its last acknowledged op, or of an op after it whose
// outcome is unknown. It returns the keys that break this rule.
func (w *writer) check(st etcdState) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var lost []string
	keys := make([]string, 0, len(w.ops))
	for k := range w.ops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ops := w.ops[k]
		last := -1
		for i, o := range ops {
			if o.acked {
				last = i
			}
		}
		if last < 0 {
			continue // nothing acknowledged: anything goes
		}
		got, present := "", false
		if v, ok := st.Values[k]; ok {
			present = true
			got = sourceOf(v)
		}
		okState := false
		for i := last; i < len(ops); i++ {
			o := ops[i]
			if i > last && o.acked {
				break
			}
			if (o.src == "" && !present) || (o.src != "" && present && got == o.src) {
				okState = true
			}
		}
		if !okState {
			want := "absent"
			if ops[last].src != "" {
				want = ops[last].src
			}
			lost = append(lost, fmt.Sprintf("%s: etcd holds %q (present %v), the last acknowledged write (revision %d) made it %s",
				k, got, present, ops[last].rev, want))
		}
	}
	return lost
}

// sourceOf reads the first source's service tag of a stored policy.
func sourceOf(value []byte) string {
	var p struct {
		Sources []struct {
			Match map[string]string `json:"match"`
		} `json:"sources"`
	}
	if json.Unmarshal(value, &p) != nil || len(p.Sources) == 0 {
		return ""
	}
	return p.Sources[0].Match[resource.ServiceTag]
}

// probes returns up to n acknowledged final states to check with a Decide:
// the source of a present key, or of a deleted w-<n>.
func (w *writer) probes(n int) []probe {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []probe
	keys := make([]string, 0, len(w.ops))
	for k := range w.ops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ops := w.ops[k]
		o := ops[len(ops)-1]
		if !o.acked {
			continue
		}
		if o.src != "" {
			out = append(out, probe{key: k, src: o.src, present: true})
		} else if first := ops[0]; first.src != "" {
			out = append(out, probe{key: k, src: first.src})
		}
	}
	if len(out) > n {
		step := float64(len(out)) / float64(n)
		sample := make([]probe, 0, n)
		for i := range n {
			sample = append(sample, out[int(float64(i)*step)])
		}
		out = sample
	}
	return out
}

type probe struct {
	key     string
	src     string
	present bool // ALLOW by the key's policy; otherwise DENY (deleted)
}

func (w *writer) snapshotStats() WriteStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Errors = map[string]int64{}
	for k, v := range w.stats.Errors {
		s.Errors[k] = v
	}
	return s
}
