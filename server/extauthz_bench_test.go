package server

import (
	"context"
	"fmt"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// emptyAuthz answers Check with a fixed response: the baseline of
// BenchmarkCheck, under the same server options.
type emptyAuthz struct {
	authv3.UnimplementedAuthorizationServer
	resp *authv3.CheckResponse
}

func (e emptyAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return e.resp, nil
}

// BenchmarkCheck compares Envoy's Check (an HTTP filter's request over mTLS,
// as envoyHTTPCheck builds it: the source by principal, the destination named
// by context_extensions) with an empty Authorization handler registered on a
// server built with the same options, over bufconn, with parallel clients.
// The target (issue 14): Check ≥ 80% of empty.
func BenchmarkCheck(b *testing.B) {
	resources := "kind: Mesh\nname: default\nunenforcedAction: DENY\n"
	for i := range 40 { // 121 resources: one transaction
		resources += fmt.Sprintf(`---
kind: Policy
name: p%[1]d
sources: [{match: {app: s%[1]d}}]
destinations: [{match: {app: d%[1]d}}]
---
kind: Workload
name: s%[1]d
tags: {app: s%[1]d, env: prod}
addresses: [10.1.0.%[1]d]
principal: spiffe://default/s%[1]d
---
kind: Workload
name: d%[1]d
tags: {app: d%[1]d, env: prod}
addresses: [10.2.0.%[1]d]
principal: spiffe://default/d%[1]d
`, i)
	}
	be := newBackend(decodeYAML(b, resources)...)
	conn := with(mtlsConn, func(c *envoyConn) {
		c.remote, c.local = "10.1.0.7:43122", "10.2.0.7:8080"
		c.peerURISANs, c.localURISANs = []string{"spiffe://default/s7"}, []string{"spiffe://default/d7"}
	})
	req := envoyHTTPCheck(conn, envoyFilter{}, httpGet(map[string]string{ExtAuthzWorkloadKey: "d7"}))
	run := func(b *testing.B, client authv3.AuthorizationClient) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if _, err := client.Check(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("Check", func(b *testing.B) {
		h := start(b, be, nil)
		resp, err := authzClient(h).Check(context.Background(), req)
		if err != nil || codes.Code(resp.GetStatus().GetCode()) != codes.OK {
			b.Fatalf("the benchmark's flow is not allowed: %v %v", resp.GetStatus(), err)
		}
		run(b, authzClient(h))
	})
	b.Run("Empty", func(b *testing.B) {
		h := start(b, be, nil)
		resp, err := authzClient(h).Check(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(h.srv.ServerOptions()...)
		authv3.RegisterAuthorizationServer(srv, emptyAuthz{resp: resp})
		run(b, authv3.NewAuthorizationClient(serveRaw(b, srv)))
	})
}
