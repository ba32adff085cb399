package server

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/storetest"
)

// probe is one flow the brute force decides: a workload pair on a protocol
// and a port.
type probe struct {
	src, dst string
	proto    string
	port     uint32
}

// namedPorts are the ports the documents st held at any of revs name —
// each end of a policy's port range and the port after it, each port a
// workload gives tags to — and port 1, which none names.
func namedPorts(t *testing.T, st *etcd.Store, revs []int64) (workloads []string, ports []uint32) {
	t.Helper()
	seen := map[uint32]bool{1: true}
	names := map[string]bool{}
	for _, rev := range revs {
		page, err := st.List(ctxT(t), store.ListOptions{Revision: rev})
		if err != nil || page.NextPageToken != "" {
			t.Fatalf("list at %d: %v (more than a page)", rev, err)
		}
		for _, it := range page.Items {
			switch r := it.Change().Resource.(type) {
			case *resource.Policy:
				for _, e := range r.Ports {
					ranges, _ := resource.ParsePortRanges(e.Ports)
					for _, pr := range append(ranges, e.Ranges...) {
						seen[uint32(pr.Lo)], seen[uint32(pr.Hi)] = true, true
						if pr.Hi < 65535 {
							seen[uint32(pr.Hi)+1] = true
						}
					}
				}
			case *resource.Workload:
				names[r.Name] = true
				for _, p := range r.Ports {
					seen[p.Port] = true
				}
			}
		}
	}
	for p := range seen {
		ports = append(ports, p)
	}
	for n := range names {
		workloads = append(workloads, n)
	}
	slices.Sort(ports)
	slices.Sort(workloads)
	return workloads, ports
}

// probes are every pair of workloads on TCP and UDP at every port, ICMP,
// and no protocol.
func probes(workloads []string, ports []uint32) []probe {
	var out []probe
	for _, s := range workloads {
		for _, d := range workloads {
			for _, proto := range []string{"TCP", "UDP"} {
				for _, p := range ports {
					out = append(out, probe{s, d, proto, p})
				}
			}
			out = append(out, probe{s, d, "ICMP", 0}, probe{s, d, "", 0})
		}
	}
	return out
}

// bruteForce is Decide at rev of every probe: the answer without what
// Impact leaves out (conf, resolutions, the revision), nil for an error.
func bruteForce(t *testing.T, h *harness, rev int64, ps []probe) []*verdictv1.DecideResponse {
	t.Helper()
	out := make([]*verdictv1.DecideResponse, 0, len(ps))
	for i := 0; i < len(ps); i += 1000 {
		req := &verdictv1.DecideBatchRequest{AtRevision: rev}
		for _, p := range ps[i:min(i+1000, len(ps))] {
			req.Requests = append(req.Requests, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: p.src},
				Destination: &verdictv1.Endpoint{Workload: p.dst}, Protocol: p.proto, Port: p.port})
		}
		resp, err := h.dec.DecideBatch(ctxT(t), req)
		if err != nil {
			t.Fatalf("decide at %d: %v", rev, err)
		}
		for _, r := range resp.GetResults() {
			d := r.GetResponse()
			if d != nil {
				d.Conf, d.Revision, d.SourceResolution, d.DestinationResolution = nil, 0, nil, nil
			}
			out = append(out, d)
		}
	}
	return out
}

// covers reports whether a changed flow of Diff stands for probe p.
func covers(c *verdictv1.ImpactChange, p probe) bool {
	if c.GetSource().GetWorkload() != p.src || c.GetDestination().GetWorkload() != p.dst || c.GetProtocol() != p.proto {
		return false
	}
	switch {
	case p.proto == "ICMP":
		return true
	case c.GetPortLo() == 0:
		return p.port == 0
	}
	return p.port >= c.GetPortLo() && p.port <= c.GetPortHi()
}

// sameAnswerAs reports whether an Impact answer is the brute force's.
func sameAnswerAs(a *verdictv1.ImpactAnswer, d *verdictv1.DecideResponse) bool {
	if d == nil {
		return a.GetError() != ""
	}
	return a.GetError() == "" && a.GetAction() == d.GetAction() && a.GetPolicy() == d.GetPolicy() &&
		proto.Equal(a.GetOutbound(), d.GetOutbound()) && proto.Equal(a.GetInbound(), d.GetInbound())
}

