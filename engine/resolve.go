package engine

import (
	"fmt"
	"sort"
	"strings"

	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ResolveRequest asks for the effective configuration of a type for a flow, or
// for one workload (docs/resolve.md).
type ResolveRequest struct {
	Mesh        string
	Type        string
	Source      resource.Tags // the workload when no destination is given
	Destination resource.Tags
	// The sides in any endpoint form, as Request has them (endpoint.go).
	SourceEndpoint      *inventory.Endpoint
	DestinationEndpoint *inventory.Endpoint
	Registry            *inventory.Registry
	Protocol            resource.Protocol
	Port                uint32
}

// request is r as a Request: its flow, validated and resolved alike.
func (r *ResolveRequest) request() *Request {
	return &Request{Mesh: r.Mesh, Type: r.Type, Source: r.Source, Destination: r.Destination,
		SourceEndpoint: r.SourceEndpoint, DestinationEndpoint: r.DestinationEndpoint, Registry: r.Registry,
		Protocol: r.Protocol, Port: r.Port}
}

// Validate checks the request's fields.
func (r *ResolveRequest) Validate() error {
	return r.request().Validate()
}

// PolicyState is a policy's status in a resolution.
type PolicyState uint8

// Policy states.
const (
	Enforced PolicyState = iota + 1
	PartiallyEnforced
	Overridden
	// Audited: a policy in audit mode (docs/audit.md) that covers the flow;
	// Resolve leaves it out of the result.
	Audited
)

func (s PolicyState) String() string {
	switch s {
	case Enforced:
		return "Enforced"
	case PartiallyEnforced:
		return "PartiallyEnforced"
	case Overridden:
		return "Overridden"
	case Audited:
		return "Audit"
	}
	return ""
}

// ResolvedRule is one effective rule and the policy it came from.
type ResolvedRule struct {
	Name   string
	Value  any
	Policy string
}

// MissingRule is a rule a policy declared that is not in the result, and why.
type MissingRule struct {
	Rule string
	By   string // the policy whose value won, or that unset it; "" when Why says it all
	Why  string // "overridden", "unset", "when is false", "when failed: ..."
}

// PolicyStatus is one policy's status in a resolution.
type PolicyStatus struct {
	Policy  string
	State   PolicyState
	Missing []MissingRule
	Skipped []string // blocks skipped: "defaults: when is false", "overrides: when failed: ..."
}

// Resolution is the effective configuration of one side.
type Resolution struct {
	Side   string // "inbound" or "outbound"
	Rules  []ResolvedRule
	Status []PolicyStatus // in merge order
}

// RuleValues returns the effective rules as an object.
func (r *Resolution) RuleValues() resource.Object {
	out := resource.Object{}
	for _, rr := range r.Rules {
		out[rr.Name] = rr.Value
	}
	return out
}

// StatusMap returns each policy's state name.
func (r *Resolution) StatusMap() resource.Object {
	out := resource.Object{}
	for _, s := range r.Status {
		out[s.Policy] = s.State.String()
	}
	return out
}

// ResolveResult answers a ResolveRequest.
type ResolveResult struct {
	Main     *Resolution // the side the type applies to
	Outbound *Resolution // the outbound side too, for a type with both from and to items
	Revision int64
}

// Resolve computes the effective configuration (docs/resolve.md). It fails with
// ErrMeshNotFound, ErrTypeNotFound, ErrEndpointNotFound or ErrIdentityNotFound
// for an endpoint naming an unknown workload or identity, or ErrInvalid when the type needs a source and
// a destination and the request lacks one.
func (s *Snapshot) Resolve(req *ResolveRequest) (*ResolveResult, error) {
	meshName := req.Mesh
	if meshName == "" {
		meshName = resource.DefaultMesh
	}
	ms, ok := s.meshes.Get(meshName)
	typ := req.Type
	if typ == "" {
		typ = resource.DefaultType
	}
	if paths := s.closedByType(meshName, ms, typ); paths != nil {
		return nil, closedError(meshName, typ, paths)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %q holds no resource", ErrMeshNotFound, meshName)
	}
	if err := ms.checkType(typ); err != nil {
		return nil, err
	}
	rq := req.request()
	src, err := rq.resolve(ms, meshName, false)
	if err != nil {
		return nil, err
	}
	dst, err := rq.resolve(ms, meshName, true)
	if err != nil {
		return nil, err
	}
	res := &ResolveResult{Revision: s.revision}
	ts, _ := ms.types.Get(typ)
	f := &index.Flow{Src: src.Tags, Dst: dst.Tags, Proto: req.Protocol, Port: req.Port}
	sc := &scratch{}
	sc.reset(ms.scopes.size())
	if ms.scopes.size() > 0 {
		sc.computeMembers(ms.scopes, 0, f.Src)
		sc.computeMembers(ms.scopes, 1, f.Dst)
	}
	hasDst := f.Dst != nil
	empty := func() (*ResolveResult, error) {
		side := "inbound"
		if !hasDst {
			side = "outbound"
		}
		res.Main = &Resolution{Side: side}
		return res, nil
	}
	if ts == nil || ts.valid.policies == 0 {
		return empty()
	}
	// Audit policies are left out (listed in status as Audit); when they are
	// all there is, they give the result its shape, without its demands.
	c := ts.viewCounts(false)
	onlyAudit := c.policies == 0
	if onlyAudit {
		c = ts.valid
	}
	needBoth := c.sd > 0 || c.items > 0
	if needBoth && (f.Src == nil || !hasDst) {
		if onlyAudit {
			return empty()
		}
		return nil, resource.Invalid("destination", fmt.Sprintf("type %s needs a source and a destination to resolve", typ))
	}
	if c.items > 0 {
		if c.from > 0 {
			res.Main = ms.mergeItems(ts, typ, f, sc, 1)
			if c.to > 0 {
				res.Outbound = ms.mergeItems(ts, typ, f, sc, 0)
			}
		} else {
			res.Main = ms.mergeItems(ts, typ, f, sc, 0)
		}
		return res, nil
	}
	side := 1
	if !hasDst {
		side = 0
	}
	res.Main = ms.fold(ts, f, sc, side)
	return res, nil
}

// mergeItems merges the conf of every covering from (inbound) or to (outbound)
// item in the order of docs/order.md: the first item in order takes precedence
// (docs/resolve.md).
func (ms *meshState) mergeItems(ts *typeState, typ string, f *index.Flow, sc *scratch, side int) *Resolution {
	res := &Resolution{Side: [2]string{"outbound", "inbound"}[side]}
	cands, _ := ms.candidates(ts, typ, f, sc, side)
	var covering []*index.Rule
	var audited []string
	for _, r := range cands {
		if r.Policy == nil || !r.MatchesFlow(f) {
			continue
		}
		if r.Audit {
			if cp, _ := ts.policies.Get(r.Policy.Name); cp.audit() && (len(audited) == 0 || audited[len(audited)-1] != r.Policy.Name) {
				audited = append(audited, r.Policy.Name)
			}
			continue
		}
		covering = append(covering, r)
	}
	merged := resource.Object{}
	for i := len(covering) - 1; i >= 0; i-- {
		merged = mergePatch(merged, covering[i].Conf)
	}
	from := map[string]string{}
	declared := map[string]*nameList{}
	var order []string
	for _, r := range covering {
		name := r.Policy.Name
		if _, seen := declared[name]; !seen {
			order = append(order, name)
			declared[name] = &nameList{}
		}
		for _, k := range sortedKeys(r.Conf) {
			if _, ok := from[k]; !ok && r.Conf[k] != nil {
				from[k] = name
			}
			declared[name].add(k)
		}
	}
	for _, k := range sortedKeys(merged) {
		res.Rules = append(res.Rules, ResolvedRule{Name: k, Value: merged[k], Policy: from[k]})
	}
	for _, name := range order {
		st := PolicyStatus{Policy: name}
		kept := 0
		for _, k := range declared[name].names {
			if from[k] == name {
				kept++
				continue
			}
			st.Missing = append(st.Missing, MissingRule{Rule: k, By: from[k], Why: "overridden"})
		}
		if len(declared[name].names) == 0 {
			continue
		}
		st.State = stateOf(kept, len(declared[name].names))
		res.Status = append(res.Status, st)
	}
	res.Status = appendAudited(res.Status, audited)
	return res
}

// appendAudited lists the audit policies that cover the flow, once each.
func appendAudited(status []PolicyStatus, names []string) []PolicyStatus {
	seen := map[string]bool{}
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			status = append(status, PolicyStatus{Policy: n, State: Audited})
		}
	}
	return status
}

