package server

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// recorderPolicies: web → db is denied by deny-db, and an audit policy
// would allow it (the shadow result differs); web-1 and db-1 are workloads.
const recorderPolicies = testPolicies + `---
kind: Policy
name: audit-allow-db
mode: Audit
priority: -1
sources: [{match: {app: web}}]
destinations: [{match: {app: db}}]
action: ALLOW
---
kind: Workload
name: web-1
tags: {app: web}
addresses: [10.0.0.1]
---
kind: Workload
name: db-1
tags: {app: db}
addresses: [10.0.0.3]
`

// startRecorded serves policies with a decision log configured by cfg (its
// JSON lines in the returned buffer) and a metrics reader; stop stops the
// log (its last windows and summary written).
func startRecorded(t *testing.T, policies string, cfg decisionlog.Config) (h *harness, buf *syncBuffer, reader *sdkmetric.ManualReader, stop func()) {
	t.Helper()
	buf = &syncBuffer{}
	cfg.FlushInterval = 10 * time.Millisecond
	cfg.Sinks = append(cfg.Sinks, decisionlog.NewJSONLines(buf, nil))
	l, err := decisionlog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the decision log: %v", err)
		}
	})
	t.Cleanup(stop)
	reader = sdkmetric.NewManualReader()
	h = start(t, newBackend(decodeYAML(t, policies)...), func(c *Config) {
		c.DecisionLog = l
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	return h, buf, reader, stop
}

// Every decision path hands its answers to one recorder: the same flow,
// decided three times in one call (or three calls, or three stream
// messages), leaves the same metrics and the same records on every path —
// one record, then one with repeats: 2 when the repeat window closes (at the
// log's stop: the window is long) — the
// RPC's name, the time, the latency and the caller aside. The compact path
// names its ends by identity; so do the rows of the identity form, whose
// reference is Decide with identities. Check names its ends by address and
// labels; so do the rows of the address form.
func TestOneRecorderForEveryPath(t *testing.T) {
	t.Parallel()
	const port = 8080
	flowByAddress := &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Address: "10.0.0.1"},
		Destination: tags("app", "db"), Protocol: "TCP", Port: port}
	byIdentity := func(web, db uint64) *verdictv1.DecideRequest {
		return &verdictv1.DecideRequest{Source: &verdictv1.Endpoint{Identity: web}, Destination: &verdictv1.Endpoint{Identity: db},
			Protocol: "TCP", Port: port}
	}
	compact := func(web, db uint64, n int) *verdictv1.DecideCompactRequest {
		r := &verdictv1.DecideCompactRequest{}
		for range n {
			r.SourceIds, r.DestinationIds = append(r.SourceIds, web), append(r.DestinationIds, db)
			r.PortProtocols = append(r.PortProtocols, packPP(resource.TCP, port))
		}
		return r
	}
	type ids struct{ web, db uint64 }
	rows := []struct {
		rpc, form string
		run       func(t *testing.T, ctx context.Context, h *harness, id ids) error
	}{
		{"Decide", "identity", func(t *testing.T, ctx context.Context, h *harness, id ids) error {
			for range 3 {
				if _, err := h.dec.Decide(ctx, byIdentity(id.web, id.db)); err != nil {
					return err
				}
			}
			return nil
		}},
		{"DecideBatch", "identity", func(t *testing.T, ctx context.Context, h *harness, id ids) error {
			r := byIdentity(id.web, id.db)
			_, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{r, r, r}})
			return err
		}},
		{"DecideStream", "identity", func(t *testing.T, ctx context.Context, h *harness, id ids) error {
			st, err := h.dec.DecideStream(ctx)
			if err != nil {
				return err
			}
			for i := range 3 {
				if err := st.Send(&verdictv1.DecideStreamRequest{Id: strconv.Itoa(i), Request: byIdentity(id.web, id.db)}); err != nil {
					return err
				}
				if _, err := st.Recv(); err != nil {
					return err
				}
			}
			return st.CloseSend()
		}},
		{"DecideCompact", "identity", func(t *testing.T, ctx context.Context, h *harness, id ids) error {
			_, err := h.dec.DecideCompact(ctx, compact(id.web, id.db, 3))
			return err
		}},
		{"DecideCompactStream", "identity", func(t *testing.T, ctx context.Context, h *harness, id ids) error {
			st, err := h.dec.DecideCompactStream(ctx)
			if err != nil {
				return err
			}
			for i := range 3 {
				if err := st.Send(&verdictv1.DecideCompactStreamRequest{Id: uint64(i), Batch: compact(id.web, id.db, 1)}); err != nil {
					return err
				}
				if _, err := st.Recv(); err != nil {
					return err
				}
			}
			return st.CloseSend()
		}},
		{"Decide", "address", func(t *testing.T, ctx context.Context, h *harness, _ ids) error {
			for range 3 {
				if _, err := h.dec.Decide(ctx, flowByAddress); err != nil {
					return err
				}
			}
			return nil
		}},
		{"DecideBatch", "address", func(t *testing.T, ctx context.Context, h *harness, _ ids) error {
			_, err := h.dec.DecideBatch(ctx, &verdictv1.DecideBatchRequest{Requests: []*verdictv1.DecideRequest{flowByAddress, flowByAddress, flowByAddress}})
			return err
		}},
		{"Check", "address", func(t *testing.T, ctx context.Context, h *harness, _ ids) error {
			// plainConn: from 10.0.0.1 to port 8080; the labels name the
			// destination's tags.
			for range 3 {
				resp, err := authzClient(h).Check(ctx, envoyTCPCheck(plainConn, envoyFilter{labels: map[string]string{"app": "db"}}))
				if err != nil {
					return err
				}
				if resp.GetStatus().GetCode() == 0 {
					t.Errorf("Check allowed web → db")
				}
			}
			return nil
		}},
	}
	reference := map[string]*verdictv1.DecisionRecord{} // by form: the first row's record
	for _, row := range rows {
		t.Run(row.rpc+"/"+row.form, func(t *testing.T) {
			h, buf, reader, stopLog := startRecorded(t, recorderPolicies, decisionlog.Config{RepeatWindow: time.Hour})
			ctx := ctxT(t)
			got, err := h.dec.Identify(ctx, &verdictv1.IdentifyRequest{Endpoints: []*verdictv1.Endpoint{tags("app", "web"), tags("app", "db")}})
			if err != nil {
				t.Fatal(err)
			}
			id := ids{got.GetResults()[0].GetIdentity(), got.GetResults()[1].GetIdentity()}
			if err := row.run(t, ctx, h, id); err != nil {
				t.Fatal(err)
			}
			// The metrics: three decisions, each counted once, by action,
			// by policy and by shadow action.
			for _, m := range []struct{ name, key, value string }{
				{"verdict.decisions", "action", "DENY"},
				{"verdict.decisions.by_policy", "policy", "deny-db"},
				{"verdict.decisions.audit_differences", "action", "ALLOW"},
			} {
				counts := collectInt64Sums(t, reader, m.name, m.key)
				if counts[m.value] != 3 || len(counts) != 1 {
					t.Errorf("%s: %v, want %s=3", m.name, counts, m.value)
				}
			}
			// The records: one, then one standing for the two repeats.
			stopLog()
			if lines := buf.lines(); len(lines) != 2 {
				t.Fatalf("%d records, want 2:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			lines := buf.lines()
			first, repeats := parseRecord(t, lines[0]), parseRecord(t, lines[1])
			for _, r := range []*verdictv1.DecisionRecord{first, repeats} {
				if r.GetRpc() != row.rpc || r.GetCaller().GetAddress() == "" || r.GetTime() == nil {
					t.Errorf("record from %q by %v at %v", r.GetRpc(), r.GetCaller(), r.GetTime())
				}
				r.Rpc, r.Caller, r.Time, r.LatencyNs = "", nil, nil, 0
			}
			if first.GetRepeats() != 0 || repeats.GetRepeats() != 2 {
				t.Errorf("repeats %d then %d, want 0 then 2", first.GetRepeats(), repeats.GetRepeats())
			}
			repeats.Repeats = 0
			if !proto.Equal(first, repeats) {
				t.Errorf("the repeats record differs from the first:\n%v\n%v", first, repeats)
			}
			if first.GetAction() != "DENY" || first.GetPolicy() != "deny-db" || first.GetAudit().GetAction() != "ALLOW" ||
				first.GetSource().GetTags()["app"] != "web" || first.GetDestination().GetTags()["app"] != "db" ||
				first.GetPort() != port || first.GetProtocol() != "TCP" || first.GetRevision() == 0 {
				t.Errorf("record %v", first)
			}
			if ref, ok := reference[row.form]; !ok {
				reference[row.form] = first
			} else if !proto.Equal(ref, first) {
				t.Errorf("%s records\n%v\nwhere Decide records\n%v", row.rpc, first, ref)
			}
		})
	}
}

// A caller is its host and identity: two connections of one host share the
// repeats of their decisions, another host does not; the record names the
// connection.
func TestCallerKeyIsTheHost(t *testing.T) {
	t.Parallel()
	r := newRecorder(nil, nil, nil, nil)
	key := func(addr string) (uint64, string) {
		ap := netip.MustParseAddrPort(addr)
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)})
		var tl tally
		r.call(ctx, &tl)
		return tl.callKey, tl.caller.GetAddress()
	}
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"10.0.0.1:40000", "10.0.0.1:40001", true},
		{"10.0.0.1:40000", "10.0.0.2:40000", false},
		{"[2001:db8::1]:1", "[2001:db8::1]:2", true},
	} {
		ka, addr := key(tc.a)
		kb, _ := key(tc.b)
		if (ka == kb) != tc.same || addr != tc.a {
			t.Errorf("%s and %s: same key %v, want %v (record names %s)", tc.a, tc.b, ka == kb, tc.same, addr)
		}
	}
}
