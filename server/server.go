// Package server is verdict's gRPC API (docs/api.md): the handlers of
// verdict.v1's DecisionService, PolicyService and WatchService, which translate
// between the API's messages and the engine's types, call the engine, the
// syncer's snapshot or the store, and map errors to codes (errors.go) —
// nothing else. It also assembles the production gRPC server: interceptors
// (logging, recovery, and the method table's access, limits, validation and
// redaction: methods.go), keepalive enforcement, health, reflection,
// OpenTelemetry, and a graceful shutdown that ends streams.
//
// Each service is a struct of exactly the dependencies it uses, wired by New
// (see Server): a handler cannot reach the store, the syncer or the feed
// unless its service holds them.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/conditions"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/admission"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/decisionlog"
	"github.com/verdictpdp/verdict/internal/fanout"
	"github.com/verdictpdp/verdict/internal/observed"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/history"
	"github.com/verdictpdp/verdict/store/syncer"
)

// Store is what the server uses of a store.Store: writes, reads of one key,
// and its health. Watches are the syncer's: WatchResources streams are
// served from its updates, never from a watch of their own.
type Store interface {
	Apply(ctx context.Context, ops []store.Op) (int64, error)
	Get(ctx context.Context, key resource.Key) (store.Item, error)
	Health() store.Health
}

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	Syncer syncer.API // required: the snapshots every read and watch answers from
	Store  Store      // required: writes
	Logger *slog.Logger

	// TLS secures the listener; nil serves plaintext. With ClientCAs set,
	// client certificates are verified and identify callers for AllowedIdentities.
	TLS *tls.Config
	// Token is the bearer token of authorized callers ("authorization:
	// Bearer <token>"); empty: none. The method table (methods.go) says what
	// needs one.
	Token string
	// AllowedIdentities authorize mTLS clients: a URI SAN (spiffe://...) or a
	// DNS SAN of the verified client certificate.
	// With neither Token nor AllowedIdentities, every caller is admitted
	// (development mode: the daemon listens on loopback only).
	AllowedIdentities []string

	// MeterProvider records the metrics (nil: none).
	MeterProvider metric.MeterProvider
	// TracerProvider records the traces (nil: none).
	TracerProvider trace.TracerProvider

	// ShutdownTimeout bounds the graceful stop (default 10s); then
	// connections are closed.
	ShutdownTimeout time.Duration
	// WaitTimeout bounds the wait for min_revision of a request without a
	// deadline (default 5s).
	WaitTimeout time.Duration
	// MaxRecvMsgBytes bounds a request message of a method whose row sets no
	// limit of its own (default 4 MiB: an Apply of one full etcd transaction
	// fits). gRPC's own receive limit is the largest method limit plus
	// ReceiveHeadroom, so that a message over its method's limit is refused
	// by its row (Check: a DENY), not by gRPC.
	MaxRecvMsgBytes int
	// KeepaliveMinTime: clients pinging more often are disconnected (default 10s).
	KeepaliveMinTime time.Duration
	// WatchHistory bounds the change sets WatchResources keeps for resumes and
	// slow streams (default 1024); WatchHistoryChanges bounds the changes they
	// hold (default 16384; the newest set is kept whatever its size). A resume
	// from an older revision gets a fresh snapshot; a stream that falls further
	// behind ends with RESOURCE_EXHAUSTED.
	WatchHistory        int
	WatchHistoryChanges int
	// WatchConditions: WatchResources messages carry each policy's standing
	// conditions, with conditions_only changes, and the metric
	// verdict_policy_conditions counts them (docs/lint.md). The feed then
	// judges each change it sends, off the decision path: what a policy
	// change can move, the policies a workload change can move; change sets
	// that wait behind a judgement are judged together (verdictd turns it
	// on by default).
	WatchConditions bool
	// RulesMaxLag: a WatchRules stream whose client does not read ends with
	// RESOURCE_EXHAUSTED once a newer state has waited this long behind its
	// unread messages (default 5s), and its connection is closed.
	RulesMaxLag time.Duration
	// RulesMaxStreams, RulesMaxStreamsPerCaller and RulesMaxStreamsPerConn
	// cap the WatchRules streams open at once: on the server (default
	// 10,000), per caller — a verified client certificate's identity, else
	// the peer's address without its port — (default 4,000) and per
	// connection (default 1,000). A stream over a cap is refused with
	// RESOURCE_EXHAUSTED naming it.
	RulesMaxStreams          int
	RulesMaxStreamsPerCaller int
	RulesMaxStreamsPerConn   int
	// AuthLogInterval: refused calls (no or wrong credentials) are logged at
	// WARN at most once per interval, with a count of the others (default 10s).
	AuthLogInterval time.Duration
	// DecisionLog, when set, receives a record of every decision its filter
	// wants (never blocking a decision), and serves DecisionLogService.Follow.
	DecisionLog *decisionlog.Logger
	// IdentityMaxSets and IdentityMaxBytes bound the registry of tag sets
	// registered through Identify (defaults inventory.DefaultRegistryMaxSets and
	// inventory.DefaultRegistryMaxBytes); past them the least recently used sets
	// are evicted (inventory.Registry).
	IdentityMaxSets  int
	IdentityMaxBytes int64
	// IdentityMeshMaxSets and IdentityMeshMaxBytes bound one mesh's part of
	// the registry (defaults inventory.DefaultRegistryMeshMaxSets and
	// inventory.DefaultRegistryMeshMaxBytes, at most the whole): a mesh's new
	// set evicts only its own mesh's sets, and a registry full of other
	// meshes' sets refuses it (RESOURCE_EXHAUSTED).
	IdentityMeshMaxSets  int
	IdentityMeshMaxBytes int64
	// IdentifyCallerRate and IdentifyCallerBurst limit the new tag sets one
	// caller (its client certificate's first SAN, else its IP address)
	// registers through Identify: a bucket of IdentifyCallerBurst sets
	// (default 10,000) refilled at IdentifyCallerRate a second (default
	// 1,000). A set registered already costs nothing; past the limit an
	// endpoint answers RESOURCE_EXHAUSTED.
	IdentifyCallerRate  float64
	IdentifyCallerBurst int
	// AdmitPerCaller bounds the decision calls of one caller executing at
	// once (the method table's admitted rows; a stream's messages one by
	// one): the others wait, without CPU and in order, until one of the
	// caller's slots frees or their deadline ends (default
	// admission.DefaultPerCaller: half of GOMAXPROCS, at least 1; negative: no
	// bound). The caller is named as for IdentifyCallerRate.
	AdmitPerCaller int
	// DisableExtAuthz: do not serve Envoy's envoy.service.auth.v3.Authorization
	// (docs/envoy.md), which is served by default beside verdict.v1.
	DisableExtAuthz bool
	// ObservedFlows bounds the observed-flows table, the distinct flows
	// this replica decided, which Impact replays (default
	// observed.DefaultMax; negative: no table).
	ObservedFlows int
	// Fleet lists the live replicas whose observed flows Impact asks for
	// with fleet (nil: this replica's alone); Replica is this one (its id
	// and advertised address), read directly, never called. PeerDialOptions
	// are the credentials a replica calls another at an address with
	// (nil: plaintext, no token); FleetTimeout
	// bounds each one's answer (default DefaultFleetTimeout, and the call's
	// own deadline).
	Fleet           Fleet
	Replica         Replica
	PeerDialOptions func(addr string) ([]grpc.DialOption, error)
	FleetTimeout    time.Duration
	// Ready, when set, holds health NOT_SERVING until it is closed, on top of
	// the first sync (the daemon closes it once its --bootstrap file is in the
	// snapshot).
	Ready <-chan struct{}

	// HistorySnapshots and HistoryBytes bound the cache of snapshots at past
	// revisions (defaults history.DefaultMaxSnapshots, 1024, and
	// history.DefaultMaxBytes, 512 MiB by estimate; docs/history.md). The
	// past is read when Store keeps history (store.History: store/etcd).
	HistorySnapshots int
	HistoryBytes     int64

	// methods replaces the method table (tests only; nil: methodTable).
	methods map[string]*method
}

