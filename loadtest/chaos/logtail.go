package chaos

// The decision-log flood's instruments: the size of the log's files on
// disk, a reader that follows the file through its rotations, and
// verdictd's counters read from /metrics by label.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// logBytes is what the decision log's files (path, path.1, …) hold
// together; a file seen under two names while it rotates counts once.
func logBytes(path string) int64 {
	dir, base := filepath.Split(path)
	entries, _ := os.ReadDir(dir)
	var seen []os.FileInfo
	var total int64
	for _, e := range entries {
		if e.Name() != base && !strings.HasPrefix(e.Name(), base+".") {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || slices.ContainsFunc(seen, func(o os.FileInfo) bool { return os.SameFile(o, fi) }) {
			continue
		}
		seen = append(seen, fi)
		total += fi.Size()
	}
	return total
}

// diskSampler adds up the decision log's files every 10 ms until its
// context ends: the most they held, and the most of each second since the
// sampler started. Read its figures once run has returned.
type diskSampler struct {
	path     string
	most     int64
	bySecond []int64
}

func (d *diskSampler) run(ctx context.Context) {
	start := time.Now()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := logBytes(d.path)
		d.most = max(d.most, n)
		sec := int(time.Since(start) / time.Second)
		for len(d.bySecond) <= sec {
			d.bySecond = append(d.bySecond, 0)
		}
		d.bySecond[sec] = max(d.bySecond[sec], n)
	}
}

// logTail reads the decision log's file as verdictd writes it, from where
// it ended when the tail opened, following it through its rotations: a file
// renamed away is read to its end before the new one (an open file survives
// its rename and its removal). A file that came and went between two looks
// is counted as unread.
type logTail struct {
	path      string
	maxRecord int64
	f         *os.File
	part      []byte // the line read in part
	skip      bool   // part is the end of a line from before the tail opened
	buf       []byte

	mu        sync.Mutex
	lines     int64
	overlong  int64
	summaries int64
	unread    int64
	told      map[string]int64
	honest    int64 // the decisions the honest flow's records stand for
}

func openTail(path string, maxRecord int64) (*logTail, error) {
	t := &logTail{path: path, maxRecord: maxRecord, buf: make([]byte, 256<<10), told: map[string]int64{}}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	t.f = f
	if end > 0 { // in the middle of a line: skip to its end
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, end-1); err == nil && b[0] != '\n' {
			t.skip = true
		}
	}
	return t, nil
}

// follow reads until ctx ends, then once more.
func (t *logTail) follow(ctx context.Context) {
	for ctx.Err() == nil {
		if !t.poll() {
			sleepCtx(ctx, 5*time.Millisecond)
		}
	}
	t.poll()
}

// poll reads what is new; false when there was nothing.
func (t *logTail) poll() bool {
	if t.f == nil {
		f, err := os.Open(t.path)
		if err != nil {
			return false
		}
		t.f = f
	}
	progress := t.read(t.f)
	fi, err1 := t.f.Stat()
	cur, err2 := os.Stat(t.path)
	if err1 != nil || err2 != nil || os.SameFile(fi, cur) {
		return progress
	}
	// Rotated: the old file is complete; read its end, then the backups
	// newer than it (complete too), oldest first; the new file at the next
	// poll.
	t.read(t.f)
	t.endFile()
	_ = t.f.Close()
	t.f = nil
	last := fi
	k := t.backupOf(fi)
	if k == 0 {
		t.addUnread() // gone already: at least one file passed unread
	}
	for j := k - 1; j >= 1; j-- {
		f, err := os.Open(t.backup(j))
		if err != nil {
			t.addUnread()
			continue
		}
		t.read(f)
		t.endFile()
		if st, err := f.Stat(); err == nil {
			last = st
		}
		_ = f.Close()
	}
	// Rotated again meanwhile: a file may have passed between the names.
	if b1, err := os.Stat(t.backup(1)); k > 0 && (err != nil || !os.SameFile(last, b1)) {
		t.addUnread()
	}
	return true
}

func (t *logTail) backup(i int) string { return t.path + "." + strconv.Itoa(i) }

// backupOf is the number of the backup fi is now (path.N), 0 if none.
func (t *logTail) backupOf(fi os.FileInfo) int {
	for i := 1; ; i++ {
		st, err := os.Stat(t.backup(i))
		if err != nil {
			return 0
		}
		if os.SameFile(st, fi) {
			return i
		}
	}
}

func (t *logTail) addUnread() {
	t.mu.Lock()
	t.unread++
	t.mu.Unlock()
}

// endFile drops the partial line a file ended with (a file is rotated
// between lines, so there is none unless the tail opened inside one).
func (t *logTail) endFile() { t.part, t.skip = t.part[:0], false }

func (t *logTail) read(f *os.File) bool {
	progress := false
	for {
		n, err := f.Read(t.buf)
		if n > 0 {
			progress = true
			t.lines0(t.buf[:n])
		}
		if err != nil || n == 0 {
			return progress
		}
	}
}

// lines0 splits b into lines, joining the partial line kept from before.
func (t *logTail) lines0(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			t.part = append(t.part, b...)
			return
		}
		line := b[:i]
		if len(t.part) > 0 {
			line = append(t.part, line...)
			t.part = t.part[:0]
		}
		if t.skip {
			t.skip = false
		} else {
			t.line(line)
		}
		b = b[i+1:]
	}
}

var (
	droppedField = []byte(`"dropped"`)
	honestField  = []byte(`"` + honestMesh + `"`)
)

func (t *logTail) line(l []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines++
	if int64(len(l))+1 > t.maxRecord {
		t.overlong++
	}
	dropped, honest := bytes.Contains(l, droppedField), bytes.Contains(l, honestField)
	if !dropped && !honest {
		return
	}
	r := &verdictv1.DecisionRecord{}
	if protojson.Unmarshal(l, r) != nil {
		return
	}
	if r.GetMesh() == honestMesh && r.GetPort() == honestFlow.GetPort() {
		t.honest += max(r.GetRepeats(), 1)
	}
	if r.GetDropped() == nil {
		return
	}
	t.summaries++
	for _, d := range r.GetDropped() {
		t.told[d.GetMesh()] += d.GetCount()
	}
}

func (t *logTail) toldOf(mesh string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.told[mesh]
}

func (t *logTail) close() {
	if t.f != nil {
		_ = t.f.Close()
	}
}

// scrapeSeries reads verdictd's /metrics: every series whose name starts
// with prefix, by its full text (name and labels), summed when repeated.
func scrapeSeries(ctx context.Context, addr, prefix string) (map[string]int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] += int64(v)
	}
	return out, sc.Err()
}

// sumOf adds up the series of one metric, whatever their labels.
func sumOf(series map[string]int64, name string) int64 {
	var n int64
	for k, v := range series {
		if k == name || strings.HasPrefix(k, name+"{") {
			n += v
		}
	}
	return n
}

// byLabel adds up the series of one metric by the value of one label.
func byLabel(series map[string]int64, name, label string) map[string]int64 {
	re := regexp.MustCompile(`[{,]` + regexp.QuoteMeta(label) + `="([^"]*)"`)
	out := map[string]int64{}
	for k, v := range series {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		if m := re.FindStringSubmatch(k); m != nil {
			out[m[1]] += v
		}
	}
	return out
}
