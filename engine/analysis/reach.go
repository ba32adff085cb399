package analysis

// Reach and Matrix (docs/analysis.md): who can reach an endpoint, what it can
// reach, and the allowed pairs among workloads — answered by the bulk
// evaluation (bulk.go), so that each entry is Decide's answer for every flow
// it stands for.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/index"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// ReachRequest asks who can reach an endpoint (Destination: the endpoint is
// the flow's destination) or what it can reach (the endpoint is the source),
// with a protocol and a port or neither (docs/analysis.md).
type ReachRequest struct {
	Mesh        string
	Type        string
	Endpoint    inventory.Endpoint
	Destination bool
	Protocol    resource.Protocol
	Port        uint32
	Registry    *inventory.Registry
}

// Validate checks the request's fields; the error is a *ValidationError.
func (r *ReachRequest) Validate() error {
	q := engine.Request{Mesh: r.Mesh, Type: r.Type, Protocol: r.Protocol, Port: r.Port, SourceEndpoint: &r.Endpoint}
	return q.Validate()
}

// ReachEntry is one peer the endpoint is allowed with: a workload of the
// inventory (Workload, its Identity and the Tags the flow is decided on) or
// a class of endpoints outside it (Outside). Outbound and Inbound are the
// flow's sides, each naming its deciding policy.
type ReachEntry struct {
	Workload string
	Identity uint64
	Tags     resource.Tags
	Outside  Outside
	Outbound engine.SideDecision
	Inbound  engine.SideDecision
}

// ReachAnswer is Reach's answer at one revision.
type ReachAnswer struct {
	Revision int64
	Endpoint inventory.EndpointResolution
	Entries  []ReachEntry
	// Notes say where the outside could not be split exactly; the classes
	// concerned are left out.
	Notes []string
	// Decisions made: one per distinct class of peers.
	Decisions int
}

// Reach answers req on s: every valid workload of the mesh whose flow with
// the endpoint Decide allows, then the allowed classes of addresses and
// principals outside the inventory. It fails as Decide does for the
// endpoint (engine.ErrMeshNotFound, engine.ErrTypeNotFound,
// inventory.ErrEndpointNotFound, ...).
func Reach(s *engine.Snapshot, req *ReachRequest) (*ReachAnswer, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	b, err := NewBulk(s, req.Mesh, req.Type)
	if err != nil {
		return nil, err
	}
	res, err := s.ResolveEndpoint(b.mesh, &req.Endpoint, req.Destination, req.Port, req.Registry)
	if err != nil {
		return nil, err
	}
	ans := &ReachAnswer{Revision: s.Revision(), Endpoint: res}
	fixed := b.Intern(res.Tags)
	// Each class of peers is decided once; its answer is kept by class,
	// room made for the classes of the outside too.
	outside, _ := b.outsideClasses()
	answers := make([]engine.Decision, len(b.tags)+len(outside))
	decided := make([]bool, len(answers))
	decide := func(peer ClassID) *engine.Decision {
		if int(peer) >= len(decided) {
			n := int(peer) + 1 - len(decided) + len(decided)/4
			answers, decided = append(answers, make([]engine.Decision, n)...), append(decided, make([]bool, n)...)
		}
		d := &answers[peer]
		if !decided[peer] {
			src, dst := fixed, peer
			if req.Destination {
				src, dst = peer, fixed
			}
			b.decideInto(src, dst, req.Protocol, req.Port, d)
			decided[peer] = true
		}
		return d
	}
	var workloads []*inventory.WorkloadEntry
	if b.base != nil {
		workloads = b.base.workloads
	} else {
		workloads = validWorkloads(b.p.Inventory())
	}
	// The workloads come in no particular order; the allowed are sorted
	// by name.
	for i, w := range workloads {
		var c ClassID
		var tags resource.Tags
		own := false
		if b.base != nil {
			c, tags, own = b.peerClass(i, !req.Destination, req.Port)
		} else {
			tags = peerTags(w, !req.Destination, req.Port)
			c = b.Intern(tags)
		}
		d := decide(c)
		if d.Action != resource.Allow {
			continue
		}
		id := w.ID
		if !own {
			id = tagsIdentity(b.mesh, w, tags)
		}
		ans.Entries = append(ans.Entries, ReachEntry{Workload: w.Workload.Name, Identity: id,
			Tags: tags, Outbound: sideOnly(d.Outbound), Inbound: sideOnly(d.Inbound)})
	}
	slices.SortFunc(ans.Entries, func(x, y ReachEntry) int { return strings.Compare(x.Workload, y.Workload) })
	out, notes := b.reachOutside(s, !req.Destination, req.Port, decide)
	ans.Entries = append(ans.Entries, out...)
	ans.Notes = notes
	ans.Decisions = b.Decisions()
	return ans, nil
}

