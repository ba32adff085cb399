package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/dial"
	"github.com/verdictpdp/verdict/internal/listen"
	"github.com/verdictpdp/verdict/server"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
)

// Run runs the daemon until ctx ends: the embedded etcd when no endpoints are
// given, the store, the syncer, the gRPC server and the metrics endpoint, as
// one errgroup. The first to fail stops the others; shutdown is graceful
// (ShutdownTimeout), streams included.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	var seed []resource.Resource
	if cfg.Bootstrap != "" {
		var err error
		if seed, err = loadBootstrap(cfg.Bootstrap); err != nil {
			return err
		}
	}
	tel, err := newTelemetry(ctx, log)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.shutdown(sctx); err != nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()

	endpoints := cfg.EtcdEndpoints
	etcdTLS, err := cfg.etcdTLS()
	if err != nil {
		return err
	}
	if len(endpoints) == 0 {
		// Private: TLS with a client certificate generated into the data
		// directory on both of etcd's listeners, so that no other local
		// process can write around verdictd's authorization (issue 12 F3).
		dir, err := filepath.Abs(cfg.DataDir)
		if err != nil {
			return err
		}
		e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: dir, Logger: log.With("component", "etcd"),
			ProgressNotifyInterval: 5 * time.Second, Private: true})
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		defer func() {
			if err := e.Close(); err != nil {
				log.Warn("embedded etcd close", "err", err)
			}
		}()
		endpoints, etcdTLS = e.Endpoints(), e.ClientTLS()
		log.Info("embedded etcd started", "dir", dir, "endpoints", endpoints,
			"access", "TLS, client certificate from "+filepath.Join(dir, "tls")+" only")
	}
	st := etcd.Connect(ctx, etcd.Config{Endpoints: endpoints, Prefix: cfg.EtcdPrefix, TLS: etcdTLS, Logger: log.With("component", "store")})
	defer func() {
		if err := st.Close(); err != nil {
			log.Warn("store close", "err", err)
		}
	}()
	sy, err := newSyncer(st, log.With("component", "syncer"))
	if err != nil {
		return fmt.Errorf("syncer: %w", err)
	}

	serverTLS, err := cfg.serverTLS()
	if err != nil {
		return err
	}
	token, err := cfg.token()
	if err != nil {
		return err
	}
	// With --bootstrap, health turns SERVING only once the file is in the
	// snapshot: a client that waits for SERVING sees the policies.
	var ready chan struct{}
	if cfg.Bootstrap != "" {
		ready = make(chan struct{})
	}
	dlog, err := newDecisionLog(ctx, cfg, os.Getenv, log.With("component", "decisionlog"))
	if err != nil {
		return err
	}
	lis, err := listen.Listen(cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	// The fleet: this replica, registered in etcd, and the credentials it
	// calls the others with — its own (docs/analysis.md, "The fleet").
	self := server.Replica{ID: replicaID(), Address: advertised(cfg.Advertise, lis.Addr())}
	peer := dial.Options{CAFile: cfg.TLSClientCA, CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, Token: token}
	observedFlows := cfg.ObservedFlows
	if observedFlows == 0 {
		observedFlows = -1 // off
	}
	srv, err := server.New(server.Config{
		DecisionLog: dlog,
		Ready:       readyOrNil(ready),
		Syncer:      sy, Store: st, Logger: log.With("component", "server"),
		TLS: serverTLS, Token: token, AllowedIdentities: cfg.AllowIdentities,
		MeterProvider: tel.meters, TracerProvider: tel.tracer, ShutdownTimeout: cfg.ShutdownTimeout,
		DisableExtAuthz: cfg.DisableExtAuthz,
		AdmitPerCaller:  cfg.AdmitPerCaller,
		WatchConditions: cfg.WatchConditions,
		ObservedFlows:   observedFlows,
		Fleet:           etcdFleet{st}, Replica: self,
		PeerDialOptions: func(addr string) ([]grpc.DialOption, error) {
			o := peer
			o.Server = addr
			return o.DialOptions()
		},
	})
	if err != nil {
		lis.Close()
		return err
	}
	log.Info("serving gRPC", "addr", lis.Addr().String(), "tls", serverTLS != nil,
		"mtls", serverTLS != nil && serverTLS.ClientCAs != nil, "token", token != "", "allowed_identities", len(cfg.AllowIdentities),
		"ext_authz", !cfg.DisableExtAuthz)

	// One replica compacts etcd (an election among those that share it);
	// only the embedded member is defragmented: a shared etcd's members are
	// its operator's (docs/storage.md, "Retention").
	retention := etcd.Retention{Off: cfg.RetentionOff, Duration: cfg.Retention, Revisions: cfg.RetentionRevisions,
		Defrag: len(cfg.EtcdEndpoints) == 0}
	log.Info("etcd retention", "retention", retentionText(cfg), "revisions", cfg.RetentionRevisions, "defragment", retention.Defrag)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return sy.Run(gctx) })
	g.Go(func() error { return st.Maintain(gctx, retention) })
	g.Go(func() error { return srv.Serve(gctx, lis) })
	if self.Address != "" {
		g.Go(func() error { st.Register(gctx, self.ID, self.Address, 0); return nil })
	} else {
		log.Warn("fleet: not registered: --listen is a wildcard address; set --advertise for the other replicas' Impact to reach this one")
	}
	if dlog != nil {
		g.Go(func() error { return dlog.Run(gctx) })
	}
	if cfg.MetricsListen != "" {
		mlis, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			lis.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		log.Info("serving metrics", "addr", "http://"+mlis.Addr().String()+"/metrics")
		loopback, _ := isLoopback(cfg.MetricsListen)
		hs := &http.Server{Handler: tel.metricsHandler(loopback), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := hs.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
			defer cancel()
			return hs.Shutdown(sctx)
		})
	}
	if cfg.UIListen != "" {
		if err := serveExplorer(gctx, g, cfg, srv, serverTLS, token, log.With("component", "explorer")); err != nil {
			lis.Close()
			return err
		}
	}
	if cfg.Bootstrap != "" {
		g.Go(func() error {
			select {
			case <-gctx.Done():
				return nil
			case <-st.Ready():
			}
			rev, err := bootstrap(gctx, cfg.Bootstrap, seed, st, log)
			if err != nil {
				return err
			}
			if _, err := sy.WaitFor(gctx, rev); err != nil {
				return nil // stopping
			}
			close(ready)
			return nil
		})
	}
	err = g.Wait()
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		log.Info("stopped")
		return nil
	}
	return err
}

