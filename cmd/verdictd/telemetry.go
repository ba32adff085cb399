package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// telemetry holds the daemon's OpenTelemetry providers: metrics read by a
// Prometheus registry of their own (served on /metrics), and traces exported
// over OTLP when the standard OTEL_* variables ask for it.
type telemetry struct {
	meters   *metric.MeterProvider
	tracer   trace.TracerProvider
	registry *prometheus.Registry
	shutdown func(context.Context) error
}

func newTelemetry(ctx context.Context, log *slog.Logger) (*telemetry, error) {
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(serviceNameAttr()))
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	// The Go runtime and the process, as every Prometheus target exposes them:
	// go_goroutines, go_memstats_*, go_gc_heap_live_bytes (the heap marked live
	// by the last GC: what a leak grows), process_resident_memory_bytes, ...
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	t := &telemetry{registry: reg, tracer: tracenoop.NewTracerProvider()}
	t.meters = metric.NewMeterProvider(metric.WithReader(exp), metric.WithResource(res))
	t.shutdown = t.meters.Shutdown
	if tracesWanted(os.Getenv) {
		te, err := otlptracegrpc.New(ctx) // endpoint, headers, TLS: OTEL_EXPORTER_OTLP_*
		if err != nil {
			return nil, err
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(te), sdktrace.WithResource(res))
		t.tracer = tp
		t.shutdown = func(ctx context.Context) error {
			return errors.Join(t.meters.Shutdown(ctx), tp.Shutdown(ctx))
		}
		log.Info("exporting traces over OTLP")
	}
	return t, nil
}

// tracesWanted follows the OpenTelemetry conventions: OTEL_TRACES_EXPORTER
// "otlp" asks for traces, "none" refuses them; unset, an OTLP endpoint
// variable asks for them. OTEL_SDK_DISABLED=true turns everything off.
func tracesWanted(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(getenv("OTEL_TRACES_EXPORTER")) {
	case "otlp":
		return true
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	}
	return false
}

func serviceNameAttr() attribute.KeyValue { return attribute.String("service.name", serviceName()) }

func serviceName() string {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "verdictd"
}

// metricsHandler serves /metrics from the daemon's registry and, when the
// listener is on loopback (or a Unix socket), Go's profiles under
// /debug/pprof/ (net/http/pprof): a heap profile with ?gc=1 runs a GC first,
// so that it, and go_gc_heap_live_bytes after it, says what is live now
// rather than at the last GC (an idle daemon may run none for 2 minutes).
// Profiles show the daemon's internals and cost CPU: never beyond loopback.
func (t *telemetry) metricsHandler(loopback bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{}))
	if loopback {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
