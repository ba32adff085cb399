package conditions

// The conditions read off the inventory: NoWorkloads (lint's dead: the
// policy selects no workload), and Overridden / PartiallyEnforced for the
// types whose policies carry configuration, by Resolve's status over the
// inventory's workloads (docs/resolve.md).

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// endTags are the distinct tag sets the inventory's workloads present as a
// source (their own) and as a destination (their own, and with each port's
// tags), and the workloads in name order.
type endTags struct {
	src, dst  []resource.Tags
	list      []*inventory.WorkloadEntry
	workloads int
}

func newEndTags(inv *inventory.Inventory) *endTags {
	et := &endTags{}
	if inv == nil {
		return et
	}
	inv.ByName.Range(func(_ string, e *inventory.WorkloadEntry) bool {
		if e.Err == "" {
			et.list = append(et.list, e)
		}
		return true
	})
	slices.SortFunc(et.list, func(a, b *inventory.WorkloadEntry) int { return strings.Compare(a.Workload.Name, b.Workload.Name) })
	et.workloads = len(et.list)
	seen := [2]map[string]bool{{}, {}}
	add := func(end int, t resource.Tags) {
		k := resource.TagsKey(t)
		if seen[end][k] {
			return
		}
		seen[end][k] = true
		if end == 0 {
			et.src = append(et.src, t)
		} else {
			et.dst = append(et.dst, t)
		}
	}
	for _, e := range et.list {
		add(0, e.Workload.Tags)
		add(1, e.Workload.Tags)
		for _, p := range e.Workload.Ports {
			add(1, e.Workload.ResolvedTags(p.Port, ""))
		}
	}
	return et
}

// judgeDead settles NoWorkloads for the changed policies, or for every one
// when the inventory or the frame changed.
func (j *judgement) judgeDead(changed []string, sameInv bool) {
	st := j.st
	dead := func(ps *pstate) bool {
		return ps.err == "" && len(st.ends.src) > 0 && !selectsSome(j.p, ps, st.ends)
	}
	if !sameInv {
		var moved []string
		j.b.Range(func(name string, ps *pstate) bool {
			if _, fresh := j.fresh[name]; fresh || dead(ps) != ps.dead || ps.dead {
				moved = append(moved, name) // a dead one's message counts the workloads
			}
			return true
		})
		for _, name := range moved {
			ps := j.edit(name)
			ps.dead = dead(ps)
		}
		return
	}
	for _, name := range changed {
		if ps, ok := j.fresh[name]; ok {
			ps.dead = dead(ps)
		}
	}
}

// selectsSome reports whether a rule of the policy has, on a side where it
// is a candidate, a workload's tag set matched by its end there and a
// member of its scope (lint's dead, docs/lint.md).
func selectsSome(p *engine.Partition, ps *pstate, et *endTags) bool {
	if len(ps.rules) == 0 && ps.doc.TargetRef != nil {
		// A configuration by targetRef alone (a single default, blocks):
		// it selects the workloads its targetRef selects.
		m := index.CompileSelector(resource.TargetSelector(*ps.doc.TargetRef))
		for _, t := range et.dst {
			if m.Matches(t) {
				return true
			}
		}
		return false
	}
	for _, r := range ps.rules {
		for side, tags := range [2][]resource.Tags{et.src, et.dst} {
			if r.Sides&index.SideBits[side] == 0 {
				continue
			}
			m := r.Src
			if side == 1 {
				m = r.Dst
			}
			for _, t := range tags {
				if (m == nil || m.Matches(t)) && p.MemberOf(r.Scope, t) {
					return true
				}
			}
		}
	}
	return false
}

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
func (j *judgement) judgeResolved() {
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
	list := st.ends.list
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