// TestDiffFlowsEqualBruteForce is Diff's differential test: over random
// write histories (workloads, ports, scopes, profiles, deletes), the flows
// Diff reports between two revisions — consecutive ones, and random pairs
// either way round — are exactly the workload pairs whose Decide differs
// between the two on some protocol and named port, with the answers Decide
// gives at each.
func TestDiffFlowsEqualBruteForce(t *testing.T) {
	t.Parallel()
	h, st := etcdServer(t, nil)
	world := storetest.World{Workloads: true, Ports: true, Profiles: true}
	// Seed 106 diffs backwards past policies that lost a NewestModified tie
	// (KongMesh) and are restored.
	for _, seed := range []uint64{0, 1, 106} {
		r := rand.New(rand.NewPCG(seed, 30))
		var revs []int64
		for range 30 {
			rev, err := st.Apply(ctxT(t), storetest.RandomWrite(t, r, world))
			if err == nil {
				revs = append(revs, rev)
			}
		}
		workloads, ports := namedPorts(t, st, revs)
		ps := probes(workloads, ports)
		oracle := map[int64][]*verdictv1.DecideResponse{}
		for _, rev := range revs {
			oracle[rev] = bruteForce(t, h, rev, ps)
		}
		var pairs [][2]int64
		for i := 1; i < len(revs); i++ {
			pairs = append(pairs, [2]int64{revs[i-1], revs[i]})
		}
		for range 12 {
			pairs = append(pairs, [2]int64{revs[r.IntN(len(revs))], revs[r.IntN(len(revs))]})
		}
		changed := 0
		for _, pr := range pairs {
			a, b := pr[0], pr[1]
			at := fmt.Sprintf("seed %d: diff %d → %d", seed, a, b)
			diff, err := h.pol.Diff(ctxT(t), &verdictv1.DiffRequest{FromRevision: a, ToRevision: b})
			if err != nil {
				t.Fatalf("%s: %v", at, err)
			}
			if diff.GetFlowsError() != "" {
				t.Fatalf("%s: flows not judged: %s", at, diff.GetFlowsError())
			}
			if len(diff.GetDifferences()) == 0 && diff.GetFlows() != nil {
				t.Errorf("%s: flows without a difference", at)
			}
			changes := diff.GetFlows().GetChanges()
			for _, c := range changes {
				if c.GetMesh() != "default" || c.GetType() != "TrafficPermission" {
					t.Errorf("%s: a change of %s/%s, a partition the world does not have", at, c.GetMesh(), c.GetType())
				}
			}
			for i, p := range ps {
				before, after := oracle[a][i], oracle[b][i]
				differs := !(before == nil && after == nil || before != nil && after != nil && proto.Equal(before, after))
				var by *verdictv1.ImpactChange
				for _, c := range changes {
					if covers(c, p) {
						by = c
						break
					}
				}
				switch {
				case differs && by == nil:
					t.Errorf("%s: %+v: Decide answers %v, then %v; Diff does not list it", at, p, before, after)
				case !differs && by != nil:
					t.Errorf("%s: %+v: Decide answers %v at both; Diff lists it: %v", at, p, before, by)
				case by != nil && (!sameAnswerAs(by.GetBefore(), before) || !sameAnswerAs(by.GetAfter(), after)):
					t.Errorf("%s: %+v: Diff says %v → %v; Decide %v → %v", at, p, by.GetBefore(), by.GetAfter(), before, after)
				}
				if differs {
					changed++
				}
			}
			for _, g := range diff.GetFlows().GetGroups() {
				if g.GetFlows() == 0 {
					t.Errorf("%s: an empty group %v", at, g)
				}
			}
		}
		if changed == 0 {
			t.Errorf("seed %d: no flow ever changed: the test tests nothing", seed)
		}
	}
}

// TestDiffFlowsNotJudged: a difference Apply could not write (a value
// written around verdict that does not decode) leaves the pairs unjudged
// whichever way round the revisions are asked, and the answer says why; the
// resources are listed all the same.
func TestDiffFlowsNotJudged(t *testing.T) {
	t.Parallel()
	h, st := etcdServer(t, nil)
	resp, err := h.pol.Apply(ctxT(t), &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web", "db", "ALLOW")}})
	if err != nil {
		t.Fatal(err)
	}
	bad := store.DefaultPrefix + "/default/policies/TrafficPermission/bad"
	put, err := st.Client().Put(ctxT(t), bad, `{"kind":"Policy",`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().Delete(ctxT(t), bad); err != nil {
		t.Fatal(err)
	}
	last, err := h.pol.Apply(ctxT(t), &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "web", "db", "DENY")}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		from, to int64
		key      string
		why      string // "": the pairs are judged
	}{
		{"forwards", resp.GetRevision(), put.Header.Revision, "default/policies/TrafficPermission/bad", "does not decode"},
		{"backwards", put.Header.Revision, resp.GetRevision(), "default/policies/TrafficPermission/bad", "does not decode"},
		{"gone again", resp.GetRevision(), last.GetRevision(), "default/policies/TrafficPermission/p", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			diff, err := h.pol.Diff(ctxT(t), &verdictv1.DiffRequest{FromRevision: tc.from, ToRevision: tc.to})
			if err != nil {
				t.Fatal(err)
			}
			if len(diff.GetDifferences()) != 1 || diff.GetDifferences()[0].GetKey() != tc.key {
				t.Fatalf("differences %v, want %s alone", diff.GetDifferences(), tc.key)
			}
			if tc.why == "" {
				if diff.GetFlowsError() != "" || diff.GetFlows() == nil {
					t.Fatalf("flows %v, %q: want them judged", diff.GetFlows(), diff.GetFlowsError())
				}
				return
			}
			if !strings.Contains(diff.GetFlowsError(), tc.why) || diff.GetFlows() != nil {
				t.Fatalf("flows %v, %q: want none, and why: %s", diff.GetFlows(), diff.GetFlowsError(), tc.why)
			}
		})
	}
}
