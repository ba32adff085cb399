package peers

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

var sizesFlag = flag.String("sizes", "1000,10000", "policy-set sizes of TestAgreement and the benchmarks, comma-separated")

func testSizes(t testing.TB) []int {
	if testing.Short() {
		return []int{1000}
	}
	var out []int
	for s := range strings.SplitSeq(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("-sizes: %q is not a positive number", s)
		}
		out = append(out, n)
	}
	return out
}

// handSet is a small set that uses every translated feature in ways the
// generator rarely does: NotIn, Exists, DoesNotExist, one-value In, several
// port entries, port ranges without protocol, ICMP, several selectors.
func handSet(combine resource.Combine) *policygen.Set {
	mesh := &resource.Mesh{Name: resource.DefaultMesh}
	if combine != resource.FirstMatch {
		mesh.Types = map[string]resource.TypeSettings{resource.DefaultType: {Combine: combine}}
	}
	svc := func(s string) resource.Selector {
		return resource.Selector{Match: map[string]string{resource.ServiceTag: s}}
	}
	pol := func(name string, prio int32, action resource.Action, src, dst []resource.Selector, ports ...resource.PortEntry) *resource.Policy {
		return &resource.Policy{Mesh: resource.DefaultMesh, Type: resource.DefaultType, Name: name, Priority: prio,
			Action: action, Sources: src, Destinations: dst, Ports: ports}
	}
	all := []resource.Selector{{}}
	return &policygen.Set{Config: policygen.Config{Mesh: resource.DefaultMesh, Type: resource.DefaultType}, Resources: []resource.Resource{
		mesh,
		pol("web-to-api", 1, resource.Allow, []resource.Selector{svc("web")}, []resource.Selector{svc("api")}),
		pol("web-prod-deny", 1, resource.Deny, []resource.Selector{{Match: map[string]string{resource.ServiceTag: "web", "env": "prod"}}},
			[]resource.Selector{svc("api")}, resource.PortEntry{Protocol: resource.TCP, Ports: "8000-8100,9000"}),
		pol("any-env-to-db", 2, resource.Allow, []resource.Selector{{Match: map[string]string{"env": "*"}}},
			[]resource.Selector{svc("db")}, resource.PortEntry{Ports: "5432"}, resource.PortEntry{Protocol: resource.UDP}),
		pol("not-dev-to-db", 0, resource.Deny, []resource.Selector{{Expressions: []resource.Expression{
			{Key: "env", Operator: resource.OpNotIn, Values: []string{"dev", "staging"}}}}},
			[]resource.Selector{svc("db")}, resource.PortEntry{Protocol: resource.ICMP}),
		pol("one-value-in", 2, resource.Allow, []resource.Selector{{Expressions: []resource.Expression{
			{Key: resource.ServiceTag, Operator: resource.OpIn, Values: []string{"web"}}}}}, []resource.Selector{svc("db")}),
		pol("unlabelled", 3, resource.Deny, []resource.Selector{{Expressions: []resource.Expression{
			{Key: "env", Operator: resource.OpDoesNotExist}, {Key: resource.ServiceTag, Operator: resource.OpExists}}}}, all),
		pol("two-by-two", 3, resource.Allow, []resource.Selector{svc("web"), svc("db")}, []resource.Selector{svc("api"), {Match: map[string]string{"env": "*"}}},
			resource.PortEntry{Protocol: resource.TCP, Ports: "80,443"}),
		pol("catch-everything", 4, resource.Allow, all, all, resource.PortEntry{Protocol: resource.UDP, Ports: "53"}),
	}}
}

// handFlows crosses a few workloads with a few protocols and ports.
func handFlows() []engine.Request {
	workloads := []resource.Tags{
		{},
		{resource.ServiceTag: "web"},
		{resource.ServiceTag: "web", "env": "prod"},
		{resource.ServiceTag: "web", "env": "dev"},
		{resource.ServiceTag: "api", "env": "staging"},
		{resource.ServiceTag: "db", "env": "prod"},
		{resource.ServiceTag: "db"},
		{"env": "prod"},
	}
	traffic := []struct {
		proto resource.Protocol
		port  uint32
	}{{resource.ProtocolAny, 0}, {resource.TCP, 0}, {resource.TCP, 80}, {resource.TCP, 8050}, {resource.TCP, 9000}, {resource.TCP, 5432},
		{resource.UDP, 53}, {resource.UDP, 5432}, {resource.ICMP, 0}, {resource.ICMP, 8}, {resource.ProtocolAny, 5432}}
	var out []engine.Request
	for _, src := range workloads {
		for _, dst := range workloads {
			for _, tr := range traffic {
				out = append(out, engine.Request{Source: src, Destination: dst, Protocol: tr.proto, Port: tr.port})
			}
		}
	}
	return out
}

func TestHandWrittenCasesAgree(t *testing.T) {
	ctx := context.Background()
	flows := handFlows()
	want := map[string][]Outcome{}
	for _, p := range Peers() {
		t.Run(p.Name, func(t *testing.T) {
			d, err := p.Build(ctx, handSet(p.Combine))
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecideAll(d, flows, len(flows), time.Hour, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if p.Reference == "" {
				want[p.Name] = got
				return
			}
			a := Agree(want[p.Reference], got)
			t.Logf("%s vs %s: %s", p.Name, p.Reference, a)
			if a.Compared != len(flows) || a.Matched == 0 || a.Allow == 0 || a.Deny == 0 {
				t.Errorf("vacuous comparison: %s", a)
			}
			reportMismatches(t, a, flows)
		})
	}
}

// TestAgreement decides the same generated flows in every peer and requires the
// decisions of its reference (verdict): same action, same deciding policy. Run
// with -sizes 1000,10000,100000 for the largest set (minutes: OPA's data
// formulation takes about a second per decision there).
func TestAgreement(t *testing.T) {
	ctx := context.Background()
	for _, pr := range Profiles {
		for _, n := range testSizes(t) {
			t.Run(fmt.Sprintf("%s/policies=%d", pr.Name, n), func(t *testing.T) {
				flows := Flows(pr.Profile, n, 2000)
				minFlows := map[bool]int{true: 2000, false: 100}[n <= 1000]
				want := map[string][]Outcome{}
				for _, p := range Peers() {
					t.Run(p.Name, func(t *testing.T) {
						l, err := Load(ctx, p, pr.Profile, n, 5*time.Minute)
						if err != nil {
							t.Fatal(err)
						}
						got, err := DecideAll(l.Decider, flows, minFlows, 20*time.Second, 10*time.Second)
						if err != nil {
							t.Fatal(err)
						}
						if p.Reference == "" {
							want[p.Name] = got
							return
						}
						if want[p.Reference] == nil {
							t.Fatalf("reference %s did not run", p.Reference)
						}
						a := Agree(want[p.Reference], got)
						t.Logf("%s vs %s: %s", p.Name, p.Reference, a)
						if a.Compared < minFlows || 10*a.Matched < 3*a.Compared || a.Allow == 0 || a.Deny == 0 {
							t.Errorf("vacuous comparison: %s", a)
						}
						reportMismatches(t, a, flows)
					})
				}
			})
		}
	}
}

func reportMismatches(t *testing.T, a Agreement, flows []engine.Request) {
	t.Helper()
	for i, m := range a.Mismatches {
		if i == 5 {
			t.Errorf("... and %d more", len(a.Mismatches)-i)
			break
		}
		f := flows[m.Flow]
		t.Errorf("flow %d %v -> %v %s %d: reference %s, peer %s", m.Flow, f.Source, f.Destination, f.Protocol, f.Port, m.Want, m.Got)
	}
}
