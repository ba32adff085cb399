package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// rotateLike rotates path as the decision log's file sink does: the oldest
// backup removed, the others shifted, path becomes path.1, a new path.
func rotateLike(t *testing.T, path string, maxFiles int) {
	t.Helper()
	_ = os.Remove(path + "." + strconv.Itoa(maxFiles-1))
	for i := maxFiles - 2; i >= 1; i-- {
		_ = os.Rename(path+"."+strconv.Itoa(i), path+"."+strconv.Itoa(i+1))
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, "")
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func summary(mesh string, n int) string {
	return fmt.Sprintf(`{"time":"2026-11-24T03:30:10Z","dropped":[{"mesh":%q,"reason":"queue_full","count":"%d"}]}`+"\n", mesh, n)
}

// TestLogTail: the reader of the decision log starts at the end of the
// file (inside a line too), joins lines written in parts, reads the backups
// two rotations left between its looks, and counts a file gone before it
// looked as unread — every summary it read told once.
func TestLogTail(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "decisions.log")
	appendTo(t, path, summary("honest", 100)+`{"mesh":"hon`)
	tail, err := openTail(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer tail.close()
	appendTo(t, path, `est"}`+"\n"+summary("honest", 1))
	tail.poll()
	half := summary("honest", 2)
	appendTo(t, path, half[:20])
	tail.poll()
	appendTo(t, path, half[20:]+`{"mesh":"a"}`+"\n")
	tail.poll()

	appendTo(t, path, summary("honest", 4)) // the end of a file rotated away
	rotateLike(t, path, 3)
	appendTo(t, path, summary("honest", 8)) // a file that passes between two looks
	rotateLike(t, path, 3)
	appendTo(t, path, summary("honest", 16)+summary("other", 1))
	for tail.poll() {
	}
	if got := tail.toldOf("honest"); got != 31 || tail.unread != 0 {
		t.Fatalf("told %d, %d unread; want 31, 0", got, tail.unread)
	}

	appendTo(t, path, summary("honest", 32))
	for range 3 { // the file the reader has open is removed
		rotateLike(t, path, 3)
	}
	for tail.poll() {
	}
	if got := tail.toldOf("honest"); got != 63 || tail.unread == 0 {
		t.Fatalf("told %d, %d unread; want 63 and some unread", got, tail.unread)
	}
	appendTo(t, path, `{"mesh":"honest","port":443,"repeats":"5"}`+"\n"+`{"mesh":"honest","port":443}`+"\n"+`{"mesh":"honest","port":444}`+"\n")
	tail.poll()
	if tail.honest != 6 {
		t.Errorf("the honest flow: %d decisions read, want 6", tail.honest)
	}
	if tail.lines != 11 || tail.summaries != 7 || tail.overlong != 0 {
		t.Errorf("%d lines, %d summaries, %d overlong; want 11, 7, 0", tail.lines, tail.summaries, tail.overlong)
	}
}

func TestScrapeSeries(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE verdict_decision_log_dropped_total counter\n"+
			`verdict_decision_log_dropped_total{mesh="honest",otel_scope_name="verdict",reason="queue_full"} 3`+"\n"+
			`verdict_decision_log_dropped_total{mesh="flood",otel_scope_name="verdict",reason="queue_full"} 1.5e+06`+"\n"+
			"verdict_decision_log_written_total 42\nverdict_decision_log_written_totalx 1\ngo_goroutines 7\n")
	}))
	defer srv.Close()
	m, err := scrapeSeries(context.Background(), srv.Listener.Addr().String(), "verdict_decision_log_")
	if err != nil {
		t.Fatal(err)
	}
	if n := sumOf(m, "verdict_decision_log_written_total"); n != 42 {
		t.Errorf("written %d, want 42", n)
	}
	by := byLabel(m, "verdict_decision_log_dropped_total", "mesh")
	if by["honest"] != 3 || by["flood"] != 1_500_000 || len(by) != 2 {
		t.Errorf("dropped by mesh %v", by)
	}
}
