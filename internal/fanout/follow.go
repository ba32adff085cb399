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
// update skips what it holds). With coalesce, the updates waiting when
// update is called are handed as one (coalesced): a follower whose work
// per update is long keeps up with the newest snapshot rather than judge
// every one it fell behind.
func follow(ctx context.Context, src Source, buffer int, log *slog.Logger, who string, coalesce bool,
	reset func(*engine.Snapshot), update func(syncer.Update)) {
	for ctx.Err() == nil {
		sub := src.Subscribe(buffer)
		reset(src.Snapshot())
		drain(ctx, sub, coalesce, update)
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

// drain hands update the subscription's updates until it ends or ctx does;
// with coalesce, those already waiting behind one together with it.
func drain(ctx context.Context, sub syncer.Subscription, coalesce bool, update func(syncer.Update)) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-sub.Updates():
			if !ok {
				return
			}
			// One reader: what len counts is there to receive.
			for coalesce && len(sub.Updates()) > 0 {
				u = coalesced(u, <-sub.Updates())
			}
			update(u)
		}
	}
}

// coalesced is a then b as one update: b's snapshot, and the changes of
// both, each key's last change only, in the order of the last changes.
func coalesced(a, b syncer.Update) syncer.Update {
	all := append(append(make([]engine.Change, 0, len(a.Changes)+len(b.Changes)), a.Changes...), b.Changes...)
	last := make(map[string]int, len(all))
	for i, c := range all {
		last[changePath(c)] = i
	}
	out := make([]engine.Change, 0, len(last))
	for i, c := range all {
		if last[changePath(c)] == i {
			out = append(out, c)
		}
	}
	return syncer.Update{Snapshot: b.Snapshot, Previous: a.Previous, Changes: out}
}

// changePath is the key a change writes, as its path.
func changePath(c engine.Change) string {
	switch {
	case c.Path != "":
		return c.Path
	case c.Resource != nil:
		return c.Resource.Key().String()
	}
	return c.Key.String()
}
