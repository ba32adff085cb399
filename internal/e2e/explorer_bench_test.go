package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// BenchmarkExplorer measures the explorer as a person meets it, in the
// browser (performance timing): the first contentful paint of a decide URL
// over loopback, and the decide view's times against a verdictd holding
// 10,000 generated policies (policygen's sparse set) besides the shop's:
// until its answer is shown (final action, policy, both sides), and until
// both sides' candidate tables are (the explained call, which costs more).
// One iteration is one decision of a generated flow, rendered; the figures
// are reported as metrics, never asserted:
//
//	go test -run '^$' -bench 'Explorer$' -benchtime 300x ./internal/e2e/
func BenchmarkExplorer(b *testing.B) {
	set, file := tenThousand(b, "")
	d := startExplorerWith(b, file)
	br := newBrowser(b)

	// First paint: a fresh load of the URL, ten times.
	var paints []float64
	for range 10 {
		br.open(d.ui+"/?mesh=shop&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432", "decide")
		paints = append(paints, firstPaint(br))
	}
	if got := br.text("#verdict-action") + " " + br.text("#verdict-policy"); got != "ALLOW web-to-db" {
		b.Fatalf("with 10k policies the issue's URL renders %q", got)
	}

	flows := set.Flows(2, 1000)
	queries := make([]string, len(flows))
	for i, f := range flows {
		q := url.Values{"mesh": {"shop"}, "src": {"tags:" + tagsQuery(f.Source)}, "dst": {"tags:" + tagsQuery(f.Destination)}}
		if f.Port != 0 {
			q.Set("proto", "TCP")
			q.Set("port", fmt.Sprint(f.Port))
		}
		queries[i] = "?" + q.Encode()
	}
	// Each iteration: a new history entry, as a link does; the router renders it.
	step := `(() => { performance.clearMeasures(); history.pushState(null, '', %q);
		window.dispatchEvent(new PopStateEvent('popstate')); })()`
	var answers, traces []float64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		br.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(step, queries[i%len(queries)])))
		br.waitView("decide", "ready")
		answers = append(answers, eval[float64](br, `(performance.getEntriesByName('verdict:decide').pop() || {duration: -1}).duration`))
		traces = append(traces, eval[float64](br, `(performance.getEntriesByName('verdict:explain').pop() || {duration: -1}).duration`))
	}
	b.StopTimer()
	sort.Float64s(paints)
	sort.Float64s(answers)
	sort.Float64s(traces)
	b.ReportMetric(paints[len(paints)-1], "paint-max-ms")
	b.ReportMetric(pct(answers, 50), "answer-p50-ms")
	b.ReportMetric(pct(answers, 99), "answer-p99-ms")
	b.ReportMetric(pct(traces, 50), "trace-p50-ms")
	b.ReportMetric(pct(traces, 99), "trace-p99-ms")
	b.Logf("first contentful paint: %v ms (10 loads); decide view, %d flows: the answer shown in p50 %.1f ms, p99 %.1f ms, max %.1f ms; "+
		"the candidate tables in p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		paints, len(answers), pct(answers, 50), pct(answers, 99), answers[len(answers)-1],
		pct(traces, 50), pct(traces, 99), traces[len(traces)-1])
	br.noConsoleProblems(nil)
}

// tenThousand writes the shop's workloads and policies, more, and 10,000
// generated policies (policygen's sparse set, in mesh shop) to a bootstrap
// file, and returns the set and the file.
func tenThousand(tb testing.TB, more string) (*policygen.Set, string) {
	tb.Helper()
	set := policygen.Generate(policygen.Config{Seed: 1, Policies: 10_000, Mesh: "shop"})
	var doc bytes.Buffer
	doc.WriteString(shopPolicies[strings.Index(shopPolicies, "---")+4:]) // the shop's workloads and policies; the set's Mesh
	doc.WriteString(more)
	for _, r := range set.Resources {
		j, err := resource.EncodeJSON(r)
		if err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintf(&doc, "\n---\n%s\n", j)
	}
	file := filepath.Join(tb.TempDir(), "10k.yaml")
	if err := os.WriteFile(file, doc.Bytes(), 0o600); err != nil {
		tb.Fatal(err)
	}
	return set, file
}

// firstPaint is the page's first contentful paint, in ms from the start of
// its navigation (the browser records it shortly after the paint).
func firstPaint(br *browser) float64 {
	br.t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Poll[float64](`(performance.getEntriesByName('first-contentful-paint')[0] || {startTime: 0}).startTime`,
		chromedp.WithPollingInterval(10*time.Millisecond)))
	if err != nil {
		br.t.Fatalf("no first contentful paint: %v", err)
	}
	return v
}

// tagsQuery writes tags as the URL's tags form: k=v,k2=v2.
func tagsQuery(t resource.Tags) string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + t[k]
	}
	return strings.Join(parts, ",")
}

// pct is the p-th percentile of sorted values (nearest rank).
func pct(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i-1, 0)]
}

// BenchmarkExplorerViews measures, as BenchmarkExplorer does for decide, the
// time each other view takes to show its answer against a verdictd holding
// 10,000 generated policies besides the shop's (performance timing of the
// view's render, from its first call to its last row; the policies views
// also report when the list or the document is shown, before Lint's
// findings). One iteration renders the view once; the figures are reported
// as metrics, never asserted:
//
//	go test -run '^$' -bench ExplorerViews -benchtime 20x ./internal/e2e/
func BenchmarkExplorerViews(b *testing.B) {
	_, file := tenThousand(b, "")
	d := startExplorerWith(b, file, "--retention", "off")
	br := newBrowser(b)
	br.open(d.ui+"/?view=workload&mesh=shop&workload=db-1", "workload")

	for _, v := range []struct {
		name, query, view string
		measures          []string // the first is the view's answer
	}{
		{"workload", "?view=workload&mesh=shop&workload=db-1", "workload", []string{"verdict:workload"}},
		{"reach", "?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432", "reach", []string{"verdict:reach"}},
		{"policies", "?view=policies&mesh=shop", "policies", []string{"verdict:policies:list", "verdict:policies"}},
		{"policy", "?view=policies&mesh=shop&policy=TrafficPermission/web-to-db", "policies", []string{"verdict:policies:document", "verdict:policies"}},
		{"impact", "?view=impact&mesh=shop&delete=shop/policies/TrafficPermission/web-to-db", "impact", []string{"verdict:impact"}},
		{"history", "?view=history&key=shop/&prefix=1", "history", []string{"verdict:history"}},
	} {
		b.Run(v.name, func(b *testing.B) {
			step := fmt.Sprintf(`(() => { performance.clearMeasures(); history.pushState(null, '', %q);
				window.dispatchEvent(new PopStateEvent('popstate')); })()`, "/"+v.query)
			times := make([][]float64, len(v.measures))
			for b.Loop() {
				br.do(chromedp.Evaluate[chromedp.Void](step))
				br.waitView(v.view, "ready")
				for i, m := range v.measures {
					times[i] = append(times[i], eval[float64](br, fmt.Sprintf(`(performance.getEntriesByName(%q).pop() || {duration: -1}).duration`, m)))
				}
			}
			b.StopTimer()
			for i, m := range v.measures {
				sort.Float64s(times[i])
				unit := strings.TrimPrefix(m, "verdict:")
				unit = strings.ReplaceAll(unit, ":", "-")
				b.ReportMetric(pct(times[i], 50), unit+"-p50-ms")
				b.ReportMetric(pct(times[i], 99), unit+"-p99-ms")
			}
		})
	}
	br.noConsoleProblems(nil)
}
