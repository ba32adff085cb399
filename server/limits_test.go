package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// emptyFlows is a DecideBatchRequest of n empty flows (two bytes each).
func emptyFlows(n int) []byte {
	b := make([]byte, 0, 2*n)
	for range n {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, nil)
	}
	return b
}

// TestBatchCountedBeforeDecoding: a batch over MaxBatch is refused from a
// count of its entries on the wire, before any flow is decoded (issue 12 F5:
// two million empty flows in 4 MiB took 1.3 s of CPU each and RSS to 1 GB).
func TestBatchCountedBeforeDecoding(t *testing.T) { // not parallel: AllocsPerRun
	const n = 2_097_000 // just under 4 MiB
	body := emptyFlows(n)
	if len(body) > DefaultMaxRecvMsgBytes {
		t.Fatalf("%d bytes: over the message limit", len(body))
	}
	codec := newRequestCodec()
	for _, tc := range []struct {
		name string
		data mem.BufferSlice
	}{
		{"one buffer", mem.BufferSlice{mem.SliceBuffer(body)}},
		{"two buffers", mem.BufferSlice{mem.SliceBuffer(body[:len(body)/2+1]), mem.SliceBuffer(body[len(body)/2+1:])}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req verdictv1.DecideBatchRequest
			allocs := testing.AllocsPerRun(1, func() {
				req.Reset()
				if err := codec.Unmarshal(tc.data, &req); err != nil {
					t.Fatal(err)
				}
			})
			// Counting allocates nothing per flow (one copy of the bytes when
			// they come in several buffers); decoding them allocated millions.
			if allocs > 20 {
				t.Errorf("%v allocations to refuse %d flows: they were decoded", allocs, n)
			}
			if len(req.GetRequests()) != 0 {
				t.Errorf("%d flows decoded", len(req.GetRequests()))
			}
			fe, ok := undecodable(&req)
			if !ok || fe.Field != "requests" || !strings.Contains(fe.Reason, fmt.Sprint(n)) {
				t.Errorf("marked %v %v, want requests with the count", fe, ok)
			}
		})
	}

	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	var out verdictv1.DecideBatchResponse
	err := h.conn.Invoke(ctxT(t), verdictv1.DecisionService_DecideBatch_FullMethodName, rawMsg(body), &out, grpc.ForceCodecV2(rawCodec{}))
	st := wantCode(t, err, codes.InvalidArgument)
	if v := violations(st)["requests"]; !strings.Contains(v, "2097000 flows, over the limit of 1000") {
		t.Errorf("violation %q", v)
	}
	// At the limit, a batch is decoded and answered.
	err = h.conn.Invoke(ctxT(t), verdictv1.DecisionService_DecideBatch_FullMethodName, rawMsg(emptyFlows(MaxBatch)), &out, grpc.ForceCodecV2(rawCodec{}))
	if err != nil || len(out.GetResults()) != MaxBatch {
		t.Fatalf("a batch of %d: %d results, %v", MaxBatch, len(out.GetResults()), err)
	}
}

// TestManyViolationsAreBounded: however many entries of a request are bad,
// the error lists at most MaxFieldViolations and counts the rest (issue 12:
// 10k expected_revisions made a 1 MB grpc-message trailer).
func TestManyViolationsAreBounded(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	revs := map[string]int64{}
	for i := range 10_000 {
		revs[fmt.Sprintf("default/policies/TrafficPermission/p%05d-%s", i, strings.Repeat("x", 80))] = 7
	}
	bad := make([]string, store.MaxOps)
	for i := range bad {
		bad[i] = fmt.Sprintf("no/such/key/%d", i)
	}
	tests := []struct {
		name  string
		call  func() error
		field string
		more  string // the count of violations not listed, if any
	}{
		{"Apply with 10k expected revisions", func() error {
			_, err := h.pol.Apply(ctxT(t), &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("p", "a", "b", "")},
				ExpectedRevisions: revs})
			return err
		}, "expectedRevisions", ""},
		{"Delete with 10k expected revisions", func() error {
			_, err := h.pol.Delete(ctxT(t), &verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficPermission/p"},
				ExpectedRevisions: revs})
			return err
		}, "expectedRevisions", ""},
		{"Delete of 128 bad keys", func() error {
			_, err := h.pol.Delete(ctxT(t), &verdictv1.DeleteRequest{Keys: bad})
			return err
		}, "keys[0]", fmt.Sprintf("and %d more violations", store.MaxOps-MaxFieldViolations)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := wantCode(t, tc.call(), codes.InvalidArgument)
			if len(st.Message()) > 16<<10 {
				t.Errorf("a message of %d bytes", len(st.Message()))
			}
			v := violations(st)
			if _, ok := v[tc.field]; !ok {
				t.Errorf("violations %v: none on %s", v, tc.field)
			}
			if len(st.Details()) != 1 || len(v) > MaxFieldViolations+1 {
				t.Errorf("%d violations listed", len(v))
			}
			if tc.more != "" && !strings.Contains(st.Message(), tc.more) {
				t.Errorf("message %q does not count the violations not listed", st.Message())
			}
		})
	}
}

