package chaos

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestProbeLinesByPhaseSent: a probe process's calls count in the phase
// they were sent in, however late their lines are read.
func TestProbeLinesByPhaseSent(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	ph := &phases{at: []time.Time{t0, t0.Add(10 * time.Second), t0.Add(20 * time.Second)}, names: []string{"probes", "silent", "log"}}
	st := &callStats{liveFailed: map[string]int64{}, failedInPhase: map[string]int64{}}
	lines := []probeLine{
		{Sent: t0.Add(time.Second).UnixNano(), Took: int64(time.Millisecond), Code: "OK", Rev: 3},
		{Sent: t0.Add(12 * time.Second).UnixNano(), Took: int64(100 * time.Millisecond), Code: "DeadlineExceeded", Message: "late"},
		{Sent: t0.Add(19 * time.Second).UnixNano(), Took: int64(100 * time.Millisecond), Code: "DeadlineExceeded"},
		{Sent: t0.Add(25 * time.Second).UnixNano(), Took: int64(100 * time.Millisecond), Code: "Unavailable"},
		{Sent: t0.Add(26 * time.Second).UnixNano(), Skipped: true},
		{Sent: t0.Add(-time.Second).UnixNano(), Code: "Internal"}, // before the first phase: the first
	}
	var in strings.Builder
	for _, l := range lines {
		if err := json.NewEncoder(&in).Encode(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := readProbeLines(strings.NewReader(in.String()), st, ph, t0); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"silent": 2, "log": 1, "probes": 1}
	for k, n := range want {
		if st.failedInPhase[k] != n {
			t.Errorf("failed in %s: %d, want %d (all: %v)", k, st.failedInPhase[k], n, st.failedInPhase)
		}
	}
	if st.sent != 5 || st.ok != 1 || st.skipped != 1 || st.liveFailed["DeadlineExceeded"] != 2 {
		t.Errorf("sent %d ok %d skipped %d failed %v: want 5, 1, 1, two past their deadline", st.sent, st.ok, st.skipped, st.liveFailed)
	}
	if st.latency.Count() != 1 {
		t.Errorf("%d latencies recorded, want the answered call's", st.latency.Count())
	}
	if err := readProbeLines(strings.NewReader("not json\n"), st, ph, t0); err == nil {
		t.Error("a line that is not JSON: no error")
	}
}
