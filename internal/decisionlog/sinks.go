package decisionlog

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
)

// JSONLines writes each record as one line of JSON to w, flushing after each
// batch.
type JSONLines struct {
	w   *bufio.Writer
	enc *json.Encoder
	c   io.Closer // closed with the sink; nil for stdout
}

// NewJSONLines returns a sink writing to w; c (may be nil) is closed with it.
func NewJSONLines(w io.Writer, c io.Closer) *JSONLines {
	bw := bufio.NewWriterSize(w, 64<<10)
	return &JSONLines{w: bw, enc: json.NewEncoder(bw), c: c}
}

// Write encodes the batch and flushes it.
func (s *JSONLines) Write(_ context.Context, batch []*Record) error {
	for _, r := range batch {
		if err := s.enc.Encode(r); err != nil {
			return err
		}
	}
	return s.w.Flush()
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
		lr.SetEventName("verdict.decision")
		lr.SetTimestamp(r.Time)
		lr.SetObservedTimestamp(r.Time)
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
		attribute.String("verdict.rpc", r.RPC),
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
	if r.Caller.Address != "" {
		kv = append(kv, attribute.String("client.address", r.Caller.Address))
	}
	if r.Caller.Identity != "" {
		kv = append(kv, attribute.String("verdict.caller.identity", r.Caller.Identity))
	}
	if a := r.Audit; a != nil {
		kv = append(kv, attribute.Map("verdict.audit",
			attribute.String("action", a.Action), attribute.String("policy", a.Policy), attribute.String("scope", a.Scope),
			attribute.String("rule", a.Rule), attribute.String("side", a.Side)))
	}
	return kv
}

func endpointAttrs(e Endpoint) []attribute.KeyValue {
	var kv []attribute.KeyValue
	if len(e.Tags) > 0 {
		tags := make([]attribute.KeyValue, 0, len(e.Tags))
		for k, v := range e.Tags {
			tags = append(tags, attribute.String(k, v))
		}
		kv = append(kv, attribute.Map("tags", tags...))
	}
	if e.Workload != "" {
		kv = append(kv, attribute.String("workload", e.Workload))
	}
	if e.Address != "" {
		kv = append(kv, attribute.String("address", e.Address))
	}
	if e.Principal != "" {
		kv = append(kv, attribute.String("principal", e.Principal))
	}
	if e.Identity != 0 {
		kv = append(kv, attribute.String("identity", strconv.FormatUint(e.Identity, 10)))
	}
	return kv
}

func sideAttrs(s Side) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("action", s.Action), attribute.String("policy", s.Policy),
		attribute.String("scope", s.Scope), attribute.String("rule", s.Rule), attribute.String("reason", s.Reason)}
}