// Defaults.
const (
	DefaultShutdownTimeout     = 10 * time.Second
	DefaultWaitTimeout         = 5 * time.Second
	DefaultMaxRecvMsgBytes     = 4 << 20
	DefaultKeepaliveMinTime    = 10 * time.Second
	DefaultAuthLogInterval     = 10 * time.Second
	DefaultRulesMaxLag         = fanout.DefaultMaxLag
	DefaultWatchHistory        = fanout.DefaultHistory
	DefaultWatchHistoryChanges = fanout.DefaultHistoryChanges

	DefaultRulesMaxStreams          = fanout.DefaultMaxStreams
	DefaultRulesMaxStreamsPerCaller = fanout.DefaultMaxStreamsPerCaller
	DefaultRulesMaxStreamsPerConn   = fanout.DefaultMaxStreamsPerConn
)

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Syncer == nil {
		errs = append(errs, errors.New("server: Syncer is required"))
	}
	if c.Store == nil {
		errs = append(errs, errors.New("server: Store is required"))
	}
	if c.ShutdownTimeout < 0 || c.WaitTimeout < 0 || c.MaxRecvMsgBytes < 0 || c.KeepaliveMinTime < 0 ||
		c.WatchHistory < 0 || c.WatchHistoryChanges < 0 || c.AuthLogInterval < 0 || c.RulesMaxLag < 0 ||
		c.RulesMaxStreams < 0 || c.RulesMaxStreamsPerCaller < 0 || c.RulesMaxStreamsPerConn < 0 ||
		c.IdentityMaxSets < 0 || c.IdentityMaxBytes < 0 || c.IdentityMeshMaxSets < 0 || c.IdentityMeshMaxBytes < 0 ||
		c.IdentifyCallerRate < 0 || c.IdentifyCallerBurst < 0 || c.HistorySnapshots < 0 || c.HistoryBytes < 0 || c.FleetTimeout < 0 {
		errs = append(errs, errors.New("server: durations and sizes must not be negative"))
	}
	if len(c.AllowedIdentities) > 0 && (c.TLS == nil || c.TLS.ClientCAs == nil) {
		errs = append(errs, errors.New("server: an identity allow-list needs TLS with a client CA (mutual TLS)"))
	}
	for _, id := range c.AllowedIdentities {
		if id == "" {
			errs = append(errs, errors.New("server: an allowed identity is empty"))
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.MaxRecvMsgBytes == 0 {
		c.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if c.KeepaliveMinTime == 0 {
		c.KeepaliveMinTime = DefaultKeepaliveMinTime
	}
	if c.WatchHistory == 0 {
		c.WatchHistory = DefaultWatchHistory
	}
	if c.WatchHistoryChanges == 0 {
		c.WatchHistoryChanges = DefaultWatchHistoryChanges
	}
	if c.AuthLogInterval == 0 {
		c.AuthLogInterval = DefaultAuthLogInterval
	}
	if c.RulesMaxLag == 0 {
		c.RulesMaxLag = DefaultRulesMaxLag
	}
	if c.IdentifyCallerRate == 0 {
		c.IdentifyCallerRate = DefaultIdentifyCallerRate
	}
	if c.IdentifyCallerBurst == 0 {
		c.IdentifyCallerBurst = DefaultIdentifyCallerBurst
	}
	if c.RulesMaxStreams == 0 {
		c.RulesMaxStreams = DefaultRulesMaxStreams
	}
	if c.RulesMaxStreamsPerCaller == 0 {
		c.RulesMaxStreamsPerCaller = DefaultRulesMaxStreamsPerCaller
	}
	if c.RulesMaxStreamsPerConn == 0 {
		c.RulesMaxStreamsPerConn = DefaultRulesMaxStreamsPerConn
	}
	if c.RulesMaxStreamsPerConn > c.RulesMaxStreamsPerCaller || c.RulesMaxStreamsPerCaller > c.RulesMaxStreams {
		errs = append(errs, fmt.Errorf("server: WatchRules stream caps must not grow inward: per connection %d, per caller %d, in total %d",
			c.RulesMaxStreamsPerConn, c.RulesMaxStreamsPerCaller, c.RulesMaxStreams))
	}
	if c.AdmitPerCaller == 0 {
		c.AdmitPerCaller = admission.DefaultPerCaller()
	}
	if c.ObservedFlows == 0 {
		c.ObservedFlows = observed.DefaultMax
	}
	if c.FleetTimeout == 0 {
		c.FleetTimeout = DefaultFleetTimeout
	}
	if c.MeterProvider == nil {
		c.MeterProvider = metricnoop.NewMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = tracenoop.NewTracerProvider()
	}
	return errors.Join(errs...)
}

// DevMode reports whether no authorization is configured: every caller is
// admitted.
func (c *Config) DevMode() bool { return c.Token == "" && len(c.AllowedIdentities) == 0 }

// Server is verdict's gRPC server.
//
// The server runs what the services share — the rules hub, the change feed,
// health, the stop — but hands no service itself: New gives each service a
// struct of exactly what it uses (as etcd's v3rpc kvServer holds a RaftKV,
// not the etcd server), narrow interfaces declared next to it
// (snapshotSource, syncStatus, resourceFeed, rulesHub) or small types (snapshots: reads
// at a min_revision; decider: a decision counted, logged and converted;
// authorizer).
type Server struct {
	cfg    Config
	log    *slog.Logger
	syncer syncer.API // watchSynced
	auth   *authorizer
	// methods is the method table (methods.go); limits its requests' receive
	// limits by type (requestCodec) and grpcLimit gRPC's own.
	methods   map[string]*method
	limits    map[protoreflect.FullName]int
	grpcLimit int
	hub       *fanout.Hub
	feed      *fanout.Feed
	// identities holds the tag sets registered through Identify (compact.go).
	identities *inventory.Registry
	// slots admits the decision calls per caller (nil: no bound).
	slots *admission.Limiter
	// observed is the observed-flows table (nil: none).
	observed *observed.Table
	health   *health.Server
	grpc     *grpc.Server

	// The services (New wires them; tests call them directly).
	decision decisionService
	policy   policyService

	stop     chan struct{} // closed when the server stops: streams end
	stopOnce sync.Once
	// endedByStop counts the calls that ended with a warning-level code while
	// the server stopped: logged at debug, then summed up in one line.
	endedByStop atomic.Int64
}

// New builds a server; Serve runs it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, syncer: cfg.Syncer, health: health.NewServer(), stop: make(chan struct{}),
		auth:    newAuthorizer(&cfg),
		methods: cfg.methods,
		identities: inventory.NewRegistryWith(inventory.RegistryLimits{MaxSets: cfg.IdentityMaxSets, MaxBytes: cfg.IdentityMaxBytes,
			MeshMaxSets: cfg.IdentityMeshMaxSets, MeshMaxBytes: cfg.IdentityMeshMaxBytes}),
	}
	if s.methods == nil {
		s.methods = methodTable
	}
	if cfg.AdmitPerCaller > 0 {
		s.slots = admission.New(cfg.AdmitPerCaller)
	}
	if cfg.ObservedFlows > 0 {
		s.observed = observed.New(observed.Config{Max: cfg.ObservedFlows})
	}
	s.limits, s.grpcLimit = requestLimits(s.methods, cfg.MaxRecvMsgBytes)
	m, err := newMetrics(cfg.MeterProvider, cfg.Syncer, cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	conds := conditions.NewTracker()
	fc := fanout.FeedConfig{Source: cfg.Syncer, Log: cfg.Logger, History: cfg.WatchHistory,
		HistoryChanges: cfg.WatchHistoryChanges, Stop: s.stop, Dropped: m.watchDropped}
	if cfg.WatchConditions {
		fc.Conditions = conds
	}
	s.feed = fanout.NewFeed(fc)
	s.hub = fanout.NewHub(fanout.HubConfig{Source: cfg.Syncer, Log: cfg.Logger, MaxLag: cfg.RulesMaxLag, Stop: s.stop,
		Limits: fanout.Limits{Total: cfg.RulesMaxStreams, PerCaller: cfg.RulesMaxStreamsPerCaller, PerConnection: cfg.RulesMaxStreamsPerConn},
		Dropped: func(ctx context.Context) {
			m.rulesDropped(ctx)
			// A client that stopped reading keeps what the transport queued
			// for it until it reads or disconnects: close its connection, so
			// that the memory goes with it. Its other streams and calls on
			// that connection end UNAVAILABLE; gRPC clients reconnect.
			closeCallerConn(ctx)
		}})
	meter := cfg.MeterProvider.Meter("github.com/verdictpdp/verdict/server")
	byPolicy, err := newPolicyCounts(meter)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	if cfg.WatchConditions {
		if err := registerConditionMetrics(meter, cfg.Syncer, conds); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	if cfg.DecisionLog != nil {
		if err := registerDecisionLogMetrics(meter, cfg.DecisionLog); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	snaps := snapshots{src: cfg.Syncer, wait: cfg.WaitTimeout}
	hist, _ := cfg.Store.(store.History)
	if hist != nil {
		hc := history.Config{Store: hist, Current: cfg.Syncer.Snapshot, MaxSnapshots: cfg.HistorySnapshots, MaxBytes: cfg.HistoryBytes}
		if sr, ok := cfg.Store.(storageReporter); ok {
			hc.Oldest = func() int64 { return sr.Storage().OldestRevision }
		}
		past, err := history.New(hc)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		snaps.past = past
	}
	dec := &decider{identities: s.identities, registrations: newRegistrationLimits(cfg.IdentifyCallerRate, cfg.IdentifyCallerBurst),
		confs: apiconv.NewConfCache(100_000), record: newRecorder(m, byPolicy, cfg.DecisionLog, s.observed)}
	s.decision = decisionService{decider: dec, snapshots: snaps, log: cfg.Logger, stop: s.stop}
	s.policy = policyService{log: cfg.Logger, snaps: snaps, store: cfg.Store, sync: cfg.Syncer, lists: &listCache{},
		history: hist, auth: s.auth, conds: conds}
	s.grpc = grpc.NewServer(s.ServerOptions()...)
	verdictv1.RegisterDecisionServiceServer(s.grpc, s.decision)
	verdictv1.RegisterPolicyServiceServer(s.grpc, s.policy)
	verdictv1.RegisterWatchServiceServer(s.grpc, watchService{log: cfg.Logger, feed: s.feed, rules: s.hub})
	verdictv1.RegisterAnalysisServiceServer(s.grpc, analysisService{log: cfg.Logger, snaps: snaps, identities: s.identities,
		observed: s.observed, fleet: cfg.Fleet, self: cfg.Replica, dial: cfg.PeerDialOptions, fleetTimeout: cfg.FleetTimeout})
	verdictv1.RegisterDecisionLogServiceServer(s.grpc, decisionLogService{log: cfg.Logger, stop: s.stop, decisions: cfg.DecisionLog})
	if !cfg.DisableExtAuthz {
		authv3.RegisterAuthorizationServer(s.grpc, authzService{log: cfg.Logger, snaps: snaps, dec: dec})
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	for _, svc := range s.healthServices() {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return s, nil
}

// healthServices are the service names health reports on: "" (the server),
// the verdict.v1 services, and Envoy's Authorization when it is served (an
// Envoy cluster's gRPC health check may name it).
func (s *Server) healthServices() []string {
	out := []string{"", verdictv1.DecisionService_ServiceDesc.ServiceName,
		verdictv1.PolicyService_ServiceDesc.ServiceName, verdictv1.WatchService_ServiceDesc.ServiceName,
		verdictv1.AnalysisService_ServiceDesc.ServiceName}
	if !s.cfg.DisableExtAuthz {
		out = append(out, authv3.Authorization_ServiceDesc.ServiceName)
	}
	return out
}

// staticWindow is a stream's flow-control window, a connection's four: fixed,
// so that gRPC's bandwidth estimator stays off (it pings at each burst of
// data received, on a busy stream as often as messages arrive) and what a
// connection may send unread stays bounded (the estimator grows to 16 MiB).
const staticWindow = 256 << 10

// ServerOptions returns the gRPC server options of the server: the
// interceptors, limits, keepalive, TLS and telemetry. The load tester and the
// benchmarks serve an empty handler with them: the ceiling a handler is
// compared with.
func (s *Server) ServerOptions() []grpc.ServerOption {
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(func(c codes.Code) logging.Level {
			switch c {
			case codes.OK, codes.Canceled, codes.NotFound, codes.InvalidArgument, codes.Aborted, codes.AlreadyExists, codes.OutOfRange,
				codes.Unauthenticated, codes.PermissionDenied: // refusals: authorize warns, rate-limited
				return logging.LevelDebug
			case codes.Internal, codes.Unknown, codes.DataLoss:
				return logging.LevelError
			}
			return logging.LevelWarn
		}),
	}
	logger := logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		if lvl == logging.LevelWarn && s.stopping() {
			// Streams ended by the stop (UNAVAILABLE) are expected: one
			// line per stream would bury the stop under thousands.
			s.endedByStop.Add(1)
			lvl = logging.LevelDebug
		}
		s.log.Log(ctx, slog.Level(lvl), msg, fields...)
	})
	recoveryOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		return toStatus(ctx, s.log, fmt.Errorf("panic: %v", p))
	})
	opts := []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithMeterProvider(s.cfg.MeterProvider), otelgrpc.WithTracerProvider(s.cfg.TracerProvider))),
		grpc.ChainUnaryInterceptor(
			logging.UnaryServerInterceptor(logger, logOpts...),
			recovery.UnaryServerInterceptor(recoveryOpt),
			s.unaryInterceptor, // the method table: access, limits, validation, redaction
		),
		grpc.ChainStreamInterceptor(
			logging.StreamServerInterceptor(logger, logOpts...),
			recovery.StreamServerInterceptor(recoveryOpt),
			s.streamInterceptor,
		),
		grpc.MaxRecvMsgSize(s.grpcLimit),
		grpc.StaticStreamWindowSize(staticWindow), grpc.StaticConnWindowSize(4 * staticWindow),
		// Undecodable requests: INVALID_ARGUMENT, not INTERNAL; requests over
		// their method's limit are marked, not decoded.
		grpc.ForceServerCodecV2(newRequestCodec().withLimits(s.limits, s.cfg.MaxRecvMsgBytes)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.cfg.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
	}
	if s.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.TLS)))
	}
	return opts
}

