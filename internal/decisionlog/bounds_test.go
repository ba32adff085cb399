package decisionlog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// bigTags is n tags whose values are size bytes of fill.
func bigTags(n, size int, fill string) map[string]string {
	tags := make(map[string]string, n)
	for i := range n {
		tags[fmt.Sprintf("k%02d", i)] = strings.Repeat(fill, size/len(fill)+1)[:size]
	}
	return tags
}

// A record over its cap is cut — long endpoint strings, then tags in key
// order — to a JSON line within the cap, valid UTF-8, marked truncated; the
// tag maps it came with are left as they were (they are shared). A record
// within the cap is left alone.
func TestBoundHoldsTheCap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		max      int
		src, dst map[string]string
		princ    string
		cut      bool
	}{
		{"small", DefaultMaxRecordBytes, map[string]string{"app": "web"}, map[string]string{"app": "db"}, "", false},
		{"64 tags of 1 KB each side", DefaultMaxRecordBytes, bigTags(64, 1024, "x"), bigTags(64, 1024, "y"), "", true},
		{"one big side", DefaultMaxRecordBytes, map[string]string{"app": "web"}, bigTags(64, 1024, "y"), "", true},
		{"quotes escape", DefaultMaxRecordBytes, bigTags(20, 200, `"\`), bigTags(20, 200, `"`), "", true},
		{"runes cut whole", DefaultMaxRecordBytes, bigTags(8, 1000, "é€"), nil, "", true},
		{"a long principal", DefaultMaxRecordBytes, nil, nil, "spiffe://" + strings.Repeat("p", 10_000), true},
		{"the smallest cap", MinMaxRecordBytes, bigTags(64, 1024, "x"), bigTags(64, 1024, "y"), "", true},
		{"a large cap", 64 << 10, bigTags(64, 1024, "x"), bigTags(64, 1024, "y"), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := record(1, "DENY")
			r.Audit = &verdictv1.RecordAudit{Action: "DENY", Policy: "p", Scope: "s", Rule: "sources[0]", Side: "inbound"}
			r.Source.Tags, r.Destination.Tags, r.Destination.Principal = tc.src, tc.dst, tc.princ
			r.Destination.Identity, r.LatencyNs, r.Repeats = ^uint64(0), 1<<62, 1<<62
			srcBefore, dstBefore := maps.Clone(tc.src), maps.Clone(tc.dst)
			cut := bound(r, tc.max)
			line, err := protojson.Marshal(r)
			if err != nil {
				t.Fatalf("the cut record does not encode: %v", err)
			}
			if cut != tc.cut || r.Truncated != tc.cut {
				t.Errorf("cut %v, truncated %v, want %v", cut, r.Truncated, tc.cut)
			}
			if len(line)+1 > tc.max {
				t.Errorf("a line of %d bytes over a cap of %d", len(line)+1, tc.max)
			}
			if !maps.Equal(tc.src, srcBefore) || !maps.Equal(tc.dst, dstBefore) {
				t.Error("the shared tag maps were modified")
			}
			for _, tags := range []map[string]string{r.Source.Tags, r.Destination.Tags} {
				for k, v := range tags {
					if !utf8.ValidString(k) || !utf8.ValidString(v) || len(v) > MaxValueBytes {
						t.Errorf("tag %q: %d bytes, valid UTF-8 %v", k, len(v), utf8.ValidString(v))
					}
				}
			}
			if tc.cut && len(r.Source.Tags)+len(r.Destination.Tags) == 0 && tc.princ == "" && tc.max >= DefaultMaxRecordBytes {
				t.Error("every tag was left out: the cap leaves room for some")
			}
		})
	}
}

// readLines reads the records of a JSON-lines file.
func readLines(t *testing.T, path string) []*Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*Record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		r := &Record{}
		if err := protojson.Unmarshal(sc.Bytes(), r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	return out
}