// mergePatch applies patch to target as a JSON merge patch (RFC 7386): objects
// merge key by key, null deletes, anything else replaces. target is not modified.
func mergePatch(target resource.Object, patch resource.Object) resource.Object {
	out := make(resource.Object, len(target)+len(patch))
	for k, v := range target {
		out[k] = v
	}
	for k, pv := range patch {
		if pv == nil {
			delete(out, k)
			continue
		}
		po, pIsObj := pv.(map[string]any)
		to, tIsObj := out[k].(map[string]any)
		switch {
		case pIsObj && tIsObj:
			out[k] = mergePatch(to, po)
		case pIsObj:
			out[k] = mergePatch(resource.Object{}, po)
		default:
			out[k] = pv
		}
	}
	return out
}

// foldEntry is one policy in the fold, with its place in the order.
type foldEntry struct {
	p   *resource.Policy
	key index.OrderKey
}

// fold computes the effective rules of a defaults/overrides type (docs/resolve.md).
func (ms *meshState) fold(ts *typeState, f *index.Flow, sc *scratch, side int) *Resolution {
	res := &Resolution{Side: [2]string{"outbound", "inbound"}[side]}
	workload := f.Src
	if side == 1 {
		workload = f.Dst
	}
	var entries []foldEntry
	var chosen *compiledPolicy // select: PerDestination: only this policy applies inbound
	perDest := side == 1 && ms.settings.forType(ts.name).perDestination
	if perDest {
		chosen = ms.chooseForDestination(ts, f.Dst, sc, false)
	}
	var audited []string
	ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
		if cp.err != "" || perDest && !cp.audit() && cp != chosen {
			return true
		}
		p := cp.p
		if p.TargetRef != nil {
			if !index.CompileSelector(resource.TargetSelector(*p.TargetRef)).Matches(workload) {
				return true
			}
			if cp.audit() {
				audited = append(audited, p.Name)
				return true
			}
			e := foldEntry{p: p, key: index.OrderKey{Priority: p.Priority, Total: ms.settings.level(*p.TargetRef)}}
			if p.Rank == resource.RankAbsolute {
				e.key.Phase = index.PhaseAbsolute
			} else {
				e.key.Phase = index.PhaseDefault
			}
			ruleTieBreak(&e.key, p, ms.settings.tieBreakFor(p.Type, true))
			entries = append(entries, e)
			return true
		}
		var first *index.Rule
		for _, r := range cp.rules {
			if sc.IsMember(side, r.Scope) && r.MatchesFlow(f) && (first == nil || r.Key.Less(&first.Key)) {
				first = r
			}
		}
		if first != nil && cp.audit() {
			audited = append(audited, p.Name)
		} else if first != nil {
			entries = append(entries, foldEntry{p: p, key: first.Key})
		}
		return true
	})
	sort.Strings(audited)
	orderFold(entries)
	// Default policies in order, then Absolute policies in reverse order.
	var order []*resource.Policy
	var absolute []*resource.Policy
	for _, e := range entries {
		if e.p.Rank == resource.RankAbsolute {
			absolute = append(absolute, e.p)
		} else {
			order = append(order, e.p)
		}
	}
	for i := len(absolute) - 1; i >= 0; i-- {
		order = append(order, absolute[i])
	}
	res = runFold(res, order)
	res.Status = appendAudited(res.Status, audited)
	return res
}

