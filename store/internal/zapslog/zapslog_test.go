package zapslog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestLevelsAndMute(t *testing.T) {
	var buf bytes.Buffer
	var mute atomic.Bool
	l := NewMuted(slog.New(slog.NewTextHandler(&buf, nil)), "etcd-server", zapcore.InfoLevel, &mute)
	l.Debug("dropped: below the minimum")
	l.Error("kept", zap.String("k", "v"))
	mute.Store(true)
	l.Error("dropped: muted")
	mute.Store(false)
	l.Warn("kept again")
	got := buf.String()
	for _, want := range []string{"msg=kept", "k=v", "component=etcd-server", `msg="kept again"`} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "dropped") {
		t.Errorf("a record that should be dropped was written:\n%s", got)
	}
	if n := strings.Count(got, "\n"); n != 2 {
		t.Errorf("%d records, want 2:\n%s", n, got)
	}
}
