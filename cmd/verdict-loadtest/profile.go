package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"
)

// cpuProfile takes a CPU profile of the verdictd whose loopback metrics
// listener is at metrics (its /debug/pprof/profile) while a scenario runs:
// started before the run, for about d (whole seconds, rounded up), written to
// dir/<name>.cpu.pprof. The returned wait blocks until the profile is written
// and says where, or why not.
func cpuProfile(ctx context.Context, metrics, dir, name string, d time.Duration) (wait func() (string, error)) {
	secs := int((d + time.Second - 1) / time.Second)
	done := make(chan error, 1)
	path := filepath.Join(dir, name+".cpu.pprof")
	go func() {
		done <- fetchProfile(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metrics, max(secs, 1)), path,
			time.Duration(secs)*time.Second+30*time.Second)
	}()
	return func() (string, error) { return path, <-done }
}

func fetchProfile(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s (verdictd serves /debug/pprof on a loopback --metrics-listen only)", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close() // the copy's error is the one to report
		return err
	}
	return f.Close()
}

// startCPUProfile profiles this process into path until the returned stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close() // the profiler's error is the one to report
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "cpu profile %s: %v\n", path, err)
		}
	}, nil
}