// sideOnly is a side without its conf (an analysis answer names policies).
func sideOnly(sd engine.SideDecision) engine.SideDecision {
	sd.Conf = nil
	return sd
}

// peerTags are a workload's tags as an end of a flow named by the workload:
// its own, plus its port's tags as a destination.
func peerTags(e *inventory.WorkloadEntry, destination bool, port uint32) resource.Tags {
	if !destination {
		port = 0
	}
	return e.Workload.ResolvedTags(port, "")
}

// tagsIdentity is the identity of tags resolved from a workload.
func tagsIdentity(mesh string, e *inventory.WorkloadEntry, tags resource.Tags) uint64 {
	if len(tags) == len(e.Workload.Tags) && resource.SameTagSet(tags, e.Workload.Tags) {
		return e.ID
	}
	return resource.Identity(mesh, tags)
}

// sameSides reports whether two answers agree on both sides (confs aside).
func sameSides(a, b *engine.Decision) bool {
	return a.Action == b.Action && sameSide(a.Outbound, b.Outbound) && sameSide(a.Inbound, b.Inbound)
}

func sameSide(a, b engine.SideDecision) bool {
	return a.Action == b.Action && a.Policy == b.Policy && a.Scope == b.Scope && a.Rule == b.Rule && a.Reason == b.Reason
}

// reachOutside answers the outside classes as the peer of a flow (peerDst:
// the peer is the destination): allowed address ranges merged into CIDR
// blocks (one Any entry when every outside address is allowed alike), and
// allowed principal patterns with the more specific ones answered
// otherwise.
func (b *Bulk) reachOutside(s *engine.Snapshot, peerDst bool, port uint32, decide func(ClassID) *engine.Decision) ([]ReachEntry, []string) {
	classes, notes := b.outsideClasses()
	answers := make([]*engine.Decision, len(classes))
	for i := range classes {
		tags, err := s.EndpointTags(b.mesh, &classes[i].rep, peerDst, port, nil)
		if err != nil {
			continue
		}
		answers[i] = decide(b.Intern(tags))
	}
	var out []ReachEntry
	// Addresses: runs of adjacent ranges answered alike.
	var addrIdx []int
	for i, c := range classes {
		if c.lo.IsValid() {
			addrIdx = append(addrIdx, i)
		}
	}
	allAlike := len(notes) == 0 || !strings.Contains(strings.Join(notes, " "), "IPv6")
	for _, i := range addrIdx {
		if answers[i] == nil || answers[i].Action != resource.Allow || !sameSides(answers[i], answers[addrIdx[0]]) {
			allAlike = false
		}
	}
	if allAlike && len(addrIdx) > 0 {
		d := answers[addrIdx[0]]
		out = append(out, ReachEntry{Tags: resource.Tags{resource.IPTag: "*"}, Outside: Outside{Any: true},
			Outbound: sideOnly(d.Outbound), Inbound: sideOnly(d.Inbound)})
	} else {
		for j := 0; j < len(addrIdx); {
			i := addrIdx[j]
			d := answers[i]
			k := j + 1
			for k < len(addrIdx) && answers[addrIdx[k]] != nil && d != nil && sameSides(answers[addrIdx[k]], d) &&
				classes[addrIdx[k-1]].hi.Next() == classes[addrIdx[k]].lo {
				k++
			}
			if d != nil && d.Action == resource.Allow {
				for _, p := range rangeCIDRs(classes[i].lo, classes[addrIdx[k-1]].hi) {
					out = append(out, ReachEntry{Tags: resource.Tags{resource.IPTag: p.String()}, Outside: Outside{CIDR: p.String()},
						Outbound: sideOnly(d.Outbound), Inbound: sideOnly(d.Inbound)})
				}
			}
			j = k
		}
	}
	// Principals.
	for i, c := range classes {
		d := answers[i]
		if c.lo.IsValid() || d == nil || d.Action != resource.Allow {
			continue
		}
		o := Outside{Principal: c.pattern}
		if strings.HasSuffix(c.pattern, "*") {
			for j, e := range classes {
				if j == i || e.lo.IsValid() || !b.underPattern(e.rep.Principal, c) {
					continue
				}
				if answers[j] == nil || !sameSides(answers[j], d) {
					o.Except = append(o.Except, e.pattern)
				}
			}
			slices.Sort(o.Except)
			o.Except = slices.Compact(o.Except)
		}
		out = append(out, ReachEntry{Tags: resource.Tags{resource.PrincipalTag: c.pattern}, Outside: o,
			Outbound: sideOnly(d.Outbound), Inbound: sideOnly(d.Inbound)})
	}
	return out, notes
}

