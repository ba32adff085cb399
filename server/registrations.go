package server

// The per-caller limit on identity registrations (docs/api.md, "Identify"):
// each caller registers new tag sets from a token bucket, so that one client
// cannot cycle a mesh's part of the registry and evict the sets other
// clients' flows name. A set already registered costs nothing: sidecars that
// Identify their own sets again are never held back.

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/verdictpdp/verdict/engine/inventory"
)

// Defaults of the per-caller registration limit.
const (
	DefaultIdentifyCallerRate  = 1000   // new sets a second
	DefaultIdentifyCallerBurst = 10_000 // new sets at once
	// maxLimitedCallers: past this many callers tracked, the buckets that are
	// full again (forgetting them loses nothing) are dropped.
	maxLimitedCallers = 1 << 16
)

// registrationLimits holds one token bucket per caller.
type registrationLimits struct {
	rate  float64 // tokens a second
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	callers map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	last   time.Time
}

func newRegistrationLimits(rate float64, burst int) *registrationLimits {
	return &registrationLimits{rate: rate, burst: float64(burst), now: time.Now, callers: map[string]*tokenBucket{}}
}

// quota returns the Quota of the calling client for one Identify call.
func (l *registrationLimits) quota(ctx context.Context) *callerQuota {
	return &callerQuota{l: l, caller: callerKey(ctx)}
}

// callerQuota charges one caller's bucket (inventory.Quota).
type callerQuota struct {
	l      *registrationLimits
	caller string
}

// Take takes one token from the caller's bucket, or refuses with
// inventory.ErrRegistrationLimit.
func (q *callerQuota) Take() error {
	l := q.l
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.callers[q.caller]
	if !ok {
		if len(l.callers) >= maxLimitedCallers {
			l.sweep(now)
		}
		b = &tokenBucket{tokens: l.burst, last: now}
		l.callers[q.caller] = b
	}
	b.refill(now, l.rate, l.burst)
	if b.tokens < 1 {
		return fmt.Errorf("%w: caller %s registered over %.0f new tag sets (%.0f a second): "+
			"flows may name the sets registered already; retry later", inventory.ErrRegistrationLimit, q.caller, l.burst, l.rate)
	}
	b.tokens--
	return nil
}

func (b *tokenBucket) refill(now time.Time, rate, burst float64) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(burst, b.tokens+d.Seconds()*rate)
		b.last = now
	}
}

// sweep drops the buckets that are full again. l.mu is held.
func (l *registrationLimits) sweep(now time.Time) {
	for k, b := range l.callers {
		if b.refill(now, l.rate, l.burst); b.tokens >= l.burst {
			delete(l.callers, k)
		}
	}
}

// callerKey names the calling client: its verified client certificate's
// first URI or DNS SAN, else its peer's IP address (several connections
// from one host are one caller), else its peer address as given.
func callerKey(ctx context.Context) string {
	if c := verifiedClientCert(ctx); c != nil {
		if ids := certIdentities(c); len(ids) > 0 {
			return ids[0]
		}
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	addr := p.Addr.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}
