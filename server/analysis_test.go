package server

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

const analysisWorld = `
kind: Policy
name: backend-to-db
sources: [{match: {app: backend}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "5432"}]
---
kind: Policy
name: deny-all-to-db
sources: [{match: {app: '*'}}]
destinations: [{match: {app: db}}]
action: DENY
---
kind: Workload
name: db-1
tags: {app: db}
addresses: [10.0.0.5]
---
kind: Workload
name: backend-1
tags: {app: backend}
---
kind: Workload
name: backend-2
tags: {app: backend}
---
kind: Workload
name: web-1
tags: {app: web}
`

// recvAll reads a server stream to its end.
func recvAll[T any](t *testing.T, recv func() (T, error)) []T {
	t.Helper()
	var out []T
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
}

func TestReachListsTheAllowedWorkloads(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	cases := []struct {
		name string
		req  *verdictv1.ReachRequest
		want []string
	}{
		{"who reaches the database's port", &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"},
			Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO, Protocol: "TCP", Port: 5432}, []string{"backend-1", "backend-2"}},
		{"another port: nobody", &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"},
			Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO, Protocol: "TCP", Port: 80}, nil},
		{"what a backend reaches", &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "backend-1"},
			Direction: verdictv1.ReachDirection_REACH_DIRECTION_FROM, Protocol: "TCP", Port: 5432},
			[]string{"db-1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream, err := an.Reach(ctxT(t), c.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, page := range recvAll(t, stream.Recv) {
				if page.GetRevision() == 0 {
					t.Errorf("a page without its revision")
				}
				for _, e := range page.GetEntries() {
					if e.GetWorkload() != "" {
						got = append(got, e.GetWorkload())
					}
				}
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("workloads %v, want %v", got, c.want)
			}
		})
	}
}

func TestReachNamesTheDecidingPolicies(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
	stream, err := verdictv1.NewAnalysisServiceClient(h.conn).Reach(ctxT(t), &verdictv1.ReachRequest{
		Endpoint: &verdictv1.Endpoint{Workload: "db-1"}, Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO, Protocol: "TCP", Port: 5432})
	if err != nil {
		t.Fatal(err)
	}
	pages := recvAll(t, stream.Recv)
	if len(pages) != 1 || pages[0].GetEndpoint().GetWorkload() != "db-1" {
		t.Fatalf("pages %v", pages)
	}
	for _, e := range pages[0].GetEntries() {
		if e.GetWorkload() == "" {
			t.Errorf("an outside entry %v: every address is denied by deny-all-to-db", e)
		}
		if e.GetOutboundPolicy() != "backend-to-db" || e.GetInboundPolicy() != "backend-to-db" || e.GetIdentity() == 0 {
			t.Errorf("entry %v", e)
		}
	}
}

func TestMatrixPagesTheAllowedPairs(t *testing.T) {
	t.Parallel()
	// 40 workloads of one service that may call itself on 8080: 1600 pairs,
	// two pages.
	world := "kind: Policy\nname: self\nsources: [{match: {app: api}}]\ndestinations: [{match: {app: api}}]\nports: [{protocol: TCP, ports: \"8080\"}]\n"
	for i := 0; i < 40; i++ {
		world += fmt.Sprintf("---\nkind: Workload\nname: api-%02d\ntags: {app: api}\n", i)
	}
	h := start(t, newBackend(decodeYAML(t, world)...), nil)
	stream, err := verdictv1.NewAnalysisServiceClient(h.conn).Matrix(ctxT(t), &verdictv1.MatrixRequest{Protocol: "TCP", Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	pages := recvAll(t, stream.Recv)
	n := 0
	for _, p := range pages {
		if len(p.GetEntries()) > pageSize {
			t.Fatalf("a page of %d entries", len(p.GetEntries()))
		}
		for _, e := range p.GetEntries() {
			if e.GetPortLo() != 8080 || e.GetPortHi() != 8080 || e.GetOutboundPolicy() != "self" {
				t.Fatalf("entry %v", e)
			}
		}
		n += len(p.GetEntries())
	}
	if n != 1600 || len(pages) != 2 {
		t.Fatalf("%d entries in %d pages, want 1600 in 2", n, len(pages))
	}
}

func TestImpactReportsTheChangedFlows(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	denyBackend := policyRes(&verdictv1.Policy{Name: "deny-backend-2", Action: "DENY", Priority: -1,
		Sources: []*verdictv1.Selector{{Match: map[string]string{"app": "backend"}}}, Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "db"}}}})
	observed := &verdictv1.DecisionRecord{Source: &verdictv1.RecordEndpoint{Workload: "backend-2"},
		Destination: &verdictv1.RecordEndpoint{Address: "10.0.0.5"}, Protocol: "TCP", Port: 5432}
	cases := []struct {
		name string
		req  *verdictv1.ImpactRequest
		// flows denied by the change that were allowed, and changes in all
		denied, changes int
	}{
		{"an unrelated policy changes nothing", &verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{
			sdPolicy("cache-to-cache", "cache", "cache", "ALLOW")}, Flows: []*verdictv1.DecisionRecord{observed}}, 0, 0},
		// backend-1 and backend-2 to db-1 on TCP 5432, and the observed
		// flow; on the other classes deny-all-to-db denied already, now
		// deny-backend-2 does (the deciding policy changes: 14 more).
		{"a deny on an allowed flow", &verdictv1.ImpactRequest{Resources: []*verdictv1.Resource{denyBackend},
			Flows: []*verdictv1.DecisionRecord{observed}}, 3, 17},
		{"deleting the permission", &verdictv1.ImpactRequest{Deletes: []string{"default/policies/TrafficPermission/backend-to-db"}}, 2, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := an.Impact(ctxT(t), c.req)
			if err != nil {
				t.Fatal(err)
			}
			denied := 0
			for _, ch := range resp.GetChanges() {
				if ch.GetBefore().GetAction() == verdictv1.Action_ACTION_ALLOW && ch.GetAfter().GetAction() == verdictv1.Action_ACTION_DENY {
					denied++
				}
			}
			if denied != c.denied || len(resp.GetChanges()) != c.changes {
				t.Fatalf("%d denied of %d changes, want %d of %d: %v", denied, len(resp.GetChanges()), c.denied, c.changes, resp.GetChanges())
			}
			if resp.GetRevision() == 0 || c.changes > 0 && len(resp.GetGroups()) == 0 {
				t.Fatalf("revision %d, groups %v", resp.GetRevision(), resp.GetGroups())
			}
		})
	}
}

