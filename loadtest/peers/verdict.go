package peers

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
)

// Verdict is verdict's engine: a snapshot built from the set's resources. With
// NoCache, every decision scans (the snapshot's decision cache is bypassed).
type Verdict struct {
	snap    *engine.Snapshot
	noCache bool
}

// NewVerdict builds the engine's snapshot of the set.
func NewVerdict(set *policygen.Set, noCache bool) *Verdict {
	return &Verdict{snap: engine.Build(1, set.Resources), noCache: noCache}
}

// Decide implements Decider.
func (v *Verdict) Decide(req *engine.Request) (Outcome, error) {
	if v.noCache && !req.NoCache {
		r := *req
		r.NoCache = true
		req = &r
	}
	d, err := v.snap.Decide(req)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Action: d.Action, Policy: d.Policy}, nil
}
