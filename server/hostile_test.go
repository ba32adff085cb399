package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/syncer"
)

// rawCodec sends a request's bytes as they are, so that a test can send what
// the Go protobuf library refuses to encode (invalid UTF-8, truncated fields),
// as a client in another language or a hand-made frame could.
type rawCodec struct{}

type rawMsg []byte

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawMsg); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// corrupt marshals m and replaces every "@@@@" in its bytes with invalid UTF-8.
func corrupt(t testing.TB, m proto.Message) rawMsg {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("@@@@")) {
		t.Fatal("corrupt: no @@@@ placeholder in the message")
	}
	return rawMsg(bytes.ReplaceAll(b, []byte("@@@@"), []byte("\xff\xfe\xfd\xfc")))
}

func manyTags(n, valueLen int) *verdictv1.Endpoint {
	w := &verdictv1.Endpoint{Tags: make(map[string]string, n)}
	for i := range n {
		w.Tags[fmt.Sprintf("key-%05d", i)] = strings.Repeat("v", valueLen)
	}
	return w
}

func deepStruct(depth int) *structpb.Struct {
	v := structpb.NewStringValue("bottom")
	for range depth {
		v = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": v}})
	}
	return v.GetStructValue()
}

func whenPolicy(name, when string) *verdictv1.Resource {
	rules, _ := structpb.NewStruct(map[string]any{"limit": 10})
	return policyRes(&verdictv1.Policy{Name: name, Type: "RateLimit",
		Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}},
		Defaults: &verdictv1.Block{When: when, Rules: rules}})
}

