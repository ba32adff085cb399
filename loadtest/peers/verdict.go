package peers

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
)

// Verdict is verdict's engine: a snapshot built from the set's resources.
type Verdict struct{ snap *engine.Snapshot }

// NewVerdict builds the engine's snapshot of the set.
func NewVerdict(set *policygen.Set) *Verdict {
	return &Verdict{snap: engine.Build(1, set.Resources)}
}

// Decide implements Decider.
func (v *Verdict) Decide(req *engine.Request) (Outcome, error) {
	d, err := v.snap.Decide(req)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Action: d.Action, Policy: d.Policy}, nil
}