// Serve serves on lis until ctx ends, then stops gracefully: health turns
// NOT_SERVING, streams end with UNAVAILABLE, unary calls in flight finish
// within ShutdownTimeout, then every connection is closed.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	if s.cfg.DevMode() {
		s.log.WarnContext(ctx, "development mode: no token and no identity allow-list, every caller may write policies")
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.grpc.Serve(connListener{lis}); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc: %w", err)
		}
		return nil
	})
	g.Go(func() error { s.hub.Run(gctx); return nil })
	g.Go(func() error { s.feed.Run(gctx); return nil })
	g.Go(func() error { s.watchSynced(gctx); return nil })
	g.Go(func() error { s.warmAnalysis(gctx); return nil })
	if s.observed != nil {
		g.Go(func() error { s.observed.Run(gctx); return nil })
	}
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown()
		return nil
	})
	return g.Wait()
}

// watchSynced turns health SERVING once the syncer has applied its first full
// list (and Ready is closed, when set). It stays SERVING afterwards, also while the store is unreachable: the
// last snapshot keeps serving (Status and metrics say it is stale).
func (s *Server) watchSynced(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !s.syncer.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if s.cfg.Ready != nil {
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Ready:
		}
	}
	if s.stopping() {
		return
	}
	for _, svc := range s.healthServices() {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	s.log.InfoContext(ctx, "synced: serving", "revision", s.syncer.Snapshot().Revision())
}