// orderFold orders the policies of a fold as Decide orders their first
// matching rules; then, within each group that ties on every key before the
// tie-break, the policies with defaults/overrides blocks are reordered among the
// places they hold, newer first (creation time; none counts as the oldest),
// then by name (docs/resolve.md). Policies without blocks keep their places, so
// the order is total and deterministic.
func orderFold(entries []foldEntry) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].key.Less(&entries[j].key) })
	for start := 0; start < len(entries); {
		end := start + 1
		for end < len(entries) && sameBeforeTieBreak(&entries[start].key, &entries[end].key) {
			end++
		}
		var slots []int
		var blocks []foldEntry
		for i := start; i < end; i++ {
			if entries[i].p.HasBlocks() {
				slots = append(slots, i)
				blocks = append(blocks, entries[i])
			}
		}
		sort.Slice(blocks, func(i, j int) bool {
			a, b := blocks[i].p, blocks[j].p
			ta := newestFirst(a.Meta.CreationTime.UnixNano(), a.Meta.CreationTime.IsZero())
			tb := newestFirst(b.Meta.CreationTime.UnixNano(), b.Meta.CreationTime.IsZero())
			if ta != tb {
				return ta < tb
			}
			return a.Name < b.Name
		})
		for k, i := range slots {
			entries[i] = blocks[k]
		}
		start = end
	}
}

func sameBeforeTieBreak(a, b *index.OrderKey) bool {
	return a.Phase == b.Phase && a.Scope == b.Scope && a.Priority == b.Priority && a.Total == b.Total && a.Exact == b.Exact
}

type foldValue struct {
	value  any
	policy string
}

