package decisionlog

import (
	"bufio"
	"context"
	"io"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// JSONLines writes each record as one line of JSON — the proto3 JSON
// mapping of verdict.v1.DecisionRecord — to w, flushing after each batch.
// Opened by OpenFile, it rotates its file by size within a total.
type JSONLines struct {
	w    *bufio.Writer
	out  io.Writer // under w
	line []byte
	file *rotatingFile // nil: w is not a file of ours
	c    io.Closer     // closed with the sink; nil for stdout
}

// NewJSONLines returns a sink writing to w; c (may be nil) is closed with it.
func NewJSONLines(w io.Writer, c io.Closer) *JSONLines {
	return &JSONLines{w: bufio.NewWriterSize(w, 64<<10), out: w, c: c}
}

// OpenFile returns a sink appending to the file at path (created with mode
// 0600) that keeps each file under maxSize bytes and at most maxFiles files
// in all: when a line would take the file past maxSize, the file is renamed
// path.1 (path.1 becomes path.2, and so on; the oldest beyond maxFiles-1 is
// removed) and a new one started. A line longer than maxSize gets a file of
// its own.
func OpenFile(path string, maxSize int64, maxFiles int) (*JSONLines, error) {
	f, err := openRotating(path, maxSize, maxFiles)
	if err != nil {
		return nil, err
	}
	return &JSONLines{w: bufio.NewWriterSize(f, 64<<10), out: f, file: f, c: f}, nil
}

// Write encodes the batch (json.go) and flushes it. After an error the
// batch's unwritten records are lost and the next batch tries afresh (a
// full disk may have room again).
func (s *JSONLines) Write(_ context.Context, batch []*Record) error {
	for _, r := range batch {
		line := append(appendRecord(s.line[:0], r), '\n')
		s.line = line
		if f := s.file; f != nil && f.full(int64(s.w.Buffered()), len(line)) {
			if err := s.w.Flush(); err != nil {
				return s.fail(err)
			}
			if err := f.rotate(); err != nil {
				return s.fail(err)
			}
		}
		if _, err := s.w.Write(line); err != nil {
			return s.fail(err)
		}
	}
	if err := s.w.Flush(); err != nil {
		return s.fail(err)
	}
	return nil
}

// fail drops what is buffered and the writer's error (bufio keeps the first
// error for good), and returns err.
func (s *JSONLines) fail(err error) error {
	s.w.Reset(s.out)
	return err
}

// Close flushes and closes the underlying file.
func (s *JSONLines) Close(context.Context) error {
	err := s.w.Flush()
	if s.c != nil {
		if cerr := s.c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// OTLP exports records as OpenTelemetry log records (event name
// "verdict.decision", the record's fields as attributes) through an
// OpenTelemetry logs SDK processor — with an OTLP exporter configured by the
// standard OTEL_EXPORTER_OTLP_* variables in verdictd. Write emits the batch
// and flushes it, so export errors reach the caller.
type OTLP struct {
	provider *sdklog.LoggerProvider
	logger   otellog.Logger
}

// NewOTLP returns a sink exporting through exp, batched by the SDK.
func NewOTLP(exp sdklog.Exporter, opts ...sdklog.LoggerProviderOption) *OTLP {
	p := sdklog.NewLoggerProvider(append([]sdklog.LoggerProviderOption{
		sdklog.WithProcessor(sdklog.NewBatchProcessor(exp, sdklog.WithMaxQueueSize(20_000), sdklog.WithExportMaxBatchSize(512))),
	}, opts...)...)
	return &OTLP{provider: p, logger: p.Logger("github.com/verdictpdp/verdict/decisionlog")}
}

// Write emits every record of the batch and flushes them to the exporter.
func (s *OTLP) Write(ctx context.Context, batch []*Record) error {
	for _, r := range batch {
		var lr otellog.Record
		t := r.GetTime().AsTime()
		lr.SetTimestamp(t)
		lr.SetObservedTimestamp(t)
		if r.Dropped != nil {
			lr.SetEventName("verdict.decision_log.dropped")
			lr.SetSeverity(otellog.SeverityWarn)
			lr.SetSeverityText("WARN")
			lr.SetBody(attribute.StringValue("decision records dropped"))
			lr.AddAttributes(droppedAttrs(r.Dropped))
			s.logger.Emit(ctx, lr)
			continue
		}
		lr.SetEventName("verdict.decision")
		lr.SetSeverity(otellog.SeverityInfo)
		lr.SetSeverityText("INFO")
		if r.Action != "ALLOW" {
			lr.SetSeverity(otellog.SeverityWarn)
			lr.SetSeverityText("WARN")
		}
		lr.SetBody(attribute.StringValue(r.Action + " " + r.Mesh + "/" + r.Type + " by " + policyOrNone(r.Policy)))
		lr.AddAttributes(attributes(r)...)
		s.logger.Emit(ctx, lr)
	}
	return s.provider.ForceFlush(ctx)
}

// Close flushes and shuts the provider down.
func (s *OTLP) Close(ctx context.Context) error { return s.provider.Shutdown(ctx) }

func policyOrNone(p string) string {
	if p == "" {
		return "no policy"
	}
	return "policy " + p
}

func attributes(r *Record) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String("verdict.rpc", r.Rpc),
		attribute.Int64("verdict.revision", r.Revision),
		attribute.String("verdict.mesh", r.Mesh),
		attribute.String("verdict.type", r.Type),
		attribute.String("verdict.action", r.Action),
		attribute.String("verdict.policy", r.Policy),
		attribute.String("verdict.protocol", r.Protocol),
		attribute.Int64("verdict.port", int64(r.Port)),
		attribute.Int64("verdict.latency_ns", r.LatencyNs),
		attribute.Map("verdict.source", endpointAttrs(r.Source)...),
		attribute.Map("verdict.destination", endpointAttrs(r.Destination)...),
		attribute.Map("verdict.outbound", sideAttrs(r.Outbound)...),
		attribute.Map("verdict.inbound", sideAttrs(r.Inbound)...),
	}
	if a := r.Caller.GetAddress(); a != "" {
		kv = append(kv, attribute.String("client.address", a))
	}
	if id := r.Caller.GetIdentity(); id != "" {
		kv = append(kv, attribute.String("verdict.caller.identity", id))
	}
	if a := r.Audit; a != nil {
		kv = append(kv, attribute.Map("verdict.audit",
			attribute.String("action", a.Action), attribute.String("policy", a.Policy), attribute.String("scope", a.Scope),
			attribute.String("rule", a.Rule), attribute.String("side", a.Side)))
	}
	if r.Repeats != 0 {
		kv = append(kv, attribute.Int64("verdict.repeats", r.Repeats))
	}
	if r.Truncated {
		kv = append(kv, attribute.Bool("verdict.truncated", true))
	}
	return kv
}

func droppedAttrs(ds []*verdictv1.RecordsDropped) attribute.KeyValue {
	vs := make([]attribute.Value, len(ds))
	for i, d := range ds {
		vs[i] = attribute.MapValue(attribute.String("mesh", d.Mesh), attribute.String("reason", d.Reason),
			attribute.Int64("count", d.Count))
	}
	return attribute.Slice("verdict.dropped", vs...)
}

func endpointAttrs(e *verdictv1.RecordEndpoint) []attribute.KeyValue {
	var kv []attribute.KeyValue
	if len(e.GetTags()) > 0 {
		tags := make([]attribute.KeyValue, 0, len(e.Tags))
		for k, v := range e.Tags {
			tags = append(tags, attribute.String(k, v))
		}
		kv = append(kv, attribute.Map("tags", tags...))
	}
	if e.GetWorkload() != "" {
		kv = append(kv, attribute.String("workload", e.Workload))
	}
	if e.GetAddress() != "" {
		kv = append(kv, attribute.String("address", e.Address))
	}
	if e.GetPrincipal() != "" {
		kv = append(kv, attribute.String("principal", e.Principal))
	}
	if e.GetIdentity() != 0 {
		kv = append(kv, attribute.String("identity", strconv.FormatUint(e.Identity, 10)))
	}
	return kv
}

func sideAttrs(s *verdictv1.RecordSide) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("action", s.GetAction()), attribute.String("policy", s.GetPolicy()),
		attribute.String("scope", s.GetScope()), attribute.String("rule", s.GetRule()), attribute.String("reason", s.GetReason())}
}
