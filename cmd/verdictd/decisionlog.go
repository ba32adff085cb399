package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/verdictpdp/verdict/internal/decisionlog"
)

// newDecisionLog builds the decision log from --decision-log (a list of
// sinks: stdout, file:PATH, otlp) and its filter, sample rate, queue, file
// rotation, record cap and repeat window; nil
// when no sink is asked for. The OTLP sink is also on when OTEL_LOGS_EXPORTER
// is "otlp"; its endpoint, headers and TLS come from the standard
// OTEL_EXPORTER_OTLP_* variables (docs/logs.md).
func newDecisionLog(ctx context.Context, c Config, getenv func(string) string, log *slog.Logger) (*decisionlog.Logger, error) {
	sinks := splitList(c.DecisionLog)
	if strings.EqualFold(getenv("OTEL_LOGS_EXPORTER"), "otlp") && !strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") &&
		!containsFold(sinks, "otlp") {
		sinks = append(sinks, "otlp")
	}
	if len(sinks) == 0 {
		return nil, nil
	}
	filter, err := decisionlog.ParseFilter(c.DecisionLogFilter)
	if err != nil {
		return nil, fmt.Errorf("--decision-log-filter: %w", err)
	}
	var out []decisionlog.Sink
	closeAll := func() {
		for _, s := range out {
			_ = s.Close(ctx) // a sink that failed to start: the others are released
		}
	}
	for _, s := range sinks {
		switch {
		case s == "stdout":
			out = append(out, decisionlog.NewJSONLines(os.Stdout, nil))
		case strings.HasPrefix(s, "file:"):
			f, err := decisionlog.OpenFile(strings.TrimPrefix(s, "file:"), c.DecisionLogMaxSize, c.DecisionLogMaxFiles)
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("--decision-log: %w", err)
			}
			out = append(out, f)
		case strings.EqualFold(s, "otlp"):
			exp, err := otlploggrpc.New(ctx) // OTEL_EXPORTER_OTLP_(LOGS_)ENDPOINT, _HEADERS, _INSECURE, ...
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("--decision-log otlp: %w", err)
			}
			res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
				resource.WithAttributes(serviceNameAttr()))
			if err != nil {
				closeAll()
				return nil, err
			}
			out = append(out, decisionlog.NewOTLP(exp, sdklog.WithResource(res)))
		default:
			closeAll()
			return nil, fmt.Errorf("--decision-log: %q: stdout, file:PATH or otlp", s)
		}
	}
	window := c.DecisionLogRepeatWindow
	if window == 0 {
		window = -1 // off
	}
	l, err := decisionlog.New(decisionlog.Config{Filter: filter, SampleRate: c.DecisionLogSample, QueueSize: c.DecisionLogQueue,
		MaxRecordBytes: int(c.DecisionLogMaxRecord), RepeatWindow: window, Sinks: out, Logger: log})
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("--decision-log: %w", err)
	}
	log.Info("decision log on", "sinks", sinks, "filter", filter.String(), "sample", c.DecisionLogSample,
		"max_size", formatSize(c.DecisionLogMaxSize), "max_files", c.DecisionLogMaxFiles,
		"max_record", formatSize(c.DecisionLogMaxRecord), "repeats_window", c.DecisionLogRepeatWindow)
	return l, nil
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}