func TestAnalysisNeedsAnAuthorizedCaller(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), func(c *Config) { c.Token = "s3cret" })
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	reach := &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"}, Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO}
	calls := map[string]func(opts ...grpc.CallOption) error{
		"Reach": func(opts ...grpc.CallOption) error {
			s, err := an.Reach(ctxT(t), reach, opts...)
			if err == nil {
				_, err = s.Recv()
			}
			return err
		},
		"Matrix": func(opts ...grpc.CallOption) error {
			s, err := an.Matrix(ctxT(t), &verdictv1.MatrixRequest{}, opts...)
			if err == nil {
				_, err = s.Recv()
			}
			return err
		},
		"Impact": func(opts ...grpc.CallOption) error {
			_, err := an.Impact(ctxT(t), &verdictv1.ImpactRequest{Deletes: []string{"default/policies/TrafficPermission/backend-to-db"}}, opts...)
			return err
		},
		"Lint": func(opts ...grpc.CallOption) error {
			_, err := an.Lint(ctxT(t), &verdictv1.LintRequest{}, opts...)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			wantCode(t, call(), codes.Unauthenticated)
		})
	}
}

func TestAnalysisRequestsAreValidated(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	cases := []struct {
		name  string
		req   *verdictv1.ReachRequest
		field string
	}{
		{"no direction", &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"}}, "direction"},
		{"two forms", &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1", Address: "10.0.0.1"},
			Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO}, "endpoint.address"},
		{"a bad protocol", &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"},
			Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO, Protocol: "SCTP"}, "protocol"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := an.Reach(ctxT(t), c.req)
			if err == nil {
				_, err = s.Recv()
			}
			st := wantCode(t, err, codes.InvalidArgument)
			if _, ok := violations(st)[c.field]; !ok {
				t.Fatalf("violations %v, want %s", violations(st), c.field)
			}
		})
	}
	s, err := an.Reach(ctxT(t), &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "nobody"}, Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, err, codes.NotFound)
}

func TestLintReportsTheRulesAChangeShadows(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, analysisWorld)...), nil)
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	absolute := policyRes(&verdictv1.Policy{Name: "lockdown", Action: "DENY", Rank: "Absolute",
		Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "db"}}}})
	type found struct {
		kind       verdictv1.FindingKind
		policy     string
		introduced bool
	}
	cases := []struct {
		name string
		req  *verdictv1.LintRequest
		want []found // the error- and warning-level findings
	}{
		// with defaultAction DENY, removing deny-all-to-db changes no answer
		{"the store as it is", &verdictv1.LintRequest{}, []found{{verdictv1.FindingKind_FINDING_KIND_REDUNDANT, "deny-all-to-db", false}}},
		{"an absolute deny of everything to the database", &verdictv1.LintRequest{Resources: []*verdictv1.Resource{absolute}}, []found{
			{verdictv1.FindingKind_FINDING_KIND_SHADOWED, "backend-to-db", true},
			{verdictv1.FindingKind_FINDING_KIND_SHADOWED, "deny-all-to-db", true}}},
		{"one mesh and type", &verdictv1.LintRequest{Mesh: "default", Type: "TrafficPermission", Resources: []*verdictv1.Resource{absolute}}, []found{
			{verdictv1.FindingKind_FINDING_KIND_SHADOWED, "backend-to-db", true},
			{verdictv1.FindingKind_FINDING_KIND_SHADOWED, "deny-all-to-db", true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := an.Lint(ctxT(t), c.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []found
			for _, f := range resp.GetFindings() {
				if f.GetSeverity() >= verdictv1.Severity_SEVERITY_WARNING {
					got = append(got, found{f.GetKind(), f.GetPolicy(), f.GetIntroduced()})
				}
				if f.GetKind() == verdictv1.FindingKind_FINDING_KIND_SHADOWED {
					w := f.GetWitness()
					if w.GetDecided().GetPolicy() != "lockdown" || len(f.GetRelated()) != 1 || f.GetRelated()[0].GetPolicy() != "lockdown" {
						t.Fatalf("%s: witness %v, covered by %v; want lockdown", f.GetPolicy(), w, f.GetRelated())
					}
				}
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("findings %v, want %v\n%v", got, c.want, resp.GetFindings())
			}
			if resp.GetRevision() == 0 {
				t.Fatal("no revision")
			}
		})
	}
	_, err := an.Lint(ctxT(t), &verdictv1.LintRequest{Mesh: "nowhere"})
	wantCode(t, err, codes.NotFound)
	_, err = an.Lint(ctxT(t), &verdictv1.LintRequest{Deletes: []string{"not a key"}})
	wantCode(t, err, codes.InvalidArgument)
}