// underPattern reports whether a principal falls under a prefix pattern's
// text (its prefix, and its form under spiffe://<mesh>/) while belonging to
// another, more specific pattern.
func (b *Bulk) underPattern(id string, c outsideClass) bool {
	if !strings.HasPrefix(id, c.prefix) || b.principalPattern(id) == c.pattern {
		return false
	}
	if strings.HasSuffix(c.pattern, "*/*") {
		_, kuma := inventory.KumaSpiffeService(b.mesh, id)
		return !kuma
	}
	if _, _, kumaPrefix := b.principalSets(); strings.HasPrefix(c.prefix, kumaPrefix) {
		_, kuma := inventory.KumaSpiffeService(b.mesh, id)
		return kuma
	}
	return true
}

// MatrixRequest asks for the allowed pairs among workloads of a mesh:
// sources and destinations selected by selectors (nil: every valid
// workload), on each class of Classes (nil: FlowClasses).
type MatrixRequest struct {
	Mesh         string
	Type         string
	Sources      *resource.Selector
	Destinations *resource.Selector
	Classes      []FlowClass
}

// MatrixEntry is one allowed pair on one class of flows.
type MatrixEntry struct {
	Source, Destination                 string
	SourceIdentity, DestinationIdentity uint64
	Class                               FlowClass
	Outbound, Inbound                   engine.SideDecision
}

