package server

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/etcd"
)

// pastWorld is analysisWorld, then three writes that change what Reach,
// Matrix and Lint answer: a workload joins, the database's port moves, the
// deny-all goes.
var pastWorld = []string{analysisWorld, `
kind: Workload
name: backend-3
tags: {app: backend}
`, `
kind: Policy
name: backend-to-db
sources: [{match: {app: backend}}]
destinations: [{match: {app: db}}]
ports: [{protocol: TCP, ports: "6432"}]
---
kind: Policy
name: web-to-db
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
`, `-default/policies/TrafficPermission/deny-all-to-db`}

// writePastWorld writes pastWorld's steps to st, one revision each, and
// returns the revisions.
func writePastWorld(t *testing.T, st *etcd.Store) []int64 {
	t.Helper()
	var revs []int64
	for _, step := range pastWorld {
		var ops []store.Op
		if key, ok := cutDelete(step); ok {
			k, err := resource.ParseKey(key)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, store.Op{Key: k})
		} else {
			for _, r := range decodeYAML(t, step) {
				ops = append(ops, store.Op{Key: r.Key(), Resource: r})
			}
		}
		rev, err := st.Apply(ctxT(t), ops)
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	return revs
}

func cutDelete(step string) (string, bool) {
	if len(step) > 0 && step[0] == '-' {
		return step[1:], true
	}
	return "", false
}

// freshAt is a server of its own on the documents st held at rev: a fresh
// engine, built from nothing but them.
func freshAt(t *testing.T, st *etcd.Store, rev int64) verdictv1.AnalysisServiceClient {
	t.Helper()
	var rs []resource.Resource
	opts := store.ListOptions{Revision: rev}
	for {
		page, err := st.List(ctxT(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page.Items {
			rs = append(rs, it.Change().Resource)
		}
		if opts.PageToken = page.NextPageToken; opts.PageToken == "" {
			break
		}
	}
	return verdictv1.NewAnalysisServiceClient(start(t, newBackend(rs...), nil).conn)
}

// analysisAnswers are Reach (to and from every workload, on the ports
// that matter), Matrix and Lint as c answers them, with past set on every
// request; the revisions they carry are returned apart.
func analysisAnswers(t *testing.T, c verdictv1.AnalysisServiceClient, past func(rev *int64, at **timestamppb.Timestamp)) (answers []proto.Message, revs []int64) {
	t.Helper()
	ctx := ctxT(t)
	for _, w := range []string{"db-1", "backend-1", "backend-3", "web-1"} {
		for _, dir := range []verdictv1.ReachDirection{verdictv1.ReachDirection_REACH_DIRECTION_TO, verdictv1.ReachDirection_REACH_DIRECTION_FROM} {
			for _, port := range []uint32{5432, 6432} {
				req := &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: w}, Direction: dir, Protocol: "TCP", Port: port}
				past(&req.AtRevision, &req.AtTime)
				stream, err := c.Reach(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				pages, err := recvErr(stream.Recv)
				if code := status.Code(err); code != codes.OK {
					// backend-3 is not there yet: the same refusal on both.
					answers = append(answers, &verdictv1.ReachResponse{Notes: []string{code.String()}})
					continue
				}
				for _, p := range pages {
					revs = append(revs, p.GetRevision())
					p.Revision = 0
					answers = append(answers, p)
				}
			}
		}
	}
	mreq := &verdictv1.MatrixRequest{}
	past(&mreq.AtRevision, &mreq.AtTime)
	stream, err := c.Matrix(ctx, mreq)
	if err != nil {
		t.Fatal(err)
	}
	pages, err := recvErr(stream.Recv)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		revs = append(revs, p.GetRevision())
		p.Revision = 0
		answers = append(answers, p)
	}
	lreq := &verdictv1.LintRequest{}
	past(&lreq.AtRevision, &lreq.AtTime)
	lint, err := c.Lint(ctx, lreq)
	if err != nil {
		t.Fatal(err)
	}
	revs = append(revs, lint.GetRevision())
	lint.Revision = 0
	return append(answers, lint), revs
}

// recvErr reads a server stream to its end, or to its error.
func recvErr[T any](recv func() (T, error)) ([]T, error) {
	var out []T
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

// firstErr is the error of a stream's call or of its first message.
func firstErr[T any](stream interface{ Recv() (T, error) }, err error) error {
	if err != nil {
		return err
	}
	_, err = recvErr(stream.Recv)
	return err
}

// sameAnswers fails the test where got differs from want.
func sameAnswers(t *testing.T, at string, want, got []proto.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d answers, a fresh engine gives %d", at, len(got), len(want))
		return
	}
	for i := range want {
		if !proto.Equal(want[i], got[i]) {
			t.Errorf("%s: answer %d:\n%s\na fresh engine answers\n%s", at, i, prototext.Format(got[i]), prototext.Format(want[i]))
		}
	}
}

