package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Fault is one kind of step of a schedule.
type Fault string

// Faults.
const (
	// Steady: no fault; the load runs for Hold.
	Steady Fault = "steady"
	// KillLeader hard-stops the etcd leader (no leadership transfer), and
	// restarts it after Hold.
	KillLeader Fault = "kill-etcd-leader"
	// KillFollower hard-stops a follower (one r1 talks to, when it can), and
	// restarts it after Hold.
	KillFollower Fault = "kill-etcd-follower"
	// Partition cuts replica r0 from etcd by stopping the member it talks to
	// (m0), and heals after Hold.
	Partition Fault = "partition-replica"
	// Blackhole leaves r0's connection to etcd open but silent (a network
	// partition: no error, only silence), and heals after Hold.
	Blackhole Fault = "blackhole-replica"
	// CompactWhilePartitioned stops m0 (r0 is cut off), writes Burst
	// policies, compacts etcd at its head every half second for Hold, then
	// restarts m0: r0 can only catch up by listing again.
	CompactWhilePartitioned Fault = "compact-while-partitioned"
	// Malformed writes values that do not decode straight into etcd (as
	// etcdctl could): replicas must skip them and keep following.
	Malformed Fault = "malformed-values"
	// KillReplica kills replica Replica with SIGKILL, waits Hold, and starts it
	// again: a cold start from etcd.
	KillReplica Fault = "kill-9-replica"
)

// Step is one fault, how long it lasts, and the steady time after it heals.
type Step struct {
	Fault   Fault         `json:"fault"`
	Hold    time.Duration `json:"hold"`
	After   time.Duration `json:"after"`
	Replica int           `json:"replica,omitempty"` // KillReplica
	Burst   int           `json:"burst,omitempty"`   // CompactWhilePartitioned
}

// FullSchedule is `make chaos`: every fault, each held for hold (blackhole and
// compaction longer, past the store's 6 s liveness timeout and the syncer's 10
// s stale restart), with after of steady load between them.
func FullSchedule(hold, after time.Duration) []Step {
	return []Step{
		{Fault: Steady, Hold: after},
		{Fault: KillLeader, Hold: hold, After: after},
		{Fault: KillFollower, Hold: hold, After: after},
		{Fault: Partition, Hold: hold, After: after},
		{Fault: Blackhole, Hold: max(hold, 10*time.Second), After: after},
		{Fault: CompactWhilePartitioned, Hold: max(hold, 12*time.Second), After: after, Burst: 200},
		{Fault: Malformed, After: after},
		{Fault: KillReplica, Replica: 1, Hold: 3 * time.Second, After: after},
		{Fault: KillReplica, Replica: 0, Hold: 3 * time.Second, After: after},
		{Fault: Steady, Hold: after},
	}
}

// SmokeSchedule is the short one `make test` runs: every fault but the
// blackhole once, briefly.
func SmokeSchedule() []Step {
	return []Step{
		{Fault: Steady, Hold: 2 * time.Second},
		{Fault: KillLeader, Hold: 2 * time.Second, After: 2 * time.Second},
		{Fault: KillFollower, Hold: 2 * time.Second, After: 2 * time.Second},
		{Fault: Partition, Hold: 2 * time.Second, After: 2 * time.Second},
		{Fault: CompactWhilePartitioned, Hold: 3 * time.Second, After: 2 * time.Second, Burst: 50},
		{Fault: Malformed, After: time.Second},
		{Fault: KillReplica, Replica: 1, Hold: time.Second, After: 2 * time.Second},
	}
}

// StepReport says what a step did and when (offsets from the run's start).
type StepReport struct {
	Step   int           `json:"step"`
	Fault  Fault         `json:"fault"`
	Target string        `json:"target,omitempty"`
	Start  time.Duration `json:"start"`
	Healed time.Duration `json:"healed,omitempty"`
	End    time.Duration `json:"end"`
	Note   string        `json:"note,omitempty"`
	Error  string        `json:"error,omitempty"`
	// Per replica, for the writes acknowledged during the step (fault and
	// steady time after it): the longest time served without one; and the
	// longest Status.stale = true run that began during the step.
	StaleServed map[string]time.Duration `json:"staleServed,omitempty"`
	StaleFlag   map[string]time.Duration `json:"staleFlag,omitempty"`
}

