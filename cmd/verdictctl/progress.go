package main

// Progress of long work on a terminal: one line on stderr, rewritten in
// place ("apply: call 2 of 5, 256/600 keys"), erased when the work ends or
// when something else is printed. It is shown only when a person watches:
// stdout and stderr are terminals and the output is text, not a document.
// apply counts its calls with it; lint, impact, reach and matrix, one call
// each, show the time they have waited and what has arrived (working).

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// progress is the line of one piece of work; a nil *progress shows nothing.
type progress struct {
	mu    sync.Mutex
	e     *env
	what  string
	total int
	shown int           // the length of the line on screen, 0: none
	last  time.Time     // when the line was last written
	every time.Duration // at most one rewrite per interval, but the last
}

// newProgress returns the progress of work on total items, or nil when no
// person watches.
func newProgress(e *env, out *printer, what string, total int) *progress {
	if !e.terminal || !out.forPeople() {
		return nil
	}
	return &progress{e: e, what: what, total: total, every: 100 * time.Millisecond}
}

// show rewrites the line: done of total items, and a note ("call 2 of 5").
func (p *progress) show(done int, note string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.shown > 0 && done < p.total && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	line := fmt.Sprintf("%s: %d/%d", p.what, done, p.total)
	switch {
	case p.total == 0: // work of unknown size: the note alone
		line = p.what + ": " + note
	case note != "":
		line += ", " + note
	}
	pad := ""
	if n := p.shown - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	fmt.Fprintf(p.e.stderr, "\r%s%s", line, pad)
	p.shown = len(line)
}

// clear erases the line, before other output; the next show writes it again.
func (p *progress) clear() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown > 0 {
		fmt.Fprintf(p.e.stderr, "\r%s\r", strings.Repeat(" ", p.shown))
		p.shown = 0
	}
}

// done ends the work: the line is erased.
func (p *progress) done() { p.clear() }

// working shows, until stop is called, how long one call has been waited for
// and the note of what arrived so far (set by the caller, "3,000 pairs"):
// "lint: 2.4 s". Nothing is shown for the first half second, nor when no
// person watches.
func working(e *env, out *printer, what string) (note func(string), stop func()) {
	p := newProgress(e, out, what, 0)
	if p == nil {
		return func(string) {}, func() {}
	}
	var mu sync.Mutex
	arrived := ""
	start := time.Now()
	quit, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				waited := now.Sub(start)
				if waited < 500*time.Millisecond {
					continue
				}
				mu.Lock()
				line := fmt.Sprintf("%.1f s", waited.Seconds())
				if arrived != "" {
					line += ", " + arrived
				}
				mu.Unlock()
				p.show(0, line)
			}
		}
	}()
	return func(s string) {
			mu.Lock()
			arrived = s
			mu.Unlock()
		}, func() {
			close(quit)
			<-ended
			p.done()
		}
}
