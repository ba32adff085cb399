package server

import (
	"context"
	"crypto/subtle"
	"crypto/x509"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// needsAuthorization reports whether a method needs an authorized caller
// (docs/api.md): every PolicyService call, WatchResources and
// DecisionLogService.Follow (records name workloads and callers). Decisions
// and WatchRules are open to any client that reaches the listener.
func needsAuthorization(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+verdictv1.PolicyService_ServiceDesc.ServiceName+"/") ||
		fullMethod == verdictv1.WatchService_WatchResources_FullMethodName ||
		fullMethod == verdictv1.DecisionLogService_Follow_FullMethodName
}

// authorizer admits callers to the methods that need authorization (the
// interceptors, and WatchRules with address sets).
type authorizer struct {
	log        *slog.Logger
	token      string
	identities []string // AllowedIdentities
	devMode    bool     // neither configured: every caller is admitted
	refusals   *rateLimit
}

func newAuthorizer(cfg *Config) *authorizer {
	return &authorizer{log: cfg.Logger, token: cfg.Token, identities: cfg.AllowedIdentities, devMode: cfg.DevMode(),
		refusals: &rateLimit{interval: cfg.AuthLogInterval}}
}

// authorize admits a caller with the bearer token, or with a verified client
// certificate whose URI or DNS SAN is on the allow-list; in development mode
// (neither configured) every caller. The token is compared in constant time
// and never logged. Refusals are logged at WARN at most once per
// AuthLogInterval, with the count of the refusals not logged since (a client
// retrying a wrong token in a loop must not flood the log); each one is
// logged at debug.
func (s *authorizer) authorize(ctx context.Context) (context.Context, error) {
	if s.devMode {
		return ctx, nil
	}
	out, err := s.checkCaller(ctx)
	if err != nil {
		s.refused(ctx, err)
		return nil, err
	}
	return out, nil
}

// refused logs a refused call, rate-limited.
func (s *authorizer) refused(ctx context.Context, err error) {
	method, _ := grpc.Method(ctx)
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	if logIt, suppressed := s.refusals.note(time.Now()); logIt {
		s.log.WarnContext(ctx, "call refused", "method", method, "peer", addr, "err", err,
			"refused_not_logged", suppressed)
	}
}

// rateLimit lets one event through per interval and counts the others.
type rateLimit struct {
	interval time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// note records an event at now: through (true) when interval has passed
// since the last event let through, with the count of the events held back
// since; else held back (false).
func (r *rateLimit) note(now time.Time) (through bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.Sub(r.last) < r.interval {
		r.suppressed++
		return false, 0
	}
	r.last, suppressed, r.suppressed = now, r.suppressed, 0
	return true, suppressed
}

func (s *authorizer) checkCaller(ctx context.Context) (context.Context, error) {
	if vals := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vals) > 0 {
		scheme, token, ok := strings.Cut(vals[0], " ")
		if !ok || !strings.EqualFold(scheme, "bearer") {
			return nil, toStatus(ctx, s.log, fmt.Errorf("%w: the authorization header is not \"Bearer <token>\"", errUnauthenticated))
		}
		if s.token == "" || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.token)) != 1 {
			return nil, toStatus(ctx, s.log, fmt.Errorf("%w: the bearer token is not valid", errUnauthenticated))
		}
		return ctx, nil
	}
	cert := verifiedClientCert(ctx)
	if cert == nil {
		return nil, toStatus(ctx, s.log, fmt.Errorf("%w: this call needs a bearer token or an authorized client certificate", errUnauthenticated))
	}
	for _, id := range certIdentities(cert) {
		if slices.Contains(s.identities, id) {
			return ctx, nil
		}
	}
	return nil, toStatus(ctx, s.log, fmt.Errorf("%w: client certificate %v is not on the allow-list", errPermissionDenied, certIdentities(cert)))
}

// verifiedClientCert returns the caller's client certificate when TLS verified it.
func verifiedClientCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// certIdentities lists the URI and DNS SANs of a certificate.
func certIdentities(c *x509.Certificate) []string {
	out := make([]string, 0, len(c.URIs)+len(c.DNSNames))
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return append(out, c.DNSNames...)
}
