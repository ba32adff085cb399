package explorer

import (
	"crypto/subtle"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

//go:embed ui
var uiFiles embed.FS

// Config configures the explorer's handler.
type Config struct {
	// Conn reaches the gRPC server whose method table judges each call: the
	// server's own in-process connection (server.Server.InProcess). Required.
	Conn grpc.ClientConnInterface
	// Token, when set, is needed on every API call ("Authorization: Bearer
	// <token>"; 401 without it). The page asks for it and keeps it in the
	// tab's sessionStorage. It is forwarded, so the server judges it too.
	// Empty: development mode, every caller is admitted.
	Token string
	// Hosts are the names, besides IP addresses and localhost, that the page
	// may be reached by (the Host header). Any other name is refused: a page
	// of another site that rebinds its DNS name to this address gets nothing.
	Hosts []string
	// CallTimeout bounds each forwarded call (default 10s).
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// DefaultCallTimeout bounds a forwarded call when Config.CallTimeout is 0.
const DefaultCallTimeout = 10 * time.Second

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Conn == nil {
		errs = append(errs, errors.New("explorer: Conn is required"))
	}
	for _, h := range c.Hosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			errs = append(errs, errors.New("explorer: a host is a DNS name without port: "+h))
		}
	}
	if c.CallTimeout < 0 {
		errs = append(errs, errors.New("explorer: CallTimeout must not be negative"))
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return errors.Join(errs...)
}

// New returns the explorer's handler: the page's files under /, the API under
// /api/, behind the guards (Host, cross-origin, token) and security headers
// that keep the page's requests on this host.
func New(cfg Config) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	files, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	api := http.NewServeMux()
	api.Handle("/"+documentsPath, documents{log: cfg.Logger})
	api.Handle("/", &gateway{conn: cfg.Conn, timeout: cfg.CallTimeout, log: cfg.Logger})
	mux.Handle("/api/", onlyMethods("the API takes POST with a JSON body",
		needsToken(cfg.Token, http.StripPrefix("/api", api)), http.MethodPost))
	mux.Handle("/", onlyMethods("the page is read with GET", pageFiles(files), http.MethodGet, http.MethodHead))
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
	}))
	return securityHeaders(hostGuard(cfg.Hosts, cop.Handler(mux))), nil
}

// onlyMethods answers 405 to a request of another method.
func onlyMethods(why string, next http.Handler, allowed ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(allowed, r.Method) {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			http.Error(w, why, http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// pageFiles serves the page: index.html for "/" whatever the query (the
// view's state is in the query), the files beside it by name, nothing else.
func pageFiles(files fs.FS) http.Handler {
	static := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" || r.URL.Path == "/index.html" {
			w.Header().Set("Cache-Control", "no-cache")
			http.ServeFileFS(w, r, files, "index.html")
			return
		}
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		w.Header().Set("Cache-Control", "no-cache") // revalidated: the binary's files change with the binary
		static.ServeHTTP(w, r)
	})
}

// contentSecurityPolicy lets the page load its own files and call its own
// origin only: no CDN, no request leaves the host, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// hostGuard refuses a request whose Host is not one the explorer answers to:
// an IP address, localhost, or one of hosts. A page that rebinds its own DNS
// name to this address sends its own name, and is refused.
func hostGuard(hosts []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowedHost(r.Host, hosts) {
			http.Error(w, "unknown host: the explorer answers to its address, localhost and the names --ui-host lists",
				http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// allowedHost tells whether a Host header ("name", "name:port", "[::1]:port")
// names the explorer.
func allowedHost(hostport string, hosts []string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return true
	}
	if host == "localhost" {
		return true
	}
	return slices.ContainsFunc(hosts, func(h string) bool { return strings.EqualFold(strings.TrimSuffix(h, "."), host) })
}

// needsToken answers 401 to a request without the token (none configured:
// development mode, every request passes). The gateway forwards the header,
// so the server judges the token too.
func needsToken(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && !tokenOK(r, token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="verdict"`)
			writeStatus(w, status.New(codes.Unauthenticated, "the explorer needs the bearer token (Authorization: Bearer <token>)"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tokenOK tells whether a request carries the token: exactly one
// Authorization header, "Bearer <token>", compared in constant time.
func tokenOK(r *http.Request, token string) bool {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return false
	}
	scheme, got, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}
