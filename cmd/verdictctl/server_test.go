package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store"
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
	st   *etcd.Store
	lag  time.Duration // each watch event reaches the syncer this late
	halt func() // stops the server (not the store)
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stop()
		return nil, err
	}
	ts := &testServer{addr: lis.Addr().String(), st: st}
	if err := ts.serve(lis); err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { ts.halt() })
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { conn.Close() })
	ts.conn, ts.pol, ts.stop = conn, verdictv1.NewPolicyServiceClient(conn), stop
	return ts, ts.waitSynced()
}

// serve starts a server (with its syncer and decision log) on lis, over the
// test's store.
func (ts *testServer) serve(lis net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	var watched store.Store = ts.st
	if ts.lag > 0 {
		watched = laggingStore{Store: ts.st, lag: ts.lag}
	}
	sy, err := syncer.New(syncer.Config{Store: watched})
	if err != nil {
		cancel()
		return err
	}
	dl, err := decisionlog.New(decisionlog.Config{FlushInterval: 10 * time.Millisecond, RepeatWindow: 50 * time.Millisecond})
	if err != nil {
		cancel()
		return err
	}
	srv, err := server.New(server.Config{Syncer: sy, Store: ts.st, DecisionLog: dl, WatchConditions: true}) // as verdictd runs by default
	if err != nil {
		cancel()
		return err
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = sy.Run(ctx) }()
	go func() { defer wg.Done(); _ = dl.Run(ctx) }()
	go func() { defer wg.Done(); _ = srv.Serve(ctx, lis) }()
	ts.halt = func() { cancel(); wg.Wait() }
	return nil
}

// startLagging starts another replica on the shared server's store whose
// watch delivers each event lag late, stopped when the test ends.
func startLagging(t testing.TB, lag time.Duration) *testServer {
	t.Helper()
	ts := &testServer{st: startServer(t).st, lag: lag}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = lis.Addr().String()
	if err := ts.serve(lis); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.halt)
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ts.conn, ts.pol = conn, verdictv1.NewPolicyServiceClient(conn)
	if err := ts.waitSynced(); err != nil {
		t.Fatal(err)
	}
	return ts
}

// laggingStore delays each watch event by lag, in order.
type laggingStore struct {
	store.Store
	lag time.Duration
}

func (l laggingStore) Watch(ctx context.Context, from int64) <-chan store.Event {
	in := l.Store.Watch(ctx, from)
	out := make(chan store.Event)
	go func() {
		defer close(out)
		for ev := range in {
			select {
			case <-time.After(l.lag):
			case <-ctx.Done():
				return
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// restart stops the server and starts another on the same address and store.
func (ts *testServer) restart(t testing.TB) {
	t.Helper()
	ts.halt()
	var lis net.Listener
	var err error
	for range 100 { // the old listener's port is free once Serve has returned
		if lis, err = net.Listen("tcp", ts.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.serve(lis); err != nil {
		t.Fatal(err)
	}
	if err := ts.waitSynced(); err != nil {
		t.Fatal(err)
	}
}

// waitSynced waits for the first sync: Status answers once the snapshot is there.
func (ts *testServer) waitSynced() error {
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := ts.pol.Status(cctx, &verdictv1.StatusRequest{})
		ccancel()
		if err == nil && st.GetSynced() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not sync: %v", err)
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

// syncBuffer is a buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// running is a streaming command running until stopped.
type running struct {
	out, errOut syncBuffer
	cancel      func()
	done        chan int
}

// start runs a command (watch, logs) in the background.
func (c ctl) start(args ...string) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan int, 1)}
	e := &env{stdin: strings.NewReader(""), stdout: &r.out, stderr: &r.errOut,
		getenv: func(k string) string {
			if k == "VERDICT_SERVER" {
				return c.ts.addr
			}
			return ""
		}}
	go func() { r.done <- runEnv(ctx, args, e) }()
	return r
}

// waitFor waits until the output holds want (a hang is the test's timeout).
func (r *running) waitFor(t testing.TB, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(r.out.String()+r.errOut.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in:\n%s%s", want, r.out.String(), r.errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the command as Ctrl-C does and returns its exit code.
func (r *running) stop() int {
	r.cancel()
	return <-r.done
}
