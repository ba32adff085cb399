package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// SoakResult is what the etcd-soak subcommand measures (issue 28 item 11):
// a verdictd on its embedded etcd taking Writes workload puts, with the
// database sampled along the way. With retention working, the database
// file stops growing once the revisions kept are reached.
type SoakResult struct {
	Writes             int64        `json:"writes,string"`
	Workloads          int          `json:"workloads"`
	Retention          string       `json:"retention"`
	RetentionRevisions int64        `json:"retentionRevisions,string"`
	Elapsed            string       `json:"elapsed"`
	Errors             int64        `json:"errors,string"`
	FirstError         string       `json:"firstError,omitempty"` // the first failed put's error
	Samples            []SoakSample `json:"samples"`
}

// SoakSample is the store after Writes puts.
type SoakSample struct {
	Writes int64 `json:"writes,string"`
	// DBFile is the size of the member's database file on disk; DBSize,
	// DBInUse, Oldest and Compactions are verdictd's verdict_etcd_* metrics.
	DBFile      int64   `json:"dbFileBytes,string"`
	DBSize      int64   `json:"dbSizeBytes,string"`
	DBInUse     int64   `json:"dbSizeInUseBytes,string"`
	Oldest      int64   `json:"oldestRevision,string"`
	Compactions int64   `json:"compactions,string"`
	RSS         float64 `json:"rssBytes"`
}

// etcdSoak is the etcd-soak subcommand: it starts verdictd on a fresh data
// directory with the given retention (verdictd's defaults unless set),
// writes --writes workload puts over --workloads names from --writers
// goroutines, each put a new value, and samples the database every
// --sample-every puts. Bounded by --timeout; the data directory goes at the
// end.
func etcdSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("etcd-soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("verdictd", defaultVerdictd(), "the verdictd binary to start")
	writes := fs.Int64("writes", 1_000_000, "workload puts (≤ 100,000,000)")
	workloads := fs.Int("workloads", 10000, "distinct workloads the puts rewrite")
	writers := fs.Int("writers", 16, "goroutines writing, each waiting for its put's acknowledgement (≤ 64)")
	every := fs.Int64("sample-every", 0, "sample the database every N puts (default writes/20)")
	retention := fs.String("retention", "", "verdictd's --retention (default verdictd's)")
	revisions := fs.Int64("retention-revisions", 0, "verdictd's --retention-revisions (default verdictd's)")
	tmp := fs.String("etcd-tmpdir", "", "directory for the etcd data (default: the system's temporary directory)")
	timeout := fs.Duration("timeout", 4*time.Hour, "bound on the whole run")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *bin == "" || *writes < 1 || *writes > 100_000_000 || *workloads < 1 || *writers < 1 || *writers > 64 || *every < 0 ||
		*revisions < 0 || *timeout <= 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "etcd-soak: --verdictd is required, --writes in [1, 1e8], --writers in [1, 64], --timeout positive, no arguments")
		return 2
	}
	if *every == 0 {
		*every = max(1, *writes/20)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var extra []string
	if *retention != "" {
		extra = append(extra, "--retention", *retention)
	}
	if *revisions > 0 {
		extra = append(extra, "--retention-revisions", strconv.FormatInt(*revisions, 10))
	}
	res, err := runSoak(ctx, *bin, *tmp, *writes, *workloads, *writers, *every, extra, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "verdict-loadtest etcd-soak:", err)
		return 3
	}
	res.Retention, res.RetentionRevisions = *retention, *revisions
	if res.Retention == "" {
		res.Retention = "verdictd's default"
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return 3
		}
		return 0
	}
	writeSoak(stdout, res)
	return 0
}