// phaseOf names step n's phase (after: its steady time after healing).
func phaseOf(n int, f Fault, after bool) string {
	if after {
		return fmt.Sprintf("%d %s (after)", n, f)
	}
	return fmt.Sprintf("%d %s", n, f)
}

// runStep applies one step; it returns when the fault has healed and the
// steady time after it has passed.
func (c *run) runStep(ctx context.Context, n int, s Step) StepReport {
	e := c.env
	rep := StepReport{Step: n, Fault: s.Fault, Start: c.since()}
	c.setPhase(phaseOf(n, s.Fault, false))
	heal := func() { rep.Healed = c.since() }
	var err error
	switch s.Fault {
	case Steady:
		sleepCtx(ctx, s.Hold)
	case KillLeader, KillFollower:
		var l int
		if l, err = e.waitLeader(ctx, 10*time.Second); err != nil {
			break
		}
		victim := l
		if s.Fault == KillFollower {
			victim = -1
			for _, i := range []int{2, 1, 0} { // one r1 talks to, if possible
				if i < len(e.cluster.Members) && i != l {
					victim = i
					break
				}
			}
			if victim < 0 {
				err = fmt.Errorf("a single member has no follower")
				break
			}
		}
		m := e.cluster.Members[victim]
		rep.Target = fmt.Sprintf("m%d (leader m%d)", victim, l)
		_ = m.Stop()
		sleepCtx(ctx, s.Hold)
		err = m.Restart(ctx)
		heal()
		if nl, lerr := e.waitLeader(ctx, 10*time.Second); lerr == nil {
			rep.Note = fmt.Sprintf("leader after: m%d", nl)
		}
	case Partition:
		m := e.cluster.Members[0]
		rep.Target = "r0 (stop m0)"
		_ = m.Stop()
		sleepCtx(ctx, s.Hold)
		err = m.Restart(ctx)
		heal()
	case Blackhole:
		rep.Target = "r0 (proxy to m0 silent)"
		e.mu.Lock()
		e.blackholed = true
		e.mu.Unlock()
		e.proxy.Blackhole()
		sleepCtx(ctx, s.Hold)
		e.proxy.Restore()
		e.mu.Lock()
		e.blackholed = false
		e.mu.Unlock()
		heal()
	case CompactWhilePartitioned:
		m := e.cluster.Members[0]
		rep.Target = "r0 (stop m0)"
		_ = m.Stop()
		for range s.Burst {
			c.writer.create(ctx)
		}
		deadline := time.Now().Add(s.Hold)
		var rev int64
		for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
			if r, cerr := e.compact(ctx); cerr == nil {
				rev = r
			}
			sleepCtx(ctx, 500*time.Millisecond)
		}
		rep.Note = fmt.Sprintf("%d writes while cut off, compacted up to revision %d", s.Burst, rev)
		err = m.Restart(ctx)
		heal()
	case Malformed:
		rep.Target = "etcd"
		revs := []int64{}
		// In a mesh of their own: an invalid policy closes its mesh and type
		// (fail closed, docs/storage.md), and must harm no other mesh — the
		// probes decide the default mesh throughout.
		for path, v := range map[string]string{
			"broken/policies/TrafficPermission/chaos-garbage": `{"kind":"Policy","name":`,
			"broken/policies/TrafficPermission/chaos-wrong":   `{"kind":"Policy","name":"not-its-key","sources":[{}],"destinations":[{}]}`,
			"chaos/not-a-key": "\xff\xfe",
		} {
			rev, perr := e.putRaw(ctx, path, []byte(v))
			if perr != nil {
				err = perr
			}
			revs = append(revs, rev)
		}
		for _, rev := range revs {
			c.obs.acked(rev, time.Now())
		}
		rep.Note = fmt.Sprintf("%d malformed values written", len(revs))
		heal()
	case KillReplica:
		r := e.replicas[s.Replica]
		rep.Target = r.name
		kerr := r.kill9()
		c.obs.down(r)
		sleepCtx(ctx, s.Hold)
		start := time.Now()
		err = errors.Join(kerr, r.start(ctx))
		rep.Note = fmt.Sprintf("cold start to SERVING in %v", time.Since(start).Round(time.Millisecond))
		heal()
	default:
		err = fmt.Errorf("unknown fault %q", s.Fault)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	c.setPhase(phaseOf(n, s.Fault, true))
	sleepCtx(ctx, s.After)
	rep.End = c.since()
	return rep
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
