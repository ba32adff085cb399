package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/writeplan"
	"github.com/verdictpdp/verdict/store"
)

// loadBootstrap reads and validates a bootstrap file as one write to an empty
// store, before anything starts.
func loadBootstrap(path string) ([]resource.Resource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--bootstrap: %w", err)
	}
	resources, err := resource.DecodeYAML(data)
	if err == nil {
		err = engine.Empty().CheckApply(resources, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("--bootstrap %s: %w", path, err)
	}
	return resources, nil
}

// bootstrap applies a policy file when the store holds no resource (first
// start, `make run`). The whole file is validated first; a file that does not
// fit one transaction is written in several, meshes and scopes first, each
// create-only, so that a concurrent writer (another replica bootstrapping) is
// never overwritten.
// It returns the revision of the last write (0 when it wrote nothing).
func bootstrap(ctx context.Context, path string, resources []resource.Resource, st storeLister, log *slog.Logger) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	page, err := st.List(lctx, store.ListOptions{Limit: 1})
	if err != nil {
		return 0, fmt.Errorf("--bootstrap: reading the store: %w", err)
	}
	if len(page.Items) > 0 {
		log.Info("bootstrap skipped: the store already holds resources", "file", path)
		return 0, nil
	}
	var rev int64
	for _, part := range writeplan.Split(resources, 0) {
		ops := make([]store.Op, len(part))
		for i, r := range part {
			ops[i] = store.Op{Key: r.Key(), Resource: r, ExpectedRevision: store.MustNotExist}
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rev, err = st.Apply(wctx, ops)
		cancel()
		if errors.Is(err, store.ErrConflict) {
			log.Info("bootstrap stopped: another writer wrote first", "file", path)
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("--bootstrap %s: %w", path, err)
		}
	}
	log.Info("bootstrapped", "file", path, "resources", len(resources), "revision", rev)
	return rev, nil
}
