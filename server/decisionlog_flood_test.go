package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// floodSink keeps what the flood test checks of every record written: the
// summaries of drops, and the records of one mesh.
type floodSink struct {
	mesh      string
	mu        sync.Mutex
	summaries []*decisionlog.Record
	ofMesh    []*decisionlog.Record
	truncated int
}

func (s *floodSink) Write(_ context.Context, b []*decisionlog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range b {
		switch {
		case r.Dropped != nil:
			s.summaries = append(s.summaries, r)
		case r.Mesh == s.mesh:
			s.ofMesh = append(s.ofMesh, r)
		}
		if r.Truncated {
			s.truncated++
		}
	}
	return nil
}

func (s *floodSink) Close(context.Context) error { return nil }

// A client floods the decision log with DecideBatch and DecideCompact calls
// over two registered tag sets of 64 tags (63 of 1 KB) each, on 200 ports, while
// another decides a real flow in another mesh. The log's file stays within
// its cap (size × files), its records within theirs (truncated), every
// decision of the real flow is accounted for — written, counted in a
// written record's repeats, or dropped and told in a summary — and its
// last record is in the file; the drops are counted per mesh by the metric
// and the summaries.
func TestDecisionLogFlood(t *testing.T) {
	t.Parallel()
	const maxSize, maxFiles = 1 << 20, 4
	dir := t.TempDir()
	path := filepath.Join(dir, "decisions.jsonl")
	file, err := decisionlog.OpenFile(path, maxSize, maxFiles)
	if err != nil {
		t.Fatal(err)
	}
	seen := &floodSink{mesh: "prod"}
	l, err := decisionlog.New(decisionlog.Config{QueueSize: 16, FlushInterval: 10 * time.Millisecond,
		RepeatWindow: 300 * time.Millisecond, SummaryInterval: 100 * time.Millisecond, Sinks: []decisionlog.Sink{file, seen}})
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	ldone := make(chan error, 1)
	go func() { ldone <- l.Run(lctx) }()
	stopLog := sync.OnceFunc(func() {
		lcancel()
		if err := <-ldone; err != nil {
			t.Errorf("the decision log: %v", err)
		}
	})
	t.Cleanup(stopLog)
	reader := sdkmetric.NewManualReader()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), func(c *Config) {
		c.DecisionLog = l
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	ctx := ctxT(t)

	big := func(app string) *verdictv1.Endpoint {
		ep := tags("app", app)
		for i := range resource.MaxTagsPerWorkload - 1 { // app and 63 tags of 1 KB
			ep.Tags[fmt.Sprintf("k%02d", i)] = strings.Repeat(string(rune('a'+i%26)), resource.MaxTagValueLength)
		}
		return ep
	}
	ids, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{big("web"), big("db")}})
	if err != nil {
		t.Fatal(err)
	}
	web, db := ids.GetResults()[0].GetIdentity(), ids.GetResults()[1].GetIdentity()
	if web == 0 || db == 0 {
		t.Fatalf("Identify: %v", ids.GetResults())
	}
	batch := &verdictv1.DecideBatchRequest{}
	compact := &verdictv1.DecideCompactRequest{}
	for i := range MaxBatch {
		port := uint32(1 + i%200)
		batch.Requests = append(batch.Requests, &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Identity: web},
			Destination: &verdictv1.Endpoint{Identity: db}, Protocol: "TCP", Port: port})
		compact.SourceIds, compact.DestinationIds = append(compact.SourceIds, web), append(compact.DestinationIds, db)
		compact.PortProtocols = append(compact.PortProtocols, packPP(resource.UDP, port))
	}

	var flood sync.WaitGroup
	for range 2 {
		flood.Go(func() {
			for range 5 {
				if _, err := h.dec.DecideBatch(ctx, batch); err != nil {
					t.Error(err)
					return
				}
				if _, err := h.dec.DecideCompact(ctx, compact); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	flooding := make(chan struct{})
	go func() {
		flood.Wait()
		close(flooding)
	}()
	// The real flow, from a connection of its own, until the flood is over
	// and a few times after.
	real := verdictv1.NewDecisionServiceClient(h.dial())
	flow := &verdictv1.DecideRequest{Mesh: "prod", Source: tags("app", "web", "env", "prod"),
		Destination: tags("app", "api", "env", "prod"), Protocol: "TCP", Port: 443}
	decided := int64(0)
	for after := 0; after < 5; {
		select {
		case <-flooding:
			after++
		default:
		}
		if _, err := real.Decide(ctx, flow); err != nil {
			t.Fatal(err)
		}
		decided++
		time.Sleep(5 * time.Millisecond)
	}
	if t.Failed() {
		return
	}
	dropped := collectInt64Sums(t, reader, "verdict.decision_log.dropped", "mesh")
	stopLog() // the last windows and summary are written

	// The file: within its cap, every line a record within the record cap.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	var inFiles []*decisionlog.Record // the real flow's records in the files
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		total += int64(len(b))
		if len(b) > maxSize {
			t.Errorf("%s: %d bytes, over the file cap of %d", e.Name(), len(b), maxSize)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if len(line)+1 > decisionlog.DefaultMaxRecordBytes {
				t.Fatalf("%s: a line of %d bytes, over the record cap", e.Name(), len(line)+1)
			}
			r := &decisionlog.Record{}
			if err := protojson.Unmarshal([]byte(line), r); err != nil {
				t.Fatalf("%s: %v", e.Name(), err)
			}
			if r.Mesh == "prod" {
				inFiles = append(inFiles, r)
			}
		}
	}
	if len(entries) > maxFiles || total > maxSize*maxFiles {
		t.Errorf("%d files, %d bytes: over the cap of %d files of %d bytes", len(entries), total, maxFiles, maxSize)
	}

	// Every decision of the real flow is accounted for, and its last record
	// is in the files.
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if n := len(seen.ofMesh); n == 0 || !slices.ContainsFunc(inFiles, func(r *decisionlog.Record) bool {
		return proto.Equal(r, seen.ofMesh[n-1])
	}) {
		t.Errorf("the real flow's last record is not in the files (%d of its records there)", len(inFiles))
	}
	var written, told, toldProd int64
	for _, r := range seen.ofMesh {
		written += max(r.Repeats, 1)
	}
	for _, s := range seen.summaries {
		for _, d := range s.Dropped {
			told += d.Count
			if d.Mesh == "prod" {
				toldProd += d.Count
			}
		}
	}
	if written+toldProd != decided || written == 0 {
		t.Errorf("the real flow: %d decisions, %d in records and %d told dropped", decided, written, toldProd)
	}
	st := l.Stats()
	if st.Dropped == 0 || told != st.Dropped || dropped["default"] == 0 {
		t.Errorf("%d dropped, %d told in summaries, the metric says %v: every drop counted and told, the flood's first",
			st.Dropped, told, dropped)
	}
	if seen.truncated == 0 || st.Truncated == 0 || st.Repeats == 0 {
		t.Errorf("%d records truncated (stats %d), %d repeats: the flood's records are cut and its repeats counted",
			seen.truncated, st.Truncated, st.Repeats)
	}
	t.Logf("flood: %d offered, %d written, %d dropped, %d repeats, %d truncated; %d files of %d bytes in all",
		st.Offered, st.Written, st.Dropped, st.Repeats, st.Truncated, len(entries), total)
}
