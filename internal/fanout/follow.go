package fanout

import (
	"context"
	"log/slog"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store/syncer"
)

// Source is what the feed and the hub read of the replica (store/syncer.API
// has it): its current snapshot, whether it has synced, and its updates.
type Source interface {
	Snapshot() *engine.Snapshot
	Synced() bool
	Subscribe(buffer int) syncer.Subscription
}

// resubscribePause spaces renewals of a subscription that keeps ending.
const resubscribePause = 50 * time.Millisecond

// follow follows src until ctx ends: it subscribes (buffer updates), hands
// reset the snapshot the source holds from then on, then update every update
// after it, in order. A subscription that ends — its follower fell behind
// the buffer — is logged and renewed, and reset handed a fresh snapshot:
// closing the gap between what the follower holds and that snapshot is
// reset's work. The subscription is taken before the snapshot is read, so no
// update falls between them (an update reset already holds is handed on too:
// update skips what it holds).
func follow(ctx context.Context, src Source, buffer int, log *slog.Logger, who string,
	reset func(*engine.Snapshot), update func(syncer.Update)) {
	for ctx.Err() == nil {
		sub := src.Subscribe(buffer)
		reset(src.Snapshot())
		drain(ctx, sub, update)
		sub.Close()
		if err := sub.Err(); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, who+" resubscribes", "err", err)
		}
		select { // never spin on a subscription that keeps ending
		case <-ctx.Done():
		case <-time.After(resubscribePause):
		}
	}
}

// drain hands update the subscription's updates until it ends or ctx does.
func drain(ctx context.Context, sub syncer.Subscription, update func(syncer.Update)) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-sub.Updates():
			if !ok {
				return
			}
			update(u)
		}
	}
}