// TestHostileRequests sends oversized and malformed requests to a real server
// (the real syncer on store/memory, over bufconn): each is refused with
// INVALID_ARGUMENT naming the field, or RESOURCE_EXHAUSTED for a message over
// the size limit, nothing crashes, and the server answers normally afterwards.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := memory.New(memory.Config{})
	defer st.Close()
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = sy.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	h := start(t, nil, func(c *Config) { c.Syncer, c.Store = sy, st })
	c := ctxT(t)
	seed, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("web-to-api", "web", "api", "")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.dec.Decide(c, &verdictv1.DecideRequest{MinRevision: seed.GetRevision()}); err != nil {
		t.Fatal(err)
	}
	raw := func(method string, m rawMsg, out proto.Message) error {
		return h.conn.Invoke(c, method, m, out, grpc.ForceCodecV2(rawCodec{}))
	}
	nested := "true"
	for range 100 {
		nested = "(" + nested + ")"
	}
	l := "[1,2,3,4,5,6,7,8,9,10]"
	explodes := l + ".map(a, " + l + ".map(b, " + l + ".map(c, " + l + ".map(d, " + l + ".map(e, " + l + ".map(f, a+b+c+d+e+f)))))).size() > 0"

	tests := []struct {
		name  string
		call  func() error
		code  codes.Code
		field string // a BadRequest field violation (InvalidArgument), or text of the message
	}{
		{"10k tags", func() error {
			_, err := h.dec.Decide(c, &verdictv1.DecideRequest{Source: manyTags(10_000, 1)})
			return err
		}, codes.InvalidArgument, "source.tags"},
		{"1 MiB tag value", func() error {
			_, err := h.dec.Decide(c, &verdictv1.DecideRequest{Destination: tags("app", strings.Repeat("v", 1<<20))})
			return err
		}, codes.InvalidArgument, "destination.tags"},
		{"tag key of 4 KiB", func() error {
			_, err := h.dec.Decide(c, &verdictv1.DecideRequest{Source: tags(strings.Repeat("k", 4096), "v")})
			return err
		}, codes.InvalidArgument, "source.tags"},
		{"5 MiB message", func() error {
			_, err := h.dec.Decide(c, &verdictv1.DecideRequest{Source: tags("app", strings.Repeat("v", 5<<20))})
			return err
		}, codes.ResourceExhausted, "over the limit of 4194304"},
		{"message over gRPC's own limit", func() error {
			_, err := h.dec.Decide(c, &verdictv1.DecideRequest{Source: tags("app", strings.Repeat("v", DefaultMaxRecvMsgBytes+ReceiveHeadroom))})
			return err
		}, codes.ResourceExhausted, "larger than max"},
		{"invalid UTF-8 in a tag value", func() error {
			return raw(verdictv1.DecisionService_Decide_FullMethodName,
				corrupt(t, &verdictv1.DecideRequest{Source: tags("app", "@@@@")}), &verdictv1.DecideResponse{})
		}, codes.InvalidArgument, "source.tags"},
		{"invalid UTF-8 in a tag key", func() error {
			return raw(verdictv1.DecisionService_Decide_FullMethodName,
				corrupt(t, &verdictv1.DecideRequest{Destination: tags("@@@@", "x")}), &verdictv1.DecideResponse{})
		}, codes.InvalidArgument, "destination.tags"},
		{"invalid UTF-8 in the mesh", func() error {
			return raw(verdictv1.DecisionService_Decide_FullMethodName,
				corrupt(t, &verdictv1.DecideRequest{Mesh: "@@@@"}), &verdictv1.DecideResponse{})
		}, codes.InvalidArgument, "mesh"},
		{"truncated message", func() error {
			b, _ := proto.Marshal(&verdictv1.DecideRequest{Mesh: "default", Source: tags("app", "web")})
			return raw(verdictv1.DecisionService_Decide_FullMethodName, rawMsg(b[:len(b)-3]), &verdictv1.DecideResponse{})
		}, codes.InvalidArgument, "source"},
		{"invalid UTF-8 in one flow of a batch", func() error {
			return raw(verdictv1.DecisionService_DecideBatch_FullMethodName,
				corrupt(t, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{{}, {Source: tags("app", "@@@@")}}}),
				&verdictv1.DecideBatchResponse{})
		}, codes.InvalidArgument, "requests[1].source.tags"},
		{"batch of 1001 flows", func() error {
			_, err := h.dec.DecideBatch(c, &verdictv1.DecideBatchRequest{Requests: make([]*verdictv1.DecideRequest, 1001)})
			return err
		}, codes.InvalidArgument, "requests"},
		{"batch of 100k flows", func() error {
			reqs := make([]*verdictv1.DecideRequest, 100_000)
			for i := range reqs {
				reqs[i] = &verdictv1.DecideRequest{Port: 80}
			}
			_, err := h.dec.DecideBatch(c, &verdictv1.DecideBatchRequest{Requests: reqs})
			return err
		}, codes.InvalidArgument, "requests"},
		{"batch over 4 MiB", func() error {
			reqs := make([]*verdictv1.DecideRequest, 1000)
			for i := range reqs {
				reqs[i] = &verdictv1.DecideRequest{Source: tags("app", strings.Repeat("v", 5000))}
			}
			_, err := h.dec.DecideBatch(c, &verdictv1.DecideBatchRequest{Requests: reqs})
			return err
		}, codes.ResourceExhausted, "over the limit of 4194304"},
		{"policy with a 1 MiB conf", func() error {
			conf, _ := structpb.NewStruct(map[string]any{"blob": strings.Repeat("x", 1<<20)})
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Name: "big",
				Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}}, Conf: conf})}})
			return err
		}, codes.InvalidArgument, "resources[0].policy"},
		{"Apply of 200 resources", func() error {
			rs := make([]*verdictv1.Resource, 200)
			for i := range rs {
				rs[i] = sdPolicy(fmt.Sprintf("p%d", i), "a", "b", "")
			}
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: rs})
			return err
		}, codes.InvalidArgument, "resources"},
		{"conf nested 3000 levels", func() error {
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Name: "deep",
				Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}}, Conf: deepStruct(3000)})}})
			return err
		}, codes.InvalidArgument, "resources[0].policy"},
		{"conf nested beyond protobuf's recursion limit", func() error {
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Name: "deeper",
				Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}}, Conf: deepStruct(6000)})}})
			return err
		}, codes.InvalidArgument, "resources[0].policy.conf"},
		{"NaN in a conf", func() error {
			conf := &structpb.Struct{Fields: map[string]*structpb.Value{"rate": structpb.NewNumberValue(math.NaN())}}
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Name: "nan",
				Sources: []*verdictv1.Selector{{}}, Destinations: []*verdictv1.Selector{{}}, Conf: conf})}})
			return err
		}, codes.InvalidArgument, "resources[0].policy"},
		{"selector with 10k match entries", func() error {
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{policyRes(&verdictv1.Policy{Name: "wide",
				Sources: []*verdictv1.Selector{{Match: manyTags(10_000, 3).Tags}}, Destinations: []*verdictv1.Selector{{}}})}})
			return err
		}, codes.InvalidArgument, "resources[0].policy.sources[0].match"},
		{"invalid UTF-8 in a policy name", func() error {
			return raw(verdictv1.PolicyService_Apply_FullMethodName, corrupt(t, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
				sdPolicy("@@@@", "a", "b", "")}}), &verdictv1.ApplyResponse{})
		}, codes.InvalidArgument, "resources[0].policy.name"},
		{"CEL nested 100 levels", func() error {
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{whenPolicy("nested", nested)}})
			return err
		}, codes.InvalidArgument, "resources[0].policy.defaults.when"},
		{"CEL of 8 KiB", func() error {
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
				whenPolicy("long", strings.Repeat("true && ", 1024)+"true")}})
			return err
		}, codes.InvalidArgument, "resources[0].policy.defaults.when"},
		{"CEL that does not type-check", func() error {
			_, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{whenPolicy("typo", `self.rules.limit + "x"`)}})
			return err
		}, codes.InvalidArgument, "resources[0].policy.defaults.when"},
		{"key of 1 MiB", func() error {
			_, err := h.pol.Get(c, &verdictv1.GetRequest{Key: "default/policies/TrafficPermission/" + strings.Repeat("x", 1<<20)})
			return err
		}, codes.InvalidArgument, "key"},
		{"page token that is not one", func() error {
			_, err := h.pol.List(c, &verdictv1.ListRequest{PageToken: "\x00not a token"})
			return err
		}, codes.InvalidArgument, "pageToken"},
		{"page size of a million", func() error {
			_, err := h.pol.List(c, &verdictv1.ListRequest{PageSize: 1_000_000})
			return err
		}, codes.InvalidArgument, "pageSize"},
		{"negative min_revision", func() error {
			_, err := h.pol.Status(c, &verdictv1.StatusRequest{MinRevision: -5})
			return err
		}, codes.InvalidArgument, "minRevision"},
		{"WatchRules of a workload with 10k tags", func() error {
			s, err := h.wat.WatchRules(c, &verdictv1.WatchRulesRequest{Workload: manyTags(10_000, 1)})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.InvalidArgument, "workload.tags"},
		{"WatchResources with invalid UTF-8 in the prefix", func() error {
			desc := &grpc.StreamDesc{ServerStreams: true}
			s, err := h.conn.NewStream(c, desc, verdictv1.WatchService_WatchResources_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				return err
			}
			if err := s.SendMsg(corrupt(t, &verdictv1.WatchResourcesRequest{Prefix: "@@@@"})); err != nil {
				return err
			}
			_ = s.CloseSend()
			return s.RecvMsg(&verdictv1.WatchResourcesResponse{})
		}, codes.InvalidArgument, "prefix"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			st := wantCode(t, err, tc.code)
			if tc.code == codes.InvalidArgument {
				v := violations(st)
				if _, ok := v[tc.field]; !ok {
					t.Errorf("no field violation %q in %v (%s)", tc.field, v, st.Message())
				}
				if !strings.Contains(st.Message(), tc.field) {
					t.Errorf("message %q does not name %q", st.Message(), tc.field)
				}
			} else if !strings.Contains(st.Message(), tc.field) {
				t.Errorf("message %q does not say %q", st.Message(), tc.field)
			}
		})
	}

	t.Run("CEL that explodes is cut by the cost limit", func(t *testing.T) {
		ap, err := h.pol.Apply(c, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{whenPolicy("explodes", explodes)}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		rr, err := h.dec.Resolve(c, &verdictv1.ResolveRequest{Type: "RateLimit", Source: tags("app", "a"), Destination: tags("app", "b"),
			MinRevision: ap.GetRevision()})
		if err != nil {
			t.Fatal(err)
		}
		if len(rr.GetRules()) != 0 || len(rr.GetStatus()) != 1 || !strings.Contains(strings.Join(rr.GetStatus()[0].GetSkipped(), " "), "cost limit") {
			t.Errorf("Resolve: %v", rr)
		}
		t.Logf("answered in %v", time.Since(start))
		if _, err := h.pol.Delete(c, &verdictv1.DeleteRequest{Keys: []string{"default/policies/RateLimit/explodes"}}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("one bad message never ends a DecideStream", func(t *testing.T) {
		s, err := h.conn.NewStream(c, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
			verdictv1.DecisionService_DecideStream_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		msgs := []rawMsg{
			corrupt(t, &verdictv1.DecideStreamRequest{Id: "bad-utf8", Request: &verdictv1.DecideRequest{Source: tags("app", "@@@@")}}),
			mustMarshal(t, &verdictv1.DecideStreamRequest{Id: "10k-tags", Request: &verdictv1.DecideRequest{Source: manyTags(10_000, 1)}}),
			mustMarshal(t, &verdictv1.DecideStreamRequest{Id: "good", Request: &verdictv1.DecideRequest{Source: tags("app", "web"),
				Destination: tags("app", "api")}}),
		}
		want := map[string]string{"bad-utf8": "request.source.tags", "10k-tags": "request.source.tags", "good": ""}
		for _, m := range msgs {
			if err := s.SendMsg(m); err != nil {
				t.Fatal(err)
			}
			var out verdictv1.DecideStreamResponse
			if err := s.RecvMsg(&out); err != nil {
				t.Fatalf("the stream ended: %v", err)
			}
			field, ok := want[out.GetId()]
			if !ok {
				t.Fatalf("answer with id %q", out.GetId())
			}
			e := out.GetResult().GetError()
			switch {
			case field == "" && (e != nil || out.GetResult().GetResponse().GetPolicy() != "web-to-api"):
				t.Errorf("%s: %v", out.GetId(), out.GetResult())
			case field != "" && (e.GetCode() != codes.InvalidArgument.String() || len(e.GetFieldViolations()) == 0 ||
				e.GetFieldViolations()[0].GetField() != field):
				t.Errorf("%s: %v, want InvalidArgument on %s", out.GetId(), e, field)
			}
		}
		_ = s.CloseSend()
		if err := s.RecvMsg(&verdictv1.DecideStreamResponse{}); !errors.Is(err, io.EOF) {
			t.Errorf("end of stream: %v", err)
		}
	})

	// Still answering, still serving.
	d, err := h.dec.Decide(c, &verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "api")})
	if err != nil || d.GetPolicy() != "web-to-api" {
		t.Fatalf("Decide after the hostile requests: %v %v", d, err)
	}
	hc, err := h.health.Check(c, &healthpb.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after the hostile requests: %v %v", hc, err)
	}
}

func mustMarshal(t testing.TB, m proto.Message) rawMsg {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUndecodableRequestOtherServices: messages of other services (health,
// reflection) keep gRPC's own handling of an undecodable message.
func TestUndecodableRequestOtherServices(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(), nil)
	b, _ := proto.Marshal(&healthpb.HealthCheckRequest{Service: "@@@@"})
	b = bytes.ReplaceAll(b, []byte("@@@@"), []byte("\xff\xfe\xfd\xfc"))
	err := h.conn.Invoke(ctxT(t), "/grpc.health.v1.Health/Check", rawMsg(b), &healthpb.HealthCheckResponse{}, grpc.ForceCodecV2(rawCodec{}))
	if status.Code(err) != codes.Internal {
		t.Errorf("health check with invalid UTF-8: %v", err)
	}
}
