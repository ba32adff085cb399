package server_test

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestEnvoyBootstrapExample: examples/envoy/bootstrap.yaml is a valid Envoy
// bootstrap by Envoy's own config protos and their validation rules
// (protoc-gen-validate), typed configs included, and it wires both ext_authz
// filters to the verdict cluster with failure_mode_allow false.
func TestEnvoyBootstrapExample(t *testing.T) {
	data, err := os.ReadFile("../examples/envoy/bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("not an Envoy bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("Envoy's validation: %v", err)
	}
	filters := map[string]proto.Message{}
	validateAnys(t, b.ProtoReflect(), filters)
	for _, name := range []string{
		"envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
		"envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
		"envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute",
	} {
		m, ok := filters[name]
		if !ok {
			t.Errorf("no %s in the example", name)
			continue
		}
		type authz interface {
			GetFailureModeAllow() bool
		}
		if a, ok := m.(authz); ok && a.GetFailureModeAllow() {
			t.Errorf("%s: failure_mode_allow is true: verdict's failures would let traffic through", name)
		}
	}
}

// validateAnys unpacks every Any under m, runs Envoy's validation on it, and
// records the messages by full name.
func validateAnys(t *testing.T, m protoreflect.Message, seen map[string]proto.Message) {
	t.Helper()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		visit := func(v protoreflect.Value) {
			if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
				return
			}
			sub := v.Message()
			if a, ok := sub.Interface().(*anypb.Any); ok {
				inner, err := a.UnmarshalNew()
				if err != nil {
					t.Errorf("%s: %v", a.GetTypeUrl(), err)
					return
				}
				if val, ok := inner.(interface{ ValidateAll() error }); ok {
					if err := val.ValidateAll(); err != nil {
						t.Errorf("%s: Envoy's validation: %v", a.GetTypeUrl(), err)
					}
				}
				seen[string(inner.ProtoReflect().Descriptor().FullName())] = inner
				validateAnys(t, inner.ProtoReflect(), seen)
				return
			}
			validateAnys(t, sub, seen)
		}
		switch {
		case fd.IsList():
			for i := range v.List().Len() {
				visit(v.List().Get(i))
			}
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					visit(mv)
					return true
				})
			}
		default:
			visit(v)
		}
		return true
	})
}
