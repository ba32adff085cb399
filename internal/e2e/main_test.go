// Package e2e runs verdict's binaries as real processes on loopback:
// verdictd on an embedded etcd, verdictctl, and the pinned grpcurl (built from
// tools/buf/go.mod). TestMain builds them once for the package.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/verdictpdp/verdict/internal/listen"
)

var (
	binDir   string // verdictd, verdictctl, grpcurl
	repoRoot string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		return 0
	}
	if flag.Lookup("test.list").Value.String() != "" {
		return m.Run() // listing the tests (make fuzz does) needs no binaries
	}
	var err error
	if repoRoot, err = filepath.Abs("../.."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "verdict-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	builds := [][]string{
		{"build", "-o", dir + "/", "./cmd/verdictd", "./cmd/verdictctl"},
		{"build", "-modfile=tools/buf/go.mod", "-o", dir + "/", "github.com/fullstorydev/grpcurl/cmd/grpcurl"},
	}
	for _, args := range builds {
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go %s: %v\n%s", strings.Join(args, " "), err, out)
			return 1
		}
	}
	return m.Run()
}

// syncBuffer collects a process's output.
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

// daemon is a running verdictd.
type daemon struct {
	addr    string
	metrics string
	cmd     *exec.Cmd
	log     *syncBuffer
	done    chan error
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ports, err := listen.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// startDaemon runs verdictd with args on free loopback ports and an embedded
// etcd in a temporary directory (unless args name endpoints), and waits until
// it accepts connections on its gRPC and metrics ports. It is stopped with
// SIGTERM at the end of the test. A port taken between freePort and verdictd's
// bind (another test's process can get it from the kernel meanwhile) makes it
// start again on new ports.
func startDaemon(t testing.TB, args ...string) *daemon {
	t.Helper()
	for attempt := 1; ; attempt++ {
		d, err := tryDaemon(t, args)
		if err == nil {
			t.Cleanup(func() { d.stop(t) })
			return d
		}
		if attempt < 3 && strings.Contains(d.log.String(), "address already in use") {
			t.Logf("verdictd: a port was taken meanwhile, again on new ports (attempt %d)", attempt+1)
			continue
		}
		_ = d.cmd.Process.Kill() // an error only says it has exited already
		t.Fatalf("%v\n%s", err, d.log.String())
	}
}

// tryDaemon starts verdictd once; on error the process has exited or is
// still running (the caller kills it).
func tryDaemon(t testing.TB, args []string) (*daemon, error) {
	t.Helper()
	d := &daemon{
		addr:    fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		log:     &syncBuffer{},
		done:    make(chan error, 1),
	}
	all := append([]string{"--listen", d.addr, "--metrics-listen", d.metrics, "--data-dir", filepath.Join(t.TempDir(), "etcd"),
		"--log-level", "debug"}, args...)
	d.cmd = exec.Command(filepath.Join(binDir, "verdictd"), all...)
	d.cmd.Dir = repoRoot
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	type endpoint struct{ network, addr string }
	grpcEnd, metricsEnd := endpoint{"tcp", d.addr}, endpoint{"tcp", d.metrics}
	for i := 0; i+1 < len(args); i++ { // a later flag wins, as flags do
		switch args[i] {
		case "--listen":
			d.addr = args[i+1]
			if path, ok := strings.CutPrefix(d.addr, "unix:"); ok {
				grpcEnd = endpoint{"unix", path}
			} else {
				grpcEnd = endpoint{"tcp", d.addr}
			}
		case "--metrics-listen":
			d.metrics = args[i+1]
			metricsEnd = endpoint{"tcp", d.metrics}
		}
	}
	waitFor := []endpoint{grpcEnd}
	if d.metrics != "" {
		waitFor = append(waitFor, metricsEnd)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(waitFor) > 0 {
		c, err := net.DialTimeout(waitFor[0].network, waitFor[0].addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			waitFor = waitFor[1:]
			continue
		}
		select {
		case err := <-d.done:
			d.done <- err
			return d, fmt.Errorf("verdictd exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("verdictd does not listen on %s", waitFor[0].addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return d, nil
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop(t testing.TB) {
	if d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			t.Errorf("verdictd did not stop cleanly: %v\n%s", err, d.log.String())
		}
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Errorf("verdictd did not stop within 20s:\n%s", d.log.String())
	}
}

// conn dials the daemon with the generated client's transport.
func (d *daemon) conn(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	c, err := grpc.NewClient(d.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitServing waits until health says SERVING.
func waitServing(t testing.TB, c *grpc.ClientConn) {
	t.Helper()
	h := healthpb.NewHealthClient(c)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not SERVING: %v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// result of a command.
type result struct {
	out  string
	code int
}

// runTool runs one of the built binaries with the environment env added.
func runTool(t testing.TB, env []string, stdin io.Reader, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, name), args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return result{out: out.String(), code: code}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
