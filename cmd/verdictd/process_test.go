//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// daemon is a verdictd process started by a test, its stderr collected.
type daemon struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error // Wait's, once done is closed
}

func (d *daemon) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.Write(p)
}

func (d *daemon) stderr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// startDaemon runs bin with args, loopback ports picked by the system and no
// VERDICT_* variable of the test's environment.
func startDaemon(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	d := &daemon{done: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", ""}, args...)...)
	d.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	d.cmd.Stdout, d.cmd.Stderr = d, d
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill() // a test that failed midway leaves no process behind
		<-d.done
	})
	return d
}

// waitFor polls the daemon's stderr for text, or fails when it exits first
// or a generous deadline passes (a guard, not a timing assertion).
func (d *daemon) waitFor(t *testing.T, text string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(d.stderr(), text) {
		select {
		case <-d.done:
			t.Fatalf("verdictd exited (%v) before writing %q:\n%s", d.err, text, d.stderr())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("verdictd did not write %q:\n%s", text, d.stderr())
		}
	}
}

// exitCode waits for the daemon to exit (a generous deadline guards a hang)
// and returns its exit code.
func (d *daemon) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("verdictd did not exit:\n%s", d.stderr())
	}
	var ee *exec.ExitError
	if errors.As(d.err, &ee) {
		return ee.ExitCode()
	}
	if d.err != nil {
		t.Fatal(d.err)
	}
	return 0
}

// buildVerdictd builds this command into a temporary directory.
func buildVerdictd(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs verdictd")
	}
	bin := filepath.Join(t.TempDir(), "verdictd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestDataDirInUse: a second verdictd on a data directory in use says so and
// exits non-zero, instead of waiting for the database's lock for ever with no
// output, deaf to Ctrl-C and SIGTERM (issue 34 item 4); the first one goes on
// and stops on SIGTERM, and a verdictd on the freed directory stops on
// SIGINT.
func TestDataDirInUse(t *testing.T) {
	bin := buildVerdictd(t)
	dir := filepath.Join(t.TempDir(), "etcd")
	first := startDaemon(t, bin, "--data-dir", dir)
	first.waitFor(t, "serving gRPC")

	second := startDaemon(t, bin, "--data-dir", dir)
	if code := second.exitCode(t); code == 0 {
		t.Fatalf("the second verdictd exited 0:\n%s", second.stderr())
	}
	if want := "data directory " + dir + " is in use by another process"; !strings.Contains(second.stderr(), want) {
		t.Fatalf("the second verdictd's stderr does not say %q:\n%s", want, second.stderr())
	}

	for _, s := range []struct {
		sig  syscall.Signal
		name string
	}{{syscall.SIGTERM, "the first, on SIGTERM"}, {syscall.SIGINT, "one on the freed directory, on SIGINT"}} {
		d := first
		if s.sig == syscall.SIGINT {
			d = startDaemon(t, bin, "--data-dir", dir)
			d.waitFor(t, "serving gRPC")
		}
		if err := d.cmd.Process.Signal(s.sig); err != nil {
			t.Fatal(err)
		}
		if code := d.exitCode(t); code != 0 {
			t.Fatalf("%s: exit code %d, want 0 (a graceful stop):\n%s", s.name, code, d.stderr())
		}
	}
}

// TestStopOnSignal: the first signal cancels the daemon's context; a second
// one, or a stop outlasting its bound, ends the process (exit) even when the
// daemon never returns.
func TestStopOnSignal(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		bound  time.Duration
		second bool
	}{
		{"a second signal exits at once", time.Hour - stopMargin, true},
		{"a stop that outlasts its bound is ended", -stopMargin + time.Millisecond, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sig := make(chan os.Signal, 2)
			bound := make(chan time.Duration) // unbuffered: taken before the signal is sent
			ctx, cancel := context.WithCancel(context.Background())
			exited := make(chan int, 1)
			var out bytes.Buffer
			go stopOnSignal(sig, cancel, bound, &syncWriter{w: &out}, func(code int) { exited <- code })
			bound <- tc.bound
			sig <- syscall.SIGTERM
			<-ctx.Done() // the graceful stop begins
			if tc.second {
				sig <- syscall.SIGINT
			}
			select {
			case code := <-exited:
				if code != forcedExit {
					t.Fatalf("exit(%d), want %d", code, forcedExit)
				}
			case <-time.After(time.Minute):
				t.Fatal("the process was never ended")
			}
		})
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
