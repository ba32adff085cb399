package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/verdictpdp/verdict/internal/explorer"
	"github.com/verdictpdp/verdict/server"
)

// serveExplorer serves the web explorer on --ui-listen within g until ctx
// ends (docs/explorer.md). Its API calls go to srv in process, through srv's
// method table; with serverTLS (the gRPC listener's certificate) it serves
// HTTPS, without asking browsers for client certificates: its callers
// authorize with the token.
func serveExplorer(ctx context.Context, g *errgroup.Group, cfg Config, srv *server.Server, serverTLS *tls.Config,
	token string, log *slog.Logger) error {
	conn, err := srv.InProcess("explorer")
	if err != nil {
		return fmt.Errorf("--ui-listen: %w", err)
	}
	h, err := explorer.New(explorer.Config{Conn: conn, Token: token, Hosts: cfg.UIHosts, Logger: log})
	if err != nil {
		_ = conn.Close()
		return err
	}
	lis, err := net.Listen("tcp", cfg.UIListen)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("--ui-listen: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	scheme := "http"
	if serverTLS != nil {
		ui := serverTLS.Clone()
		ui.ClientAuth, ui.ClientCAs = tls.NoClientCert, nil
		hs.TLSConfig, scheme = ui, "https"
	}
	log.Info("serving the explorer", "url", scheme+"://"+lis.Addr().String()+"/", "token", token != "")
	g.Go(func() error {
		var err error
		if hs.TLSConfig != nil {
			err = hs.ServeTLS(lis, "", "")
		} else {
			err = hs.Serve(lis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("explorer: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		defer func() { _ = conn.Close() }()
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		return hs.Shutdown(sctx)
	})
	return nil
}
