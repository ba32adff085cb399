package decisionlog

import (
	"sync"
	"sync/atomic"
	"time"
)

// repeatShards splits the repeat table so that parallel decisions rarely
// share a lock.
const repeatShards = 64

// repeatTable remembers the flows logged recently, by key, and counts the
// decisions that repeat them. The logger's goroutine sweeps it once per
// window: a flow that counted repeats gets a record with repeats set and
// stays for another window; a flow that counted none in a whole window is
// forgotten. So a decision repeated without pause is written once, then once
// per window with its count; and every decision is either written, counted
// in a written record's repeats, or counted as dropped.
type repeatTable struct {
	shards   [repeatShards]repeatShard
	perShard int          // entries a shard may hold
	counted  atomic.Int64 // decisions counted as repeats, ever
}

// repeatShard: a repeat only reads the map (under the read lock) and adds
// to its entry's count, so the decisions of one hot flow never wait for
// each other; entering and sweeping take the lock.
type repeatShard struct {
	mu sync.RWMutex
	m  map[uint64]*repeatEntry
	_  [32]byte // a shard per cache line
}

type repeatEntry struct {
	n     atomic.Int64 // repeats counted in this window
	rec   *Record      // the flow's last record; nil until its Log (under the lock)
	fresh bool         // created or written in this window: kept by the sweep (under the lock)
}

func newRepeatTable(flows int) *repeatTable {
	t := &repeatTable{perShard: max(flows/repeatShards, 1)}
	for i := range t.shards {
		t.shards[i].m = make(map[uint64]*repeatEntry)
	}
	return t
}

func (t *repeatTable) shard(key uint64) *repeatShard {
	return &t.shards[(key^key>>32)%repeatShards]
}

// seen counts key as a repeat if it is in the table; otherwise it enters it
// (room permitting) and reports false: the caller logs the decision.
func (t *repeatTable) seen(key uint64) bool {
	s := t.shard(key)
	s.mu.RLock()
	e, ok := s.m[key]
	if ok {
		e.n.Add(1)
	}
	s.mu.RUnlock()
	if ok {
		t.counted.Add(1)
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[key]; ok { // entered meanwhile
		e.n.Add(1)
		t.counted.Add(1)
		return true
	}
	if len(s.m) < t.perShard {
		s.m[key] = &repeatEntry{fresh: true}
	}
	return false
}

// keep remembers r as key's record, if key is in the table.
func (t *repeatTable) keep(key uint64, r *Record) {
	s := t.shard(key)
	s.mu.Lock()
	if e, ok := s.m[key]; ok {
		e.rec = r
	}
	s.mu.Unlock()
}

// sweep closes a window at now: emit gets a repeats record for each flow
// that counted repeats in it.
func (t *repeatTable) sweep(now time.Time, emit func(*Record)) {
	for i := range t.shards {
		s := &t.shards[i]
		var out []*Record
		s.mu.Lock()
		for k, e := range s.m {
			switch {
			case e.n.Load() > 0 && e.rec != nil:
				out = append(out, withRepeats(e.rec, e.n.Swap(0), now))
				e.fresh = true
			case e.n.Load() > 0: // its first record is not logged yet: next window
			case e.fresh:
				e.fresh = false
			default:
				delete(s.m, k)
			}
		}
		s.mu.Unlock()
		for _, r := range out {
			emit(r)
		}
	}
}
