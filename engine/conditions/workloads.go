package conditions

// The conditions read off the inventory besides NoWorkloads (dead.go):
// Overridden / PartiallyEnforced for the types whose policies carry
// configuration, by Resolve's status over the inventory's workloads
// (docs/resolve.md).

import (
	"errors"
	"fmt"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// resolveState is a policy's state over the resolutions it appears in.
type resolveState struct {
	state   engine.PolicyState // 0: in none, or enforced in every one
	message string
}

// maxResolutions bounds the resolutions one judgement makes.
const maxResolutions = 2048

// judgeResolved settles Overridden and PartiallyEnforced from Resolve over
// the inventory: each workload as the destination, or for a type that
// needs both ends each pair of workloads (in name order, at most
// maxResolutions). A policy overridden in every resolution it appears in
// is Overridden; one overridden in some, or partly in one, is
// PartiallyEnforced.
func (j *judgement) judgeResolved(list []*inventory.WorkloadEntry) {
	st, s := j.st, j.s
	type tally struct {
		seen, enforced, overridden int
		why                        string
	}
	tallies := map[string]*tally{}
	count := func(r *engine.Resolution, where string) {
		if r == nil {
			return
		}
		for _, ps := range r.Status {
			if ps.State == engine.Audited {
				continue
			}
			t := tallies[ps.Policy]
			if t == nil {
				t = &tally{}
				tallies[ps.Policy] = t
			}
			t.seen++
			switch ps.State {
			case engine.Enforced:
				t.enforced++
			case engine.Overridden:
				t.overridden++
			}
			if ps.State != engine.Enforced && t.why == "" && len(ps.Missing) > 0 {
				m := ps.Missing[0]
				t.why = fmt.Sprintf("for %s, %s %s", where, m.Rule, m.Why)
				if m.By != "" {
					t.why += " by " + m.By
				}
			}
		}
	}
	n := 0
	resolve := func(src, dst *inventory.WorkloadEntry) error {
		n++
		req := &engine.ResolveRequest{Mesh: st.mesh, Type: st.typ, Destination: dst.Workload.Tags}
		where := "workload " + dst.Workload.Name
		if src != nil {
			req.Source = src.Workload.Tags
			where = src.Workload.Name + " -> " + dst.Workload.Name
		}
		res, err := s.Resolve(req)
		if err != nil {
			return err
		}
		count(res.Main, where)
		count(res.Outbound, where)
		return nil
	}
	if st.config == 0 || st.closed {
		list = nil // nothing to judge: every resolved state clears
	}
	pairs := false
	for _, w := range list {
		if n >= maxResolutions {
			break
		}
		if err := resolve(nil, w); err != nil {
			var ve *resource.ValidationError
			pairs = errors.As(err, &ve) // the type needs a source too
			break
		}
	}
	if pairs {
		n = 0
	outer:
		for _, src := range list {
			for _, dst := range list {
				if n >= maxResolutions {
					break outer
				}
				_ = resolve(src, dst) // a pair Resolve refuses configures nothing: no tally
			}
		}
	}
	next := map[string]resolveState{}
	for name, t := range tallies {
		switch {
		case t.enforced == t.seen:
		case t.overridden == t.seen:
			next[name] = resolveState{engine.Overridden, fmt.Sprintf("overridden in every resolution it takes part in (%d): %s", t.seen, t.why)}
		default:
			next[name] = resolveState{engine.PartiallyEnforced, fmt.Sprintf("%d of the %d resolutions it takes part in keep all its rules: %s",
				t.enforced, t.seen, t.why)}
		}
	}
	var moved []string
	j.b.Range(func(name string, ps *pstate) bool {
		if ps.resolved != next[name] {
			moved = append(moved, name)
		}
		return true
	})
	for _, name := range moved {
		j.edit(name).resolved = next[name]
	}
}
