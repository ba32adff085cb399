package peers

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Peer is one implementation in the comparison.
type Peer struct {
	Name string
	// Combine of the sets the peer decides: verdict, the scan and OPA on
	// FirstMatch sets, Cedar (and verdict again, as its reference) on
	// DenyOverrides sets.
	Combine resource.Combine
	// Reference is the peer whose outcomes and times this one is compared with;
	// "" for a reference.
	Reference string
	build     func(ctx context.Context, set *policygen.Set, prog *Program) (Decider, error)
}

// The peers' names.
const (
	VerdictName        = "verdict"
	VerdictNoCacheName = "verdict/no-cache"
	VerdictDenyName    = "verdict/deny-overrides"
	LinearName         = "linear-scan"
	OPARulesName       = "opa-rules"
	OPADataName        = "opa-data"
	CedarName          = "cedar-go"
	QuickName          = "quick-index"
	QuickDenyName      = "quick-index/deny-overrides"
)

// The seeds of the compared sets and flows (the engine's benchmarks use the same).
const (
	generatorSeed = 1
	flowSeed      = 2
)

// Peers returns the implementations compared, each reference before the peers
// compared with it.
func Peers() []Peer {
	verdict := func(_ context.Context, set *policygen.Set, _ *Program) (Decider, error) {
		return NewVerdict(set, false), nil
	}
	quick := func(_ context.Context, set *policygen.Set, _ *Program) (Decider, error) {
		q, err := policygen.NewQuickIndex(set)
		if err != nil {
			return nil, err
		}
		return quickIndex{q}, nil
	}
	return []Peer{
		{Name: VerdictName, Combine: resource.FirstMatch, build: verdict},
		{Name: VerdictNoCacheName, Combine: resource.FirstMatch, Reference: VerdictName,
			build: func(_ context.Context, set *policygen.Set, _ *Program) (Decider, error) {
				return NewVerdict(set, true), nil
			}},
		{Name: LinearName, Combine: resource.FirstMatch, Reference: VerdictName,
			build: func(_ context.Context, _ *policygen.Set, p *Program) (Decider, error) { return NewLinear(p), nil }},
		{Name: OPARulesName, Combine: resource.FirstMatch, Reference: VerdictName,
			build: func(ctx context.Context, _ *policygen.Set, p *Program) (Decider, error) { return NewOPARules(ctx, p) }},
		{Name: OPADataName, Combine: resource.FirstMatch, Reference: VerdictName,
			build: func(ctx context.Context, _ *policygen.Set, p *Program) (Decider, error) { return NewOPAData(ctx, p) }},
		{Name: QuickName, Combine: resource.FirstMatch, Reference: VerdictName, build: quick},
		{Name: VerdictDenyName, Combine: resource.DenyOverrides, build: verdict},
		{Name: QuickDenyName, Combine: resource.DenyOverrides, Reference: VerdictDenyName, build: quick},
		{Name: CedarName, Combine: resource.DenyOverrides, Reference: VerdictDenyName,
			build: func(_ context.Context, _ *policygen.Set, p *Program) (Decider, error) { return NewCedar(p) }},
	}
}

// Build translates the set and builds the peer from it.
func (p Peer) Build(ctx context.Context, set *policygen.Set) (Decider, error) {
	prog, err := Translate(set)
	if err != nil {
		return nil, err
	}
	return p.build(ctx, set, prog)
}

// SetConfig is the generator configuration of the compared sets: every generated
// feature, no scopes (so both sides of a flow see the same rules). The two
// combining algorithms give the same policies: Combine only changes the mesh.
// The profile is policygen's: Sparse (few candidate rules per flow) or Dense
// (tens to hundreds of matching rules per flow: issue 19's shape).
func SetConfig(profile policygen.Profile, policies int, combine resource.Combine) policygen.Config {
	return policygen.Config{Seed: generatorSeed, Policies: policies, Combine: combine, Profile: profile}
}

// Flows returns the compared flows of a set of that size.
func Flows(profile policygen.Profile, policies, n int) []engine.Request {
	return policygen.Generate(SetConfig(profile, policies, resource.FirstMatch)).Flows(flowSeed, n)
}

// Profiles are the generator profiles compared, by the name the command and
// the benchmarks use.
var Profiles = []struct {
	Name    string
	Profile policygen.Profile
}{{"sparse", policygen.Sparse}, {"dense", policygen.Dense}}

// ParseProfile returns the profile of that name.
func ParseProfile(name string) (policygen.Profile, error) {
	for _, p := range Profiles {
		if p.Name == name {
			return p.Profile, nil
		}
	}
	return 0, fmt.Errorf("unknown profile %q (have sparse, dense)", name)
}

// ErrTooSlow is returned when a peer exceeds a time limit: loading, or one decision.
var ErrTooSlow = errors.New("over the time limit")

// Loaded is a peer loaded with a set.
type Loaded struct {
	Decider  Decider
	LoadTime time.Duration // translation and the peer's own build, generation excluded
	// Heap is the heap the peer keeps after the load (live bytes after a GC,
	// relative to before the set was generated), the parts of the generated set
	// it still references included.
	Heap int64
}