// TestAnalysisAtPastRevisions: Reach, Matrix and Lint at each past revision
// (and at the time of one) answer as a fresh engine built from the
// documents as they were then, and say which revision answered.
func TestAnalysisAtPastRevisions(t *testing.T) {
	t.Parallel()
	h, st := etcdServer(t, nil)
	revs := writePastWorld(t, st)
	if _, err := h.pol.List(ctxT(t), &verdictv1.ListRequest{MinRevision: revs[len(revs)-1]}); err != nil {
		t.Fatal(err) // the current snapshot holds every write: the past is not it
	}
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	for _, rev := range revs {
		want, _ := analysisAnswers(t, freshAt(t, st, rev), func(*int64, **timestamppb.Timestamp) {})
		got, gotRevs := analysisAnswers(t, an, func(r *int64, _ **timestamppb.Timestamp) { *r = rev })
		sameAnswers(t, fmt.Sprintf("at revision %d", rev), want, got)
		for _, r := range gotRevs {
			if r != rev {
				t.Errorf("at revision %d: an answer says revision %d", rev, r)
			}
		}
	}

	// at_time: the time recorded for the second write answers as of it.
	hist, err := h.pol.History(ctxT(t), &verdictv1.HistoryRequest{Key: "default/workloads/backend-3"})
	if err != nil || len(hist.GetVersions()) != 1 {
		t.Fatalf("history of backend-3: %v, %v", hist, err)
	}
	at := hist.GetVersions()[0].GetTime()
	want, _ := analysisAnswers(t, freshAt(t, st, revs[1]), func(*int64, **timestamppb.Timestamp) {})
	got, gotRevs := analysisAnswers(t, an, func(_ *int64, t **timestamppb.Timestamp) { *t = at })
	sameAnswers(t, fmt.Sprintf("at %v", at.AsTime()), want, got)
	for _, r := range gotRevs {
		if r != revs[1] {
			t.Errorf("at %v: an answer says revision %d, want %d", at.AsTime(), r, revs[1])
		}
	}
}

// TestAnalysisPastRequests: the fields of a read of the past are checked
// as Decide's are, and need an authorized caller.
func TestAnalysisPastRequests(t *testing.T) {
	t.Parallel()
	h, st := etcdServer(t, func(c *Config) { c.Token = "past-token" })
	revs := writePastWorld(t, st)
	authed := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer past-token")
	an := verdictv1.NewAnalysisServiceClient(h.conn)
	reach := func(mod func(*verdictv1.ReachRequest)) *verdictv1.ReachRequest {
		r := &verdictv1.ReachRequest{Endpoint: &verdictv1.Endpoint{Workload: "db-1"}, Direction: verdictv1.ReachDirection_REACH_DIRECTION_TO}
		mod(r)
		return r
	}
	cases := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"Reach at a revision without the token", func() error {
			return firstErr(an.Reach(ctxT(t), reach(func(r *verdictv1.ReachRequest) { r.AtRevision = revs[0] })))
		}, codes.Unauthenticated},
		{"Reach with at_revision and min_revision", func() error {
			return firstErr(an.Reach(authed, reach(func(r *verdictv1.ReachRequest) { r.AtRevision, r.MinRevision = revs[0], revs[0] })))
		}, codes.InvalidArgument},
		{"Reach at a revision not reached", func() error {
			return firstErr(an.Reach(authed, reach(func(r *verdictv1.ReachRequest) { r.AtRevision = revs[3] + 100 })))
		}, codes.OutOfRange},
		{"Matrix with a negative at_revision", func() error {
			return firstErr(an.Matrix(authed, &verdictv1.MatrixRequest{AtRevision: -1}))
		}, codes.InvalidArgument},
		{"Matrix with at_revision and at_time", func() error {
			return firstErr(an.Matrix(authed, &verdictv1.MatrixRequest{AtRevision: revs[0], AtTime: timestamppb.Now()}))
		}, codes.InvalidArgument},
		{"Lint at a revision", func() error {
			_, err := an.Lint(authed, &verdictv1.LintRequest{AtRevision: revs[0]})
			return err
		}, codes.OK},
		{"Lint at a revision without the token", func() error {
			_, err := an.Lint(ctxT(t), &verdictv1.LintRequest{AtRevision: revs[0]})
			return err
		}, codes.Unauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(tc.call()); got != tc.want {
				t.Fatalf("code %v, want %v", got, tc.want)
			}
		})
	}
}
