package server

import (
	"context"
	"errors"
	"io"
	"maps"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Every method the real server registers — verdict.v1's, Envoy's
// Authorization, health, reflection — has a complete row, and every row
// names a registered method; every verdict.v1 service is registered.
func TestEveryMethodHasARow(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{Syncer: newBackend(), Store: newBackend()})
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	services := srv.grpc.GetServiceInfo()
	for svc, info := range services {
		for _, m := range info.Methods {
			registered["/"+svc+"/"+m.Name] = true
		}
	}
	for _, svc := range []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
		"grpc.reflection.v1alpha.ServerReflection", authv3.Authorization_ServiceDesc.ServiceName} {
		if _, ok := services[svc]; !ok {
			t.Errorf("service %s is not registered", svc)
		}
	}
	protoregistry.GlobalFiles.RangeFilesByPackage("verdict.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			if svc := f.Services().Get(i).FullName(); services[string(svc)].Methods == nil {
				t.Errorf("service %s of verdict.v1 is not registered", svc)
			}
		}
		return true
	})
	for name := range registered {
		row := methodTable[name]
		if row == nil {
			t.Errorf("%s has no row in the method table: it would be refused", name)
			continue
		}
		if row.access != anyone && row.access != authorizedOnly {
			t.Errorf("%s: the row says nobody may call it", name)
		}
		if row.validate == nil {
			t.Errorf("%s: the row names no validator", name)
		}
		if _, ok := requestType(name); !ok {
			t.Errorf("%s: its request type is not in protobuf's registry (its receive limit is the default's)", name)
		}
	}
	for name := range methodTable {
		if !registered[name] {
			t.Errorf("the row of %s names no registered method", name)
		}
	}
}

// Removing a method's row makes the method refused (UNIMPLEMENTED) before
// its handler, whatever it is.
func TestMethodWithoutRowIsRefused(t *testing.T) {
	t.Parallel()
	b := newBackend(decodeYAML(t, testPolicies)...)
	for name := range methodTable {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			table := maps.Clone(methodTable)
			delete(table, name)
			h := start(t, b, func(c *Config) { c.methods = table })
			err := callEmpty(ctxT(t), h.conn, name)
			st := wantCode(t, err, codes.Unimplemented)
			if !strings.Contains(st.Message(), "no row") {
				t.Errorf("message %q does not say the method has no row", st.Message())
			}
			// The other methods are served.
			if _, err := h.health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); name != healthpb.Health_Check_FullMethodName && err != nil {
				t.Errorf("health with another row removed: %v", err)
			}
		})
	}
}

// callEmpty calls any method with one empty message (zero bytes: the empty
// request of every type) and returns the call's error.
func callEmpty(ctx context.Context, conn *grpc.ClientConn, method string) error {
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&emptypb.Empty{}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		if err := s.RecvMsg(&emptypb.Empty{}); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