// TestExplainBounded: an explanation is cut at MaxExplainBytes (in order,
// Truncated set), and a batch explains at most MaxExplainBatch flows (issue 12
// F6: a 38 KB batch with explain got a 40.6 MB answer).
func TestExplainBounded(t *testing.T) {
	t.Parallel()
	var docs strings.Builder
	docs.WriteString("kind: Mesh\nname: default\n")
	long := strings.Repeat("n", 200)
	for i := range 600 {
		fmt.Fprintf(&docs, "---\nkind: Policy\nname: p%03d-%s\nsources: [{match: {app: '*'}}]\ndestinations: [{match: {app: '*'}}]\n", i, long)
	}
	b := newBackend()
	rs := decodeYAML(t, docs.String())
	for len(rs) > 0 { // one transaction holds store.MaxOps
		n := min(len(rs), store.MaxOps)
		ops := make([]store.Op, n)
		for i, r := range rs[:n] {
			ops[i] = store.Op{Key: r.Key(), Resource: r}
		}
		if _, err := b.Apply(context.Background(), ops); err != nil {
			t.Fatal(err)
		}
		rs = rs[n:]
	}
	h := start(t, b, nil)
	flow := func() *verdictv1.DecideRequest {
		return &verdictv1.DecideRequest{Source: tags("app", "a"), Destination: tags("app", "b"), Explain: true}
	}
	resp, err := h.dec.Decide(ctxT(t), flow())
	if err != nil {
		t.Fatal(err)
	}
	ex := resp.GetExplanation()
	if size := proto.Size(ex); size > MaxExplainBytes {
		t.Errorf("an explanation of %d bytes, over %d", size, MaxExplainBytes)
	}
	for _, side := range []*verdictv1.SideTrace{ex.GetOutbound(), ex.GetInbound()} {
		cands := side.GetCandidates()
		if !side.GetTruncated() || len(cands) == 0 || len(cands) >= 600 {
			t.Fatalf("side with %d candidates, truncated %v: want a cut list", len(cands), side.GetTruncated())
		}
		for i, c := range cands { // the first ones, in order
			if !strings.HasPrefix(c.GetPolicy(), fmt.Sprintf("p%03d-", i)) {
				t.Fatalf("candidate %d is %s", i, c.GetPolicy())
			}
		}
	}
	if resp.GetAction() != verdictv1.Action_ACTION_ALLOW || resp.GetPolicy() != "p000-"+long {
		t.Errorf("the decision changed: %v by %s", resp.GetAction(), resp.GetPolicy())
	}

	batch := func(n int) *verdictv1.DecideBatchRequest {
		b := &verdictv1.DecideBatchRequest{}
		for range n {
			b.Requests = append(b.Requests, flow())
		}
		b.Requests = append(b.Requests, &verdictv1.DecideRequest{}) // not explained: not counted
		return b
	}
	out, err := h.dec.DecideBatch(ctxT(t), batch(MaxExplainBatch))
	if err != nil || len(out.GetResults()) != MaxExplainBatch+1 {
		t.Fatalf("a batch of %d explained flows: %v", MaxExplainBatch, err)
	}
	if size := proto.Size(out); size > (MaxExplainBatch+1)*MaxExplainBytes {
		t.Errorf("a batch answer of %d bytes", size)
	}
	_, err = h.dec.DecideBatch(ctxT(t), batch(MaxExplainBatch+1))
	v := violations(wantCode(t, err, codes.InvalidArgument))
	if _, ok := v[fmt.Sprintf("requests[%d].explain", MaxExplainBatch)]; !ok {
		t.Errorf("violations %v", v)
	}
}
