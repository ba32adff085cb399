package chaos

// The hostile run's probe Decides in a process of their own. In the chaos
// process they share the cores' scheduling with the attackers' clients, the
// embedded etcd and the decision-log tail: a probe's goroutine waiting there
// to be run looks like verdictd being late. The probe process (RunProbe; the
// chaos binary re-executes itself with a hidden subcommand) does nothing but
// send Decides and report each call as one JSON line; the run's process
// attributes each call to the scenario under way when it was sent.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ProbeConfig is what a probe process does: Decides of the chaos flows to
// Addr at Rate a second, each with Timeout, until its input ends.
type ProbeConfig struct {
	Addr    string
	Rate    float64
	Timeout time.Duration
}

// probeLine is one probe call as the probe process reports it: when it was
// sent (Unix nanoseconds, the machine's wall clock, which both processes
// read), how long it took, its code, and the revision or the error's message.
// A call not sent because too many were in flight is a line with Skipped.
type probeLine struct {
	Sent    int64  `json:"sent"`
	Took    int64  `json:"tookNs,omitempty"`
	Code    string `json:"code,omitempty"`
	Rev     int64  `json:"rev,omitempty"`
	Message string `json:"message,omitempty"`
	Skipped bool   `json:"skipped,omitempty"`
}

// RunProbe sends Decides to cfg.Addr in open loop until ctx ends, then waits
// for the calls in flight, and writes one JSON line per call to w. Lines go
// through a buffer of their own: a reader that is slow to take them never
// holds a probe back.
func RunProbe(ctx context.Context, cfg ProbeConfig, w io.Writer) error {
	if cfg.Addr == "" || cfg.Rate <= 0 || cfg.Timeout <= 0 {
		return errors.New("probe: an address, a rate and a timeout are required")
	}
	c, err := dialClients(cfg.Addr)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	lines := make(chan probeLine, 1<<16)
	written := make(chan error, 1)
	go func() {
		bw := bufio.NewWriter(w)
		enc := json.NewEncoder(bw)
		var err error
		for l := range lines {
			if err == nil {
				err = enc.Encode(l)
			}
			if len(lines) == 0 && err == nil {
				err = bw.Flush()
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		written <- err
	}()
	fl := flows()
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	var inFlight atomic.Int64
	var wg sync.WaitGroup
	next := time.Now()
	for n := 0; ; n++ {
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		next = next.Add(interval)
		if inFlight.Load() >= maxInFlight {
			lines <- probeLine{Sent: time.Now().UnixNano(), Skipped: true}
			continue
		}
		inFlight.Add(1)
		flow := fl[n%len(fl)]
		wg.Go(func() {
			defer inFlight.Add(-1)
			cctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
			sent := time.Now()
			resp, err := c.dec.Decide(cctx, flow)
			took := time.Since(sent)
			cancel()
			l := probeLine{Sent: sent.UnixNano(), Took: int64(took), Code: codes.OK.String(), Rev: resp.GetRevision()}
			if err != nil {
				code := status.Code(err)
				if errors.Is(err, context.DeadlineExceeded) {
					code = codes.DeadlineExceeded
				}
				l.Code, l.Message = code.String(), status.Convert(err).Message()
			}
			lines <- l
		})
	}
	wg.Wait()
	close(lines)
	return <-written
}

// phases is when each phase of a run began, for attributing a call to the
// phase it was sent in.
type phases struct {
	mu    sync.Mutex
	at    []time.Time
	names []string
}

func (p *phases) set(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = append(p.at, time.Now())
	p.names = append(p.names, name)
}

// current is the phase under way now.
func (p *phases) current() string { return p.of(time.Now()) }

// of is the phase under way at t: the last one begun at or before t (the
// first phase for a time before it).
func (p *phases) of(t time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.names) == 0 {
		return ""
	}
	i := sort.Search(len(p.at), func(i int) bool { return p.at[i].After(t) })
	return p.names[max(i-1, 0)]
}

// probeProcess runs the probes in a process of its own: command (the chaos
// binary and its probe subcommand) with the probe's flags. Its lines are
// recorded in st as they come, each call in the phase it was sent in.
type probeProcess struct {
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan error // the reader's end: nil, or a line it could not read
}

func startProbeProcess(command []string, cfg ProbeConfig, st *callStats, ph *phases, start time.Time) (*probeProcess, error) {
	args := append(command[1:len(command):len(command)], "--addr", cfg.Addr, "--rate", strconv.FormatFloat(cfg.Rate, 'f', -1, 64),
		"--timeout", cfg.Timeout.String())
	cmd := exec.Command(command[0], args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the probe process %s: %w", command[0], err)
	}
	p := &probeProcess{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	go func() { p.done <- readProbeLines(stdout, st, ph, start) }()
	return p, nil
}

// stop ends the probes (their process stops sending when its input ends),
// waits for the calls in flight to be reported, and for the process.
func (p *probeProcess) stop() error {
	_ = p.stdin.Close()
	rerr := <-p.done
	werr := p.cmd.Wait()
	if rerr != nil {
		return rerr
	}
	if werr != nil {
		return fmt.Errorf("the probe process: %w", werr)
	}
	return nil
}

// readProbeLines records each line of r in st, until r ends.
func readProbeLines(r io.Reader, st *callStats, ph *phases, start time.Time) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l probeLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			_, _ = io.Copy(io.Discard, r)
			return fmt.Errorf("a probe line %q: %w", sc.Text(), err)
		}
		st.record(l, ph, start)
	}
	return sc.Err()
}

// record adds one probe call to the figures; the probes' replica is live all
// along (the hostile run kills nothing).
func (st *callStats) record(l probeLine, ph *phases, start time.Time) {
	sent := time.Unix(0, l.Sent)
	st.mu.Lock()
	defer st.mu.Unlock()
	if l.Skipped {
		st.skipped++
		return
	}
	st.sent++
	if l.Code == codes.OK.String() {
		st.ok++
		st.latency.Record(time.Duration(l.Took))
		return
	}
	phase := ph.of(sent)
	st.liveFailed[l.Code]++
	st.failedInPhase[phase]++
	if len(st.failures) < 20 {
		st.failures = append(st.failures, Failure{At: sent.Sub(start), Phase: phase, Code: l.Code, Message: l.Message})
	}
}