func (s *Server) shutdown() {
	s.stopOnce.Do(func() {
		s.health.Shutdown()
		close(s.stop)
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		t := time.NewTimer(s.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			s.log.Warn("graceful stop timed out: closing connections")
			s.grpc.Stop()
			<-done
		}
		if n := s.endedByStop.Load(); n > 0 {
			s.log.Info("stopped", "calls_ended_by_stop", n)
		}
	})
}

// stopping tells whether the server has begun to stop.
func (s *Server) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// snapshotSource is what a read needs of the syncer: the current snapshot,
// and a wait for one at or after a revision (syncer.API has both).
type snapshotSource interface {
	Snapshot() *engine.Snapshot
	WaitFor(ctx context.Context, revision int64) (*engine.Snapshot, error)
}

// snapshots serves the reads that name a min_revision: the revision waiter
// every service that reads a snapshot holds.
type snapshots struct {
	src  snapshotSource
	wait time.Duration // Config.WaitTimeout: the wait of a request without a deadline
	past pastReader    // reads at a past revision or time (history.go); nil: none
}

// current is the snapshot the replica serves now.
func (s snapshots) current() *engine.Snapshot { return s.src.Snapshot() }

// messageAt is snapshotAt for one message of a stream, which has no deadline
// of its own: it waits at most WaitTimeout, whatever the stream's deadline,
// and stops when the stream ends.
func (s snapshots) messageAt(ctx context.Context, rev int64) (*engine.Snapshot, error) {
	if snap := s.src.Snapshot(); rev <= 0 || snap.Revision() >= rev {
		return snap, nil
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	return s.snapshotAt(wctx, rev)
}

// snapshotAt returns the current snapshot, or for rev > 0 one at or after rev,
// waiting for the syncer until just before the request's deadline
// (WaitTimeout without one); errNotCurrent when it does not get there.
func (s snapshots) snapshotAt(ctx context.Context, rev int64) (*engine.Snapshot, error) {
	snap := s.src.Snapshot()
	if rev <= 0 || snap.Revision() >= rev {
		return snap, nil
	}
	// Stop waiting a little before the request's deadline, so that the answer
	// is UNAVAILABLE (try another replica) rather than the client's own
	// DEADLINE_EXCEEDED.
	wait := s.wait
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		wait = left - min(500*time.Millisecond, left/5)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	snap, err := s.src.WaitFor(ctx, rev)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: waited for revision %d, the snapshot is at %d", errNotCurrent, rev, s.src.Snapshot().Revision())
	}
	return snap, nil
}