// The file sink keeps each file under its size and at most max-files files
// (PATH, PATH.1 newest backup, ...), the newest records in PATH; backups
// beyond the cap left by an earlier run are removed when it opens.
func TestFileRotation(t *testing.T) {
	t.Parallel()
	for _, files := range []int{1, 3} {
		t.Run(fmt.Sprintf("files=%d", files), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := filepath.Join(dir, "decisions.jsonl")
			if err := os.WriteFile(path+".7", []byte("old\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			const maxSize = 4 << 10
			sink, err := OpenFile(path, maxSize, files)
			if err != nil {
				t.Fatal(err)
			}
			const n = 200 // about 60 KB of records
			for i := range n {
				if err := sink.Write(context.Background(), []*Record{record(i, "ALLOW")}); err != nil {
					t.Fatal(err)
				}
			}
			if err := sink.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != files {
				t.Errorf("%d files, want %d: %v", len(entries), files, entries)
			}
			for _, e := range entries {
				info, _ := e.Info()
				if info.Size() > maxSize {
					t.Errorf("%s: %d bytes, over %d", e.Name(), info.Size(), maxSize)
				}
			}
			cur := readLines(t, path)
			if len(cur) == 0 || cur[len(cur)-1].Revision != n-1 {
				t.Fatalf("the current file does not end with the newest record")
			}
			if files > 1 {
				prev := readLines(t, path+".1")
				if prev[len(prev)-1].Revision+1 != cur[0].Revision {
					t.Errorf("PATH.1 ends at %d, PATH starts at %d: not consecutive", prev[len(prev)-1].Revision, cur[0].Revision)
				}
			}
		})
	}
}

// The repeat table: a flow is logged, its repeats counted until the window
// closes (one record with repeats), kept while it repeats, forgotten after a
// window without any; a full table tracks no more flows.
func TestRepeatTable(t *testing.T) {
	t.Parallel()
	tab := newRepeatTable(repeatShards) // one flow per shard
	var got []*Record
	emit := func(r *Record) { got = append(got, r) }
	now := time.Unix(1_700_000_000, 0)
	steps := []struct {
		name      string
		do        func()
		wantTimes []int64 // the repeats of the records emitted by this step
	}{
		{"first decision: logged", func() {
			if tab.seen(1) {
				t.Error("a new flow counted as a repeat")
			}
			tab.keep(1, record(1, "DENY"))
		}, nil},
		{"three repeats", func() {
			for range 3 {
				if !tab.seen(1) {
					t.Error("a repeat not counted")
				}
			}
		}, nil},
		{"window closes: one record of 3", func() { tab.sweep(now, emit) }, []int64{3}},
		{"a repeat in the next window", func() { tab.seen(1) }, nil},
		{"window closes: one record of 1", func() { tab.sweep(now, emit) }, []int64{1}},
		{"a quiet window keeps it", func() { tab.sweep(now, emit) }, nil},
		{"a second quiet window forgets it", func() { tab.sweep(now, emit) }, nil},
		{"logged again", func() {
			if tab.seen(1) {
				t.Error("a forgotten flow counted as a repeat")
			}
		}, nil},
	}
	for _, st := range steps {
		got = nil
		st.do()
		var reps []int64
		for _, r := range got {
			reps = append(reps, r.Repeats)
			if r.Mesh != "default" || r.Repeats == 0 || !r.Time.AsTime().Equal(now) {
				t.Errorf("%s: record %v", st.name, r)
			}
		}
		if fmt.Sprint(reps) != fmt.Sprint(st.wantTimes) {
			t.Errorf("%s: records with repeats %v, want %v", st.name, reps, st.wantTimes)
		}
	}
	if n := tab.counted.Load(); n != 4 {
		t.Errorf("%d repeats counted, want 4", n)
	}
	// Shard 0 holds flow 64 (key 64 lands in shard 0, as 1 did in shard 1);
	// another key of shard 0 finds it full: never a repeat.
	if tab.seen(64) || tab.seen(128) || tab.seen(128) {
		t.Error("a flow beyond the table's room counted as a repeat")
	}
}

// Repeats through the logger: one record per flow, then one with the count
// when the window closes (here at the stop); Stats counts them.
func TestLoggerRepeats(t *testing.T) {
	t.Parallel()
	sink := &blockingSink{release: make(chan struct{})}
	close(sink.release)
	var recs []*Record
	sinkRecs := &recordingSink{got: &recs}
	l, err := New(Config{RepeatWindow: time.Hour, Sinks: []Sink{sink, sinkRecs}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, l)
	for i := range 100 {
		key := uint64(1 + i%2) // two flows
		if l.Repeat(key) {
			continue
		}
		l.Log(key, record(int(key), "DENY"))
	}
	stop()
	st := l.Stats()
	if st.Offered != 2 || st.Written != 2 || st.Repeats != 98 {
		t.Errorf("stats %+v: 2 records and 98 repeats", st)
	}
	var total int64
	for _, r := range recs {
		total += max(r.Repeats, 1)
	}
	if len(recs) != 4 || total != 100 {
		t.Errorf("%d records standing for %d decisions, want 4 for 100", len(recs), total)
	}
}

type recordingSink struct{ got *[]*Record }

func (s *recordingSink) Write(_ context.Context, b []*Record) error {
	*s.got = append(*s.got, b...)
	return nil
}
func (s *recordingSink) Close(context.Context) error { return nil }

// Drops are counted per mesh, the first MaxDropMeshes by name and the rest
// as other; a summary record tells each interval's drops, sorted, and none
// when there were none.
func TestDropsPerMeshBounded(t *testing.T) {
	t.Parallel()
	var d dropCounts
	d.init()
	for i := range MaxDropMeshes + 10 {
		d.add(fmt.Sprintf("m%03d", i), ReasonQueueFull)
		d.add(fmt.Sprintf("m%03d", i), ReasonQueueFull)
	}
	meshes := map[string]int64{}
	d.each(func(mesh, reason string, n int64) { meshes[mesh] += n })
	if len(meshes) != MaxDropMeshes+1 || meshes[OtherMesh] != 20 || meshes["m000"] != 2 || d.total() != 2*(MaxDropMeshes+10) {
		t.Errorf("%d meshes, other %d, m000 %d, total %d", len(meshes), meshes[OtherMesh], meshes["m000"], d.total())
	}
	reported := map[dropKey]int64{}
	now := time.Unix(1_700_000_000, 0)
	s := d.summary(now, reported)
	if len(s.GetDropped()) != MaxDropMeshes+1 || s.Dropped[0].Mesh != "m000" || s.Dropped[0].Count != 2 || s.Rpc != "" {
		t.Fatalf("summary %v", s)
	}
	if again := d.summary(now, reported); again != nil {
		t.Errorf("a summary without new drops: %v", again)
	}
	d.add("m001", ReasonQueueFull)
	if s := d.summary(now, reported); len(s.GetDropped()) != 1 || s.Dropped[0].Count != 1 {
		t.Errorf("the second summary: %v", s)
	}
}

// flakyWriter fails its first write.
type flakyWriter struct {
	failed bool
	buf    strings.Builder
}

func (w *flakyWriter) Write(p []byte) (int, error) {
	if !w.failed {
		w.failed = true
		return 0, errors.New("no space left on device")
	}
	return w.buf.Write(p)
}

// A sink whose writer failed once writes the next batch: the failure loses
// its own batch only.
func TestJSONLinesRecoversFromAFailedWrite(t *testing.T) {
	t.Parallel()
	w := &flakyWriter{}
	s := NewJSONLines(w, nil)
	if err := s.Write(context.Background(), []*Record{record(1, "DENY")}); err == nil {
		t.Fatal("the failed write was not reported")
	}
	if err := s.Write(context.Background(), []*Record{record(2, "DENY")}); err != nil {
		t.Fatalf("the next batch: %v", err)
	}
	if n := strings.Count(w.buf.String(), "\n"); n != 1 || !strings.Contains(w.buf.String(), `"revision":"2"`) {
		t.Errorf("written: %q", w.buf.String())
	}
}

// TestJSONLenMatchesByteByByte: the eight-bytes-at-a-time length equals the
// byte-by-byte one for every byte value at every position of strings of 0
// to 20 bytes, and for the escaped bytes among others.
func TestJSONLenMatchesByteByByte(t *testing.T) {
	t.Parallel()
	for n := range 21 {
		for pos := range n {
			for c := range 256 {
				b := []byte(strings.Repeat("a", n))
				b[pos] = byte(c)
				if got, want := jsonLen(string(b)), jsonLenSlow(string(b)); got != want {
					t.Fatalf("jsonLen(%q) = %d, want %d", b, got, want)
				}
			}
		}
	}
	for _, s := range []string{"", "plain", strings.Repeat("é", 9), "tab\there", `quote"d`, `back\slash`, strings.Repeat("z", 1024) + "\x1f",
		strings.Repeat("\x7f\x80\xff ", 5), "!#$%&'()*+,-./[]^_`{|}~"} {
		if got, want := jsonLen(s), jsonLenSlow(s); got != want {
			t.Errorf("jsonLen(%q) = %d, want %d", s, got, want)
		}
	}
}

// boundByteByByte is bound as it was before it measured tags by their
// lengths first: every side's tags measured exactly, always.
func boundByteByByte(r *Record, max int) bool {
	if r.Dropped != nil || recordOverhead+6*rawLen(r) <= max {
		return false
	}
	fixed := recordOverhead + otherLen(r)
	src, dst := r.Source, r.Destination
	cut := false
	for _, ep := range []*verdictv1.RecordEndpoint{src, dst} {
		if ep == nil {
			continue
		}
		for _, s := range []*string{&ep.Workload, &ep.Address, &ep.Principal} {
			if len(*s) > MaxValueBytes {
				*s, cut = shorten(*s), true
			}
			fixed += jsonLen(*s)
		}
	}
	ts, td := tagsLen(src.GetTags()), tagsLen(dst.GetTags())
	budget := max - fixed
	if ts+td <= budget {
		r.Truncated = r.Truncated || cut
		return cut
	}
	bs, bd := budget/2, budget-budget/2
	switch {
	case ts < bs:
		bd = budget - ts
	case td < bd:
		bs = budget - td
	}
	if ts > bs {
		src.Tags = cutTags(src.Tags, bs)
	}
	if td > bd {
		dst.Tags = cutTags(dst.Tags, bd)
	}
	r.Truncated = true
	return true
}

// TestBoundMeasuresOnlyWhatItNeeds: bound, which measures a side's tags
// exactly only where their lengths do not decide, cuts every record as
// measuring every tag exactly does — sides of every size around the cap and
// its halves, with and without escapes.
func TestBoundMeasuresOnlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	fills := []string{"x", `"`, `\`, "é", "a\"b"}
	// A side of n tags whose lengths alone come to about want bytes of
	// JSON: near a half of the cap, where escapes decide.
	side := func(want int) map[string]string {
		n := 1 + rnd.IntN(64)
		switch rnd.IntN(4) {
		case 0:
			return nil
		case 1:
			return bigTags(n, 1+rnd.IntN(1100), fills[rnd.IntN(len(fills))])
		}
		size := want/n - 9 + rnd.IntN(21) - 10
		return bigTags(n, min(1100, 1+max(0, size)), fills[rnd.IntN(len(fills))])
	}
	for i := range 5000 {
		max := []int{MinMaxRecordBytes, DefaultMaxRecordBytes, 8 << 10, 64 << 10}[rnd.IntN(4)]
		src, dst := side(max/2-rnd.IntN(max/4)), side(max/2-rnd.IntN(max/4))
		a, b := record(1, "DENY"), record(1, "DENY")
		a.Source.Tags, a.Destination.Tags = src, dst
		b.Source.Tags, b.Destination.Tags = src, dst
		gotCut, wantCut := bound(a, max), boundByteByByte(b, max)
		if gotCut != wantCut || a.Truncated != b.Truncated || !maps.Equal(a.Source.Tags, b.Source.Tags) ||
			!maps.Equal(a.Destination.Tags, b.Destination.Tags) {
			t.Fatalf("record %d (cap %d, %d and %d tags): cut %v %v, tags %d/%d, want cut %v %v, tags %d/%d", i, max,
				len(src), len(dst), gotCut, a.Truncated, len(a.Source.Tags), len(a.Destination.Tags),
				wantCut, b.Truncated, len(b.Source.Tags), len(b.Destination.Tags))
		}
	}
}
