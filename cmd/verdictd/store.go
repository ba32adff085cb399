package main

import (
	"log/slog"

	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/syncer"
)

// newSyncer builds the syncer over the store.
func newSyncer(st store.Store, log *slog.Logger) (*syncer.Syncer, error) {
	return syncer.New(syncer.Config{Store: st, Logger: log})
}
