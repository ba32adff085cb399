package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// FuzzRequests feeds arbitrary JSON requests through validation, translation
// and the engine: nothing may panic, and a request validation accepts must
// translate and decide without a validation error.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{
		`{"resources":[{"policy":{"name":"x","sources":[{"match":{"a":"b"}}],"destinations":[{}],"action":"DENY"}}]}`,
		`{"resources":[{"scope":{"name":"S","selectors":[{"expressions":[{"key":"ip","operator":"CIDR","values":["10.0.0.0/8"]}]}],"catchAll":"DENY"}}],"deletes":["default/scopes/T"]}`,
		`{"resources":[{"mesh":{"name":"m","types":{"T":{"combine":"DenyOverrides"}}}}],"expectedRevisions":{"m/mesh":-1}}`,
		`{"resources":[{"policy":{"name":"t","type":"MTP","targetRef":{"kind":"Service","name":"a"},"from":[{"targetRef":{"kind":"Mesh"},"conf":{"x":1}}]}}]}`,
		`{"source":{"tags":{"app":"web"}},"destination":{"tags":{"app":"db"}},"protocol":"tcp","port":5432,"explain":true}`,
		`{"mesh":"a/b","protocol":"SCTP","port":70000}`,
		`{"source":{"workload":"web-1"},"destination":{"address":"::ffff:10.0.0.1"},"port":8080}`,
		`{"source":{"principal":"spiffe://default/web"},"destination":{"identity":"42","tags":{"a":"b"}}}`,
		`{"source":{"address":"10.0.0.300"},"destination":{"workload":"a/b"}}`,
	} {
		f.Add([]byte(s))
	}
	snap := engine.Build(1, decodeYAML(f, testPolicies))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ap verdictv1.ApplyRequest
		if protojson.Unmarshal(data, &ap) == nil {
			if validateRequest(&ap) == nil {
				if w, err := decodeWrite(ap.GetResources(), ap.GetDeletes(), ap.GetExpectedRevisions()); err == nil {
					_ = snap.CheckApply(w.puts, w.deletes)
				}
			}
		}
		var dr verdictv1.DecideRequest
		if protojson.Unmarshal(data, &dr) == nil && validateRequest(&dr) == nil {
			req := apiconv.DecideRequest(&dr)
			if err := req.Validate(); err != nil {
				t.Fatalf("validated request %s refused by the engine: %v", data, err)
			}
			// Not found: the mesh, or an endpoint's workload or identity.
			if _, err := snap.Decide(&req); err != nil && apiconvCode(err) != "NotFound" {
				t.Fatalf("decide %s: %v", data, err)
			}
		}
	})
}

func apiconvCode(err error) string {
	name, _ := engine.CodeName(err)
	return name
}

