package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/verdictpdp/verdict/internal/listen"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// replica is one verdictd process of the real binary, on fixed loopback
// ports (kept across restarts), talking to the etcd endpoints it was given.
type replica struct {
	name      string
	bin       string
	addr      string // gRPC
	metrics   string // /metrics
	endpoints []string
	logPath   string
	extra     []string // more verdictd flags, after the ones every replica gets

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan error
	clients *clients
	live    []interval // periods it served (SERVING, not killed)

	isLive atomic.Bool
	deaths atomic.Int64 // kills so far: a call sent before a kill and failed after it was cut by the kill
	starts atomic.Int64
}

// clients are the gRPC clients of one incarnation of a replica.
type clients struct {
	conn   *grpc.ClientConn
	dec    verdictv1.DecisionServiceClient
	pol    verdictv1.PolicyServiceClient
	wat    verdictv1.WatchServiceClient
	health healthpb.HealthClient
}

type interval struct{ from, to time.Time } // to zero: ongoing

func newReplica(name, bin, dir string, endpoints []string, extra []string) (*replica, error) {
	ports, err := listen.FreePorts(2)
	if err != nil {
		return nil, err
	}
	return &replica{name: name, bin: bin, endpoints: endpoints, extra: extra,
		addr:    fmt.Sprintf("127.0.0.1:%d", ports[0]),
		metrics: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		logPath: filepath.Join(dir, name+".log")}, nil
}

func dialClients(addr string, opts ...grpc.DialOption) (*clients, error) {
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		return nil, err
	}
	return &clients{conn: conn, dec: verdictv1.NewDecisionServiceClient(conn), pol: verdictv1.NewPolicyServiceClient(conn),
		wat: verdictv1.NewWatchServiceClient(conn), health: healthpb.NewHealthClient(conn)}, nil
}

// start runs the process, dials it, and waits until its health is SERVING
// (then the replica is live). The clients of the previous incarnation are
// replaced at once, so that calls sent while it starts count as sent to a
// replica that is down.
func (r *replica) start(ctx context.Context) error {
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "--- %s: start %d\n", time.Now().Format(time.RFC3339Nano), r.starts.Load()+1)
	args := append([]string{"--listen", r.addr, "--metrics-listen", r.metrics,
		"--etcd-endpoints", strings.Join(r.endpoints, ","), "--log-level", "warn", "--shutdown-timeout", "5s"}, r.extra...)
	cmd := exec.Command(r.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("%s: start %s: %w", r.name, r.bin, err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		_ = logf.Close()
	}()
	c, err := dialClients(r.addr)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = exitOf(done)
		return err
	}
	r.mu.Lock()
	old := r.clients
	r.cmd, r.done, r.clients = cmd, done, c
	r.mu.Unlock()
	r.starts.Add(1)
	if old != nil {
		old.conn.Close()
	}
	if err := waitServing(ctx, c.health, done, 60*time.Second); err != nil {
		return fmt.Errorf("%s: %w\n%s", r.name, err, r.logTail(20))
	}
	r.mu.Lock()
	r.live = append(r.live, interval{from: time.Now()})
	r.mu.Unlock()
	r.isLive.Store(true)
	return nil
}

// waitServing polls health until SERVING, the process exits, or the limit.
func waitServing(ctx context.Context, h healthpb.HealthClient, exited chan error, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		resp, err := h.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case e := <-exited:
			exited <- e
			return fmt.Errorf("verdictd exited: %w", e)
		default:
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not SERVING after %v (%v, %w)", limit, resp.GetStatus(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exitOf waits for the process behind done to exit and returns how; done
// keeps the answer for the next reader.
func exitOf(done chan error) error {
	e := <-done
	done <- e
	return e
}

// current returns the clients of the current incarnation.
func (r *replica) current() *clients {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clients
}

// markDown ends the replica's live period (before it is killed).
func (r *replica) markDown() {
	r.isLive.Store(false)
	r.deaths.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.live); n > 0 && r.live[n-1].to.IsZero() {
		r.live[n-1].to = time.Now()
	}
}

// kill9 kills the process with SIGKILL: no shutdown, no goodbye to etcd or
// to clients, as a crash.
func (r *replica) kill9() error {
	r.markDown()
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	_ = exitOf(done)
	return nil
}

// stop ends the process with SIGTERM (graceful), then SIGKILL after 15 s.
func (r *replica) stop() {
	r.markDown()
	r.mu.Lock()
	cmd, done, c := r.cmd, r.done, r.clients
	r.mu.Unlock()
	if c != nil {
		c.conn.Close()
	}
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case e := <-done:
		done <- e
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		_ = exitOf(done)
	}
}

// servedBetween is how long the replica was live (serving) within [from, to].
func (r *replica) servedBetween(from, to time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d time.Duration
	for _, iv := range r.live {
		end := iv.to
		if end.IsZero() {
			end = to
		}
		lo, hi := maxTime(iv.from, from), minTime(end, to)
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// logTail returns the last n lines of the replica's log.
func (r *replica) logTail(n int) string {
	f, err := os.Open(r.logPath)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