// Matrix calls emit for every allowed pair of s, by source name, destination
// name and class, until emit returns false. It returns the revision
// answered at and the decisions made.
//
// Workloads decided alike share their decisions: sources by their class,
// destinations by their classes on every class of flows (port tags aside,
// one); each pair of groups is decided on every class of flows at once
// (DecidePorts), for the groups of one source at a time.
func Matrix(s *engine.Snapshot, req *MatrixRequest, emit func(MatrixEntry) bool) (int64, int, error) {
	q := engine.Request{Mesh: req.Mesh, Type: req.Type}
	if err := q.Validate(); err != nil {
		return 0, 0, err
	}
	b, err := NewBulk(s, req.Mesh, req.Type)
	if err != nil {
		return 0, 0, err
	}
	classes := req.Classes
	if classes == nil {
		classes = FlowClasses(b.mesh, b.typ, s)
	}
	var all []*inventory.WorkloadEntry
	if b.base != nil {
		all = make([]*inventory.WorkloadEntry, len(b.base.workloads))
		for i, j := range b.base.byName() {
			all[i] = b.base.workloads[j]
		}
	} else {
		all = workloadsOf(b.p.Inventory())
	}
	pick := func(sel *resource.Selector) []*inventory.WorkloadEntry {
		if sel == nil {
			return all
		}
		m := index.CompileSelector(sel)
		var out []*inventory.WorkloadEntry
		for _, w := range all {
			if m.Matches(w.Workload.Tags) {
				out = append(out, w)
			}
		}
		return out
	}
	srcs, dsts := pick(req.Sources), pick(req.Destinations)
	srcClass := make([]ClassID, len(srcs))
	for i, w := range srcs {
		srcClass[i] = b.Intern(peerTags(w, false, 0))
	}
	// Destinations grouped by their classes on every class of flows.
	type dstGroup struct {
		classes []ClassID // per class of flows
		single  bool      // one class on all
	}
	var groups []dstGroup
	dstGroupOf := make([]int, len(dsts))
	dstIDs := make([][]uint64, len(dsts)) // per class of flows; nil: the workload's own
	byOne := map[ClassID]int{}
	byMany := map[string]int{}
	for j, w := range dsts {
		if len(w.Workload.Ports) == 0 {
			c := b.Intern(peerTags(w, true, 0))
			g, ok := byOne[c]
			if !ok {
				g = len(groups)
				groups = append(groups, dstGroup{classes: []ClassID{c}, single: true})
				byOne[c] = g
			}
			dstGroupOf[j] = g
			continue
		}
		cs := make([]ClassID, len(classes))
		ids := make([]uint64, len(classes))
		key := make([]byte, 0, 4*len(classes))
		for k, c := range classes {
			tags := peerTags(w, true, c.Port)
			cs[k], ids[k] = b.Intern(tags), tagsIdentity(b.mesh, w, tags)
			key = append(key, byte(cs[k]), byte(cs[k]>>8), byte(cs[k]>>16), byte(cs[k]>>24))
		}
		dstIDs[j] = ids
		g, ok := byMany[string(key)]
		if !ok {
			g = len(groups)
			groups = append(groups, dstGroup{classes: cs})
			byMany[string(key)] = g
		}
		dstGroupOf[j] = g
	}
	// The decisions of the current source's class against every group, by
	// class of flows.
	decided := make([]engine.Decision, len(groups)*len(classes))
	cur := ClassID(-1)
	var runs []int    // start of each run of classes with one destination class
	var dcs []ClassID // the destination class of each run
	for i, sw := range srcs {
		if srcClass[i] != cur {
			cur = srcClass[i]
			for g, grp := range groups {
				out := decided[g*len(classes) : (g+1)*len(classes)]
				if grp.single {
					b.DecidePorts(cur, grp.classes[0], classes, out)
					continue
				}
				// Runs of classes on which the destination has one class.
				runs, dcs = runs[:0], dcs[:0]
				for k, c := range grp.classes {
					if k == 0 || c != grp.classes[k-1] {
						runs, dcs = append(runs, k), append(dcs, c)
					}
				}
				runs = append(runs, len(classes))
				for r := range dcs {
					b.DecidePorts(cur, dcs[r], classes[runs[r]:runs[r+1]], out[runs[r]:runs[r+1]])
				}
			}
		}
		for j, dw := range dsts {
			row := decided[dstGroupOf[j]*len(classes):]
			for k, c := range classes {
				d := &row[k]
				if d.Action != resource.Allow {
					continue
				}
				id := dw.ID
				if dstIDs[j] != nil {
					id = dstIDs[j][k]
				}
				e := MatrixEntry{Source: sw.Workload.Name, Destination: dw.Workload.Name, SourceIdentity: sw.ID,
					DestinationIdentity: id, Class: c, Outbound: sideOnly(d.Outbound), Inbound: sideOnly(d.Inbound)}
				if !emit(e) {
					return s.Revision(), b.Decisions(), nil
				}
			}
		}
	}
	return s.Revision(), b.Decisions(), nil
}

// String is the entry as one line.
func (e MatrixEntry) String() string {
	return fmt.Sprintf("%s -> %s %s", e.Source, e.Destination, e.Class)
}