// FuzzRequestMessages feeds arbitrary bytes to the server as each request
// message: the codec's decoding (requestCodec), validation, and the handler on
// an in-memory backend. Nothing may panic, the codec never refuses a verdict.v1
// message (it marks it for validation instead), and no request answers
// INTERNAL: a request is either served or refused with a client error.
func FuzzRequestMessages(f *testing.F) {
	seeds := []proto.Message{
		&verdictv1.DecideRequest{Source: tags("app", "web"), Destination: tags("app", "backend"), Protocol: "TCP", Port: 8080, Explain: true},
		&verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{{Mesh: "prod", Source: tags("env", "prod", "app", "web")}, {Protocol: "SCTP"}}},
		&verdictv1.ResolveRequest{Type: "TrafficLog", Source: tags("app", "a"), Destination: tags("app", "db")},
		&verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{sdPolicy("x", "a", "b", "DENY")}, ExpectedRevisions: map[string]int64{"default/policies/TrafficPermission/x": -1}},
		&verdictv1.GetRequest{Key: "default/policies/TrafficPermission/web-to-backend"},
		&verdictv1.ListRequest{Prefix: "default/", PageSize: 2},
		&verdictv1.DeleteRequest{Keys: []string{"default/policies/TrafficPermission/deny-db"}},
		&verdictv1.StatusRequest{},
		&verdictv1.DecideStreamRequest{Id: "1", Request: &verdictv1.DecideRequest{Source: tags("app", "web")}},
		&verdictv1.WatchRulesRequest{Workload: tags("app", "db")},
		&verdictv1.WatchResourcesRequest{Prefix: "default/", FromRevision: 3},
		// Endpoint forms (appended: the corpus's kinds keep their messages).
		&verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Workload: "web-1"}, Destination: &verdictv1.Endpoint{Address: "2001:db8::1"}, Port: 80},
		&verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{{Source: &verdictv1.Endpoint{Principal: "spiffe://default/web"},
			Destination: &verdictv1.Endpoint{Identity: 42}}}},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
		f.Add(uint8(i), b[:len(b)/2])
	}
	b := newBackend(decodeYAML(f, testPolicies)...)
	srv, err := New(Config{Syncer: b, Store: b, WaitTimeout: time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	codec := newRequestCodec()
	dec, pol := srv.decision, srv.policy
	// As the stream interceptor leaves it for DecideStream's handler.
	ctx := withCall(context.Background(), &call{method: verdictv1.DecisionService_DecideStream_FullMethodName,
		row: methodTable[verdictv1.DecisionService_DecideStream_FullMethodName], authorized: true})
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		m := seeds[int(kind)%len(seeds)].ProtoReflect().New().Interface()
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, m); err != nil {
			t.Fatalf("the codec refused a %T: %v", m, err)
		}
		var err error
		switch r := m.(type) {
		case *verdictv1.DecideStreamRequest:
			ans := srv.decision.streamAnswer(ctx, r, true)
			if ans.GetId() != r.GetId() {
				t.Fatalf("answer id %q, want %q", ans.GetId(), r.GetId())
			}
			if e := ans.GetResult().GetError(); e != nil && e.GetCode() == codes.Internal.String() {
				t.Fatalf("stream answer: %v", e)
			}
			return
		}
		if err = validateRequest(m); err != nil {
			if codeOf(err) != codes.InvalidArgument {
				t.Fatalf("validation error that is not InvalidArgument: %v", err)
			}
			return
		}
		switch r := m.(type) {
		case *verdictv1.DecideRequest:
			_, err = dec.Decide(ctx, r)
		case *verdictv1.DecideBatchRequest:
			_, err = dec.DecideBatch(ctx, r)
		case *verdictv1.ResolveRequest:
			_, err = dec.Resolve(ctx, r)
		case *verdictv1.ApplyRequest:
			r.DryRun = true // keep the backend as it is
			_, err = pol.Apply(ctx, r)
		case *verdictv1.GetRequest:
			_, err = pol.Get(ctx, r)
		case *verdictv1.ListRequest:
			_, err = pol.List(ctx, r)
		case *verdictv1.DeleteRequest:
			r.DryRun = true
			_, err = pol.Delete(ctx, r)
		case *verdictv1.StatusRequest:
			_, err = pol.Status(ctx, r)
		}
		if status.Code(err) == codes.Internal || status.Code(err) == codes.Unknown {
			t.Fatalf("%T %v: %v", m, m, err)
		}
	})
}

// validateRequest validates req as a call of its method is validated: by its
// row's validator, or for the methods whose handler validates, as the
// handler does.
func validateRequest(req proto.Message) error {
	switch r := req.(type) {
	case *verdictv1.DecideRequest:
		_, err := decideRequest(r)
		return err
	case *verdictv1.DecideCompactRequest:
		return compactRequest(r, "")
	}
	name := req.ProtoReflect().Descriptor().FullName()
	for m, row := range methodTable {
		if in, ok := requestType(m); ok && in == name {
			return row.validate(req)
		}
	}
	panic(fmt.Sprintf("no method takes a %s", name))
}
