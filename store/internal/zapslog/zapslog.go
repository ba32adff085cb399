// Package zapslog adapts the zap loggers that etcd's client and server require
// to verdict's *slog.Logger, keeping only the records at or above a level so that
// etcd stays quiet: its routine warnings (a peer unreachable during a test, a
// retried request) are not verdict's to report.
package zapslog

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger writing the records at or above min to l, tagged
// with component. A nil l gives a logger that discards everything.
func New(l *slog.Logger, component string, min zapcore.Level) *zap.Logger {
	return NewMuted(l, component, min, nil)
}

// NewMuted is New with a switch: while mute is true, every record is dropped.
// An embedded etcd being stopped reports its own listeners closing as errors;
// they are expected then, and only then.
func NewMuted(l *slog.Logger, component string, min zapcore.Level, mute *atomic.Bool) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return zap.New(&core{l: l.With("component", component), min: min, mute: mute})
}

type core struct {
	l      *slog.Logger
	min    zapcore.Level
	mute   *atomic.Bool
	fields []zapcore.Field
}

func (c *core) Enabled(lv zapcore.Level) bool {
	return lv >= c.min && (c.mute == nil || !c.mute.Load())
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	out := *c
	out.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	return &out
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	c.l.LogAttrs(context.Background(), level(e.Level), e.Message, attrs...)
	return nil
}

func (c *core) Sync() error { return nil }

func level(lv zapcore.Level) slog.Level {
	switch {
	case lv >= zapcore.ErrorLevel:
		return slog.LevelError
	case lv >= zapcore.WarnLevel:
		return slog.LevelWarn
	case lv >= zapcore.InfoLevel:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
