package server

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/verdictpdp/verdict/engine"
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
			req := decideRequest(&dr)
			if err := req.Validate(); err != nil {
				t.Fatalf("validated request %s refused by the engine: %v", data, err)
			}
			if _, err := snap.Decide(&req); err != nil && !errors.Is(err, engine.ErrMeshNotFound) {
				t.Fatalf("decide %s: %v", data, err)
			}
		}
	})
}
