package server_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/syncer"
)

// A server over an in-memory store: write a policy, then decide a flow with
// read-your-writes.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	st := memory.New(memory.Config{})
	sy, _ := syncer.New(syncer.Config{Store: st})
	srv, _ := server.New(server.Config{Syncer: sy, Store: st})
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	done := make(chan struct{})
	go func() { _ = sy.Run(ctx) }()
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	defer func() { cancel(); <-done }()

	conn, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	w, err := verdictv1.NewPolicyServiceClient(conn).Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
		{Resource: &verdictv1.Resource_Policy{Policy: &verdictv1.Policy{
			Name:         "web-to-backend",
			Sources:      []*verdictv1.Selector{{Match: map[string]string{"app": "web"}}},
			Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "backend"}}},
		}}},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := verdictv1.NewDecisionServiceClient(conn).Decide(ctx, &verdictv1.DecideRequest{
		Source:      &verdictv1.Endpoint{Tags: map[string]string{"app": "web"}},
		Destination: &verdictv1.Endpoint{Tags: map[string]string{"app": "backend"}},
		MinRevision: w.GetRevision(),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.GetAction(), d.GetPolicy(), d.GetInbound().GetReason())
	// Output: ACTION_ALLOW web-to-backend REASON_MATCHED
}