// Load generates the set of that size for the peer and builds the peer from it,
// measuring the time and the heap it keeps. A build over limit is abandoned
// (its goroutine still runs to its end) and reported as ErrTooSlow.
func Load(ctx context.Context, p Peer, profile policygen.Profile, policies int, limit time.Duration) (*Loaded, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	set := policygen.Generate(SetConfig(profile, policies, p.Combine))
	type result struct {
		d   Decider
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		d, err := p.Build(ctx, set)
		done <- result{d, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(limit):
		return nil, fmt.Errorf("%s: loading %d policies: %w (%s)", p.Name, policies, ErrTooSlow, limit)
	}
	l := &Loaded{Decider: res.d, LoadTime: time.Since(start)}
	if res.err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, res.err)
	}
	set = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	l.Heap = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	return l, nil
}

// DecideAll decides flows in order until all are decided or budget has passed,
// but at least min of them. One decision over limit stops it with ErrTooSlow.
func DecideAll(d Decider, flows []engine.Request, min int, budget, limit time.Duration) ([]Outcome, error) {
	out := make([]Outcome, 0, len(flows))
	start := time.Now()
	for i := range flows {
		if i >= min && time.Since(start) > budget {
			break
		}
		t := time.Now()
		o, err := d.Decide(&flows[i])
		if err != nil {
			return out, err
		}
		if el := time.Since(t); el > limit {
			return out, fmt.Errorf("one decision took %s: %w (%s)", el.Round(time.Millisecond), ErrTooSlow, limit)
		}
		out = append(out, o)
	}
	return out, nil
}

// Mismatch is a flow on which a peer and its reference disagree.
type Mismatch struct {
	Flow      int
	Want, Got Outcome
}

// Agreement compares a peer's outcomes with its reference's on the same flows
// (got may be shorter than want). Actions must agree and so must the deciding
// policies: for first-match peers the first matching rule, for Cedar the first
// rule in order among those with the winning effect.
type Agreement struct {
	Compared             int
	Allow, Deny, Matched int // the reference's outcomes on the compared flows
	Mismatches           []Mismatch
}

// Agree compares got with want.
func Agree(want, got []Outcome) Agreement {
	a := Agreement{Compared: min(len(want), len(got))}
	for i := 0; i < a.Compared; i++ {
		w := want[i]
		switch w.Action {
		case resource.Allow:
			a.Allow++
		case resource.Deny:
			a.Deny++
		}
		if w.Policy != "" {
			a.Matched++
		}
		if w != got[i] {
			a.Mismatches = append(a.Mismatches, Mismatch{Flow: i, Want: w, Got: got[i]})
		}
	}
	return a
}

func (a Agreement) String() string {
	pct := func(n int) float64 { return 100 * float64(n) / float64(max(a.Compared, 1)) }
	return fmt.Sprintf("%d flows: %.1f%% ALLOW, %.1f%% DENY, %.1f%% matched a policy, %d disagree",
		a.Compared, pct(a.Allow), pct(a.Deny), pct(a.Matched), len(a.Mismatches))
}

// Timing is a peer's measured decision cost.
type Timing struct {
	Ops           int
	NsPerOp       float64
	AllocsPerOp   float64
	BytesPerOp    float64
	Elapsed       time.Duration
	LimitExceeded bool // one decision took more than the limit; Ops == 1
}

// Time decides the flows round-robin, in batches doubling from one, until
// budget has passed or maxOps decisions were made (at least one). When the
// first decision takes over limit it stops there with LimitExceeded. A warm-up
// of a tenth of the budget (at least one decision) comes first, untimed.
func Time(d Decider, flows []engine.Request, maxOps int, budget, limit time.Duration) (Timing, error) {
	var t Timing
	warm := time.Now()
	for i := 0; i == 0 || i < len(flows) && time.Since(warm) < budget/10; i++ {
		if _, err := d.Decide(&flows[i]); err != nil {
			return t, err
		}
		if i == 0 && time.Since(warm) > limit {
			t.Ops, t.Elapsed, t.LimitExceeded = 1, time.Since(warm), true
			t.NsPerOp = float64(t.Elapsed.Nanoseconds())
			return t, nil
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for batch := 1; ; batch = min(batch*2, 1<<16) {
		n := min(batch, maxOps-t.Ops)
		if t.Ops > 0 { // do not overshoot the budget by much
			perOp := t.Elapsed / time.Duration(t.Ops)
			n = max(1, min(n, int((budget-t.Elapsed)/max(perOp, 1))+1))
		}
		for j := 0; j < n; j++ {
			if _, err := d.Decide(&flows[(t.Ops+j)%len(flows)]); err != nil {
				return t, err
			}
		}
		t.Ops += n
		t.Elapsed = time.Since(start)
		if t.Ops == 1 && t.Elapsed > limit {
			t.LimitExceeded = true
			break
		}
		if t.Elapsed >= budget || t.Ops >= maxOps {
			break
		}
	}
	runtime.ReadMemStats(&after)
	t.NsPerOp = float64(t.Elapsed.Nanoseconds()) / float64(t.Ops)
	t.AllocsPerOp = float64(after.Mallocs-before.Mallocs) / float64(t.Ops)
	t.BytesPerOp = float64(after.TotalAlloc-before.TotalAlloc) / float64(t.Ops)
	return t, nil
}

// quickIndex is policygen.QuickIndex, the engine benchmarks' honest baseline: an
// inverted index written in two hours (posting lists per tag, verify, best rank).
type quickIndex struct{ q *policygen.QuickIndex }

// Decide implements Decider.
func (q quickIndex) Decide(req *engine.Request) (Outcome, error) {
	o := q.q.Decide(req)
	return Outcome{Action: o.Action, Policy: o.Policy}, nil
}
