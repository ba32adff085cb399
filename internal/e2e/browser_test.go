package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// The explorer's tests drive Debian's chromium-headless-shell with chromedp:
// present, they run; absent, they are skipped, unless VERDICT_REQUIRE_BROWSER=1
// (CI), which makes its absence a failure. Screenshots go to
// $VERDICT_SCREENSHOTS (relative to the repository root), else to a temporary
// directory.

// browserPath finds the browser or skips the test.
func browserPath(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("chromium-headless-shell")
	if err == nil {
		return p
	}
	if os.Getenv("VERDICT_REQUIRE_BROWSER") == "1" {
		t.Fatalf("VERDICT_REQUIRE_BROWSER=1 and chromium-headless-shell is not on PATH (apt-get install chromium-headless-shell): %v", err)
	}
	t.Skipf("chromium-headless-shell is not installed: the browser tests are skipped (VERDICT_REQUIRE_BROWSER=1 makes this a failure)")
	return ""
}

// browser is one headless Chromium with one tab, and the console messages
// its pages wrote.
type browser struct {
	t   testing.TB
	ctx context.Context // the tab's; ends with the test
	dir string          // screenshots

	mu       sync.Mutex
	console  []chromedp.ConsoleMessage
	requests map[network.RequestID]string // URLs of the requests, for their failures
}

// newBrowser starts a browser for the test; it is closed at the end of the
// test. Its console (calls of the console API, uncaught exceptions, browser
// log entries such as CSP violations and failed loads) and its failed
// requests are recorded from the start.
func newBrowser(t testing.TB) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browserPath(t)),
		chromedp.NoSandbox, chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser, with no deadline
		t.Fatalf("start chromium-headless-shell: %v", err)
	}
	b := &browser{t: t, ctx: ctx, dir: screenshotDir(t), requests: map[network.RequestID]string{}}
	if err := chromedp.Listen(ctx, b.recordFailure); err != nil {
		t.Fatalf("listen to the browser's network: %v", err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	return b
}

// recordFailure records a failed request as a console error of the
// network, as the browser's log words one ("the server responded with a
// status of 404"): a response of status 400 or more, or a load that failed
// (refused, reset, blocked), which the log may not show. A load the browser
// cancels (the page went elsewhere) is no failure.
func (b *browser) recordFailure(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.requests[ev.RequestID] = ev.Request.URL
	case *network.EventResponseReceived:
		if ev.Response != nil && ev.Response.Status >= 400 {
			b.console = append(b.console, chromedp.ConsoleMessage{Type: chromedp.ConsoleError, Source: "network", URL: ev.Response.URL,
				Text: fmt.Sprintf("failed request: the server responded with a status of %d", ev.Response.Status)})
		}
	case *network.EventLoadingFailed:
		if !ev.Canceled {
			b.console = append(b.console, chromedp.ConsoleMessage{Type: chromedp.ConsoleError, Source: "network", URL: b.requests[ev.RequestID],
				Text: fmt.Sprintf("failed request: %s %s", ev.ErrorText, ev.BlockedReason)})
		}
	}
}

// do runs actions with a deadline of their own (the browser's context has
// none).
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression and decodes its value.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// open loads a URL and waits for the view to be rendered.
func (b *browser) open(url, view string) {
	b.t.Helper()
	b.do(chromedp.Navigate(url))
	b.waitView(view, "ready")
}

// waitView waits until the page's <main> shows view in state (ready,
// token, error), as the router marks it.
func (b *browser) waitView(view, state string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	expr := fmt.Sprintf(`(() => { const m = document.getElementById('main'); return !!m && m.dataset.view === %q && m.dataset.state === %q; })()`,
		view, state)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		got := eval[string](b, `(() => { const m = document.getElementById('main'); return m ? m.dataset.view + '/' + m.dataset.state + ': ' + m.innerText.slice(0, 400) : 'no main'; })()`)
		b.t.Fatalf("the page did not show view %s in state %s: %v\n%s", view, state, err, got)
	}
}

// waitFor waits until a JavaScript expression is true.
func (b *browser) waitFor(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		b.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// text is the text of the first element matching a CSS selector ("" when none).
func (b *browser) text(css string) string {
	b.t.Helper()
	return eval[string](b, fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.innerText.trim() : ''; })()`, css))
}

// screenshot writes the page as NAME.png to the screenshot directory.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(b.dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", path)
}

// consoleProblems are the console messages of type error or warning and
// the uncaught exceptions, except those expected says are expected.
func (b *browser) consoleProblems(expected func(chromedp.ConsoleMessage) bool) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.console {
		switch m.Type {
		case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
			if expected == nil || !expected(m) {
				out = append(out, fmt.Sprintf("%s (%s:%d)", m.String(), m.URL, m.Line))
			}
		}
	}
	return out
}

// noConsoleProblems fails the test on any console error or warning, once the
// test's steps are done.
func (b *browser) noConsoleProblems(expected func(chromedp.ConsoleMessage) bool) {
	b.t.Helper()
	if p := b.consoleProblems(expected); len(p) > 0 {
		b.t.Errorf("the page wrote to the console:\n  %s", strings.Join(p, "\n  "))
	}
}

var (
	shotsOnce sync.Once
	shotsDir  string
)

// screenshotDir is $VERDICT_SCREENSHOTS (relative to the repository root),
// else a temporary directory of the test.
func screenshotDir(t testing.TB) string {
	d := os.Getenv("VERDICT_SCREENSHOTS")
	if d == "" {
		return t.TempDir()
	}
	shotsOnce.Do(func() {
		if !filepath.IsAbs(d) {
			d = filepath.Join(repoRoot, d)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		shotsDir = d
	})
	return shotsDir
}

// waitHTTP waits until url answers GET (any status).
func waitHTTP(t testing.TB, url string) {
	t.Helper()
	waitHTTPWith(t, http.DefaultClient, url)
}

func waitHTTPWith(t testing.TB, c *http.Client, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
