package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

// testServer is verdictd's server on a real embedded etcd, in this process,
// shared by the tests of the package (each uses meshes of its own).
type testServer struct {
	addr string
	conn *grpc.ClientConn
	pol  verdictv1.PolicyServiceClient
	stop func()
}

var (
	sharedOnce sync.Once
	shared     *testServer
	sharedErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	os.Exit(code)
}

// startServer returns the package's server, started on first use.
func startServer(t testing.TB) *testServer {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = newTestServer() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func newTestServer() (*testServer, error) {
	ctx, cancel := context.WithCancel(context.Background())
	dir, err := os.MkdirTemp("", "verdictctl-test")
	if err != nil {
		cancel()
		return nil, err
	}
	var closers []func()
	stop := func() {
		cancel()
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		os.RemoveAll(dir)
	}
	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: dir, Fast: true, NoFsync: true})
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { e.Close() })
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { st.Close() })
	sy, err := syncer.New(syncer.Config{Store: st})
	if err != nil {
		stop()
		return nil, err
	}
	srv, err := server.New(server.Config{Syncer: sy, Store: st})
	if err != nil {
		stop()
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stop()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = sy.Run(ctx) }()
	go func() { defer wg.Done(); _ = srv.Serve(ctx, lis) }()
	closers = append(closers, func() { cancel(); wg.Wait() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { conn.Close() })
	ts := &testServer{addr: lis.Addr().String(), conn: conn, pol: verdictv1.NewPolicyServiceClient(conn), stop: stop}
	// Wait for the first sync: Status answers once the snapshot is there.
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := ts.pol.Status(cctx, &verdictv1.StatusRequest{})
		ccancel()
		if err == nil && st.GetSynced() {
			return ts, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ctl runs verdictctl against the server; maxOps > 0 makes write calls that
// small. hook, when set, runs before each write call.
type ctl struct {
	ts     *testServer
	maxOps int
	hook   func(call int)
}

type ctlResult struct {
	code        int
	out, errOut string
}

func (c ctl) run(t testing.TB, stdin string, args ...string) ctlResult {
	t.Helper()
	var out, errb bytes.Buffer
	var in io.Reader = strings.NewReader(stdin)
	e := &env{stdin: in, stdout: &out, stderr: &errb, maxOps: c.maxOps, beforeCall: c.hook,
		getenv: func(k string) string {
			if k == "VERDICT_SERVER" && c.ts != nil {
				return c.ts.addr
			}
			return ""
		}}
	code := runEnv(context.Background(), args, e)
	return ctlResult{code: code, out: out.String(), errOut: errb.String()}
}

// keys lists the keys under prefix, read at or after the store's revision.
func (ts *testServer) keys(t testing.TB, prefix string) map[string]*verdictv1.StoredResource {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := ts.pol.Status(ctx, &verdictv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*verdictv1.StoredResource{}
	token := ""
	for {
		resp, err := ts.pol.List(ctx, &verdictv1.ListRequest{Prefix: prefix, PageSize: 1000, PageToken: token, MinRevision: st.GetStoreRevision()})
		if err != nil {
			t.Fatal(err)
		}
		for _, sr := range resp.GetResources() {
			out[sr.GetKey()] = sr
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out
		}
	}
}