// runFold merges the policies in order (docs/resolve.md, the fold).
func runFold(res *Resolution, order []*resource.Policy) *Resolution {
	result := map[string]foldValue{}
	unsetBy := map[string]string{} // rule → the policy that unset it
	type declared struct {
		names   nameList
		skipped []string
		unset   map[string]string
	}
	decl := make([]declared, len(order))
	for i, p := range order {
		d := &decl[i]
		defaults, overrides := p.Defaults, p.Overrides
		if p.Conf != nil && !p.HasBlocks() {
			b := &resource.Block{Strategy: resource.Atomic, Rules: p.Conf}
			if p.Rank == resource.RankAbsolute {
				overrides = b
			} else {
				defaults = b
			}
		}
		if defaults != nil {
			d.names.add(sortedKeys(defaults.Rules)...)
			if ok, why := whenHolds(defaults, result); !ok {
				d.skipped = append(d.skipped, "defaults: "+why)
			} else {
				rules := map[string]any{}
				for k, v := range defaults.Rules {
					if by, gone := unsetBy[k]; gone {
						if d.unset == nil {
							d.unset = map[string]string{}
						}
						d.unset[k] = by
						continue
					}
					rules[k] = v
				}
				switch {
				case len(result) == 0:
					for k, v := range rules {
						result[k] = foldValue{v, p.Name}
					}
				case defaults.Strategy == resource.Merge:
					for k, v := range rules {
						if _, ok := result[k]; !ok {
							result[k] = foldValue{v, p.Name}
						}
					}
				}
			}
		}
		if overrides != nil {
			d.names.add(sortedKeys(overrides.Rules)...)
			if ok, why := whenHolds(overrides, result); !ok {
				d.skipped = append(d.skipped, "overrides: "+why)
			} else if overrides.Strategy == resource.Atomic {
				result = map[string]foldValue{}
				for k, v := range overrides.Rules {
					result[k] = foldValue{v, p.Name}
				}
			} else {
				for k, v := range overrides.Rules {
					result[k] = foldValue{v, p.Name}
				}
			}
		}
		for _, u := range p.Unset {
			if _, ok := unsetBy[u]; !ok {
				unsetBy[u] = p.Name
			}
		}
	}
	names := make([]string, 0, len(result))
	for k := range result {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		res.Rules = append(res.Rules, ResolvedRule{Name: k, Value: result[k].value, Policy: result[k].policy})
	}
	for i, p := range order {
		d := &decl[i]
		if len(d.names.names) == 0 {
			continue
		}
		st := PolicyStatus{Policy: p.Name, Skipped: d.skipped}
		kept := 0
		for _, k := range d.names.names {
			v, ok := result[k]
			switch {
			case ok && v.policy == p.Name:
				kept++
			case ok:
				st.Missing = append(st.Missing, MissingRule{Rule: k, By: v.policy, Why: "overridden"})
			case d.unset[k] != "":
				st.Missing = append(st.Missing, MissingRule{Rule: k, By: d.unset[k], Why: "unset"})
			default:
				st.Missing = append(st.Missing, MissingRule{Rule: k, Why: missingWhy(d.skipped)})
			}
		}
		st.State = stateOf(kept, len(d.names.names))
		res.Status = append(res.Status, st)
	}
	return res
}

func missingWhy(skipped []string) string {
	if len(skipped) > 0 {
		return "skipped: " + strings.Join(skipped, "; ")
	}
	return "replaced by an atomic block"
}

// whenHolds evaluates a block's when condition against the result so far; an
// evaluation error skips the block and is reported.
func whenHolds(b *resource.Block, result map[string]foldValue) (bool, string) {
	if b.When == "" {
		return true, ""
	}
	p := b.Program
	if p == nil {
		var err error
		if p, err = resource.CompileWhen(b.When); err != nil {
			return false, "when failed: " + err.Error()
		}
	}
	rules := make(resource.Object, len(result))
	for k, v := range result {
		rules[k] = v.value
	}
	ok, err := p.Eval(rules)
	if err != nil {
		return false, "when failed: " + err.Error()
	}
	if !ok {
		return false, "when is false"
	}
	return true, ""
}

func stateOf(kept, declared int) PolicyState {
	switch {
	case kept == declared:
		return Enforced
	case kept == 0:
		return Overridden
	}
	return PartiallyEnforced
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// nameList holds names in the order first added, each once; adding is O(1),
// so a policy with N rule names costs O(N), not O(N²) (issue 12 F7: 40k
// rules took 7.9 s per Resolve).
type nameList struct {
	names []string
	seen  map[string]struct{}
}

func (l *nameList) add(names ...string) {
	for _, n := range names {
		if _, dup := l.seen[n]; dup {
			continue
		}
		if l.seen == nil {
			l.seen = make(map[string]struct{}, len(names))
		}
		l.seen[n] = struct{}{}
		l.names = append(l.names, n)
	}
}
