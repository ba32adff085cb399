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
)

// authorizer tells authorized callers from the others: the method table
// (methods.go) says what each method, and each part of a request, needs.
type authorizer struct {
	log        *slog.Logger
	token      string
	identities []string // AllowedIdentities
	devMode    bool     // neither configured: every caller is authorized
	refusals   *rateLimit
}

func newAuthorizer(cfg *Config) *authorizer {
	return &authorizer{log: cfg.Logger, token: cfg.Token, identities: cfg.AllowedIdentities, devMode: cfg.DevMode(),
		refusals: &rateLimit{interval: cfg.AuthLogInterval}}
}

// standing tells whether the caller is authorized: it sent the bearer token,
// or a verified client certificate whose URI or DNS SAN is on the allow-list;
// in development mode (neither configured) every caller is. err says why a
// caller is not (Unauthenticated or PermissionDenied). A token, when sent,
// decides: a wrong one is not made good by a certificate on the list. More
// than one authorization header is errAmbiguousAuthorization, which refuses
// the call whatever its method: no header decides. The token is compared in
// constant time and never logged.
func (s *authorizer) standing(ctx context.Context) (authorized bool, err error) {
	if s.devMode {
		return true, nil
	}
	switch vals := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vals) {
	case 0:
	case 1:
		scheme, token, ok := strings.Cut(vals[0], " ")
		if !ok || !strings.EqualFold(scheme, "bearer") {
			return false, fmt.Errorf("%w: the authorization header is not \"Bearer <token>\"", errUnauthenticated)
		}
		if s.token == "" || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.token)) != 1 {
			return false, fmt.Errorf("%w: the bearer token is not valid", errUnauthenticated)
		}
		return true, nil
	default:
		return false, fmt.Errorf("%w: %d sent, send exactly one", errAmbiguousAuthorization, len(vals))
	}
	cert := verifiedClientCert(ctx)
	if cert == nil {
		return false, errNoCredentials
	}
	for _, id := range certIdentities(cert) {
		if slices.Contains(s.identities, id) {
			return true, nil
		}
	}
	return false, notOnList{cert}
}

// errNoCredentials: neither a token nor a client certificate. The common
// case of a sidecar's call, so it is one value, not built per call.
var errNoCredentials = fmt.Errorf("%w: no credentials", errUnauthenticated)

// notOnList is errPermissionDenied for a client certificate whose identities
// are not on the allow-list; its text is built only when read (a sidecar
// with a certificate of the mesh calls open methods with it at every call).
type notOnList struct{ cert *x509.Certificate }

func (e notOnList) Error() string {
	return fmt.Sprintf("%v: client certificate %v is not on the allow-list", errPermissionDenied, certIdentities(e.cert))
}

func (e notOnList) Unwrap() error { return errPermissionDenied }

// refused logs a call refused for its caller (no, wrong or ambiguous
// credentials) at WARN at most once per AuthLogInterval, with the count of the
// refusals not logged since: a client retrying a wrong token in a loop must
// not flood the log. Each one is logged at debug by the logging interceptor.
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

// note records an event at now: through (true), with the count held back
// since, when interval has passed since the last let through; else false.
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