func runSoak(ctx context.Context, bin, tmp string, writes int64, workloads, writers int, every int64, extra []string,
	stderr io.Writer) (*SoakResult, error) {
	dir, err := os.MkdirTemp(tmp, "verdict-etcd-soak")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-level", "warn",
		"--data-dir", filepath.Join(dir, "etcd")}, extra...)
	p, err := startProcess(ctx, bin, "", stderr, args...)
	if err != nil {
		return nil, fmt.Errorf("start verdictd: %w", err)
	}
	defer p.stop()
	conns, err := dial(p.addr, 4)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	if err := waitServing(ctx, conns[0]); err != nil {
		return nil, err
	}
	res := &SoakResult{Writes: writes, Workloads: workloads}
	sample := func(n int64) error {
		s := SoakSample{Writes: n}
		if info, err := os.Stat(filepath.Join(dir, "etcd", "member", "snap", "db")); err == nil {
			s.DBFile = info.Size()
		}
		m, err := readMetrics(ctx, p.metrics, "verdict_etcd_db_size_bytes", "verdict_etcd_db_size_in_use_bytes",
			"verdict_etcd_oldest_revision", "verdict_etcd_compactions_total", "process_resident_memory_bytes")
		if err != nil {
			return err
		}
		s.DBSize, s.DBInUse = int64(m["verdict_etcd_db_size_bytes"]), int64(m["verdict_etcd_db_size_in_use_bytes"])
		s.Oldest, s.Compactions = int64(m["verdict_etcd_oldest_revision"]), int64(m["verdict_etcd_compactions_total"])
		s.RSS = m["process_resident_memory_bytes"]
		res.Samples = append(res.Samples, s)
		fmt.Fprintf(stderr, "etcd-soak: %d puts: db file %.1f MiB (in use %.1f MiB), oldest revision %d, %d compactions\n",
			n, float64(s.DBFile)/(1<<20), float64(s.DBInUse)/(1<<20), s.Oldest, s.Compactions)
		return nil
	}
	if err := sample(0); err != nil {
		return nil, err
	}
	var next, done, failed atomic.Int64
	var firstErr atomic.Value // string
	var mu sync.Mutex         // one sample at a time, in order
	var sampleErr error
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			client := verdictv1.NewPolicyServiceClient(conns[w%len(conns)])
			for ctx.Err() == nil {
				i := next.Add(1)
				if i > writes {
					return
				}
				wl := &resource.Workload{Mesh: "soak", Name: fmt.Sprintf("w-%06d", i%int64(workloads)),
					Tags:      map[string]string{"app": fmt.Sprintf("app-%d", i%97), "gen": strconv.FormatInt(i, 10)},
					Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i%int64(workloads)>>16&255, i%int64(workloads)>>8&255, i%int64(workloads)&255)}}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := client.Apply(cctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{apiconv.WorkloadToProto(wl)}})
				cancel()
				if err != nil && failed.Add(1) == 1 {
					firstErr.Store(err.Error())
				}
				if n := done.Add(1); n%every == 0 {
					mu.Lock()
					if err := sample(n); err != nil && sampleErr == nil {
						sampleErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(t0).Round(time.Millisecond).String()
	res.Errors = failed.Load()
	if e, ok := firstErr.Load().(string); ok {
		res.FirstError = e
	}
	if sampleErr != nil {
		return nil, sampleErr
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("after %d puts: %w", done.Load(), err)
	}
	// Two more samples a maintenance round apart: the retention that the
	// last puts call for.
	for range 2 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(12 * time.Second):
		}
		if err := sample(done.Load()); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// readMetrics reads the named unlabelled series from verdictd's Prometheus
// text at http://addr/metrics; a series not exported yet reads 0.
func readMetrics(ctx context.Context, addr string, names ...string) (map[string]float64, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, value, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i] // otel's scope labels
			if j := strings.LastIndexByte(line, ' '); j >= 0 {
				value = line[j+1:]
			}
		}
		if ok && want[name] {
			if out[name], err = strconv.ParseFloat(strings.TrimSpace(value), 64); err != nil {
				return nil, fmt.Errorf("metrics: %s: %w", name, err)
			}
		}
	}
	return out, sc.Err()
}

func writeSoak(w io.Writer, r *SoakResult) {
	fmt.Fprintf(w, "etcd soak: %d workload puts over %d workloads in %s (%d failed), retention %s, revisions %d\n",
		r.Writes, r.Workloads, r.Elapsed, r.Errors, r.Retention, r.RetentionRevisions)
	if r.FirstError != "" {
		fmt.Fprintf(w, "  the first failed put: %s\n", r.FirstError)
	}
	fmt.Fprintf(w, "  %12s %12s %12s %12s %12s %12s %10s\n", "puts", "db file MiB", "db size MiB", "in use MiB", "oldest rev", "compactions", "RSS MiB")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "  %12d %12.1f %12.1f %12.1f %12d %12d %10.1f\n", s.Writes, float64(s.DBFile)/(1<<20), float64(s.DBSize)/(1<<20),
			float64(s.DBInUse)/(1<<20), s.Oldest, s.Compactions, s.RSS/(1<<20))
	}
}