// retentionText is --retention as given: a duration, or off.
func retentionText(cfg Config) string {
	if cfg.RetentionOff {
		return "off"
	}
	return cfg.Retention.String()
}

// readyOrNil keeps a nil channel nil through the receive-only conversion.
func readyOrNil(c chan struct{}) <-chan struct{} {
	if c == nil {
		return nil
	}
	return c
}

// storeLister is what bootstrap needs of a store.
type storeLister interface {
	Apply(ctx context.Context, ops []store.Op) (int64, error)
	List(ctx context.Context, opts store.ListOptions) (store.ListPage, error)
}

// replicaID names this replica in the fleet: its host and process.
func replicaID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "verdictd"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// advertised is the address the other replicas reach this one at: adv, or
// the listener's own unless it is a wildcard ("": not reachable).
func advertised(adv string, addr net.Addr) string {
	if adv != "" {
		return adv
	}
	switch a := addr.(type) {
	case *net.UnixAddr:
		return "unix:" + a.Name
	case *net.TCPAddr:
		if a.IP.IsUnspecified() {
			return ""
		}
	}
	return addr.String()
}

// etcdFleet is the fleet as registered in etcd.
type etcdFleet struct{ st *etcd.Lazy }

func (f etcdFleet) Replicas(ctx context.Context) ([]server.Replica, error) {
	rs, err := f.st.Replicas(ctx)
	out := make([]server.Replica, len(rs))
	for i, r := range rs {
		out[i] = server.Replica{ID: r.ID, Address: r.Address, Revision: r.Revision}
	}
	return out, err
}
