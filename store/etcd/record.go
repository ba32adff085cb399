package etcd

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/verdictpdp/verdict/store"
)

// The write record (docs/history.md, "Records"): every transaction Apply
// sends also puts one key, <meta>writes, whose value says when the write was
// made and for whom. Each version of that key is the record of the write that
// made it — its mod revision is the write's revision — so the records need
// no index, and etcd's compaction prunes them with everything else.
//
// The value starts with the time in a fixed-width form, so that etcd can
// compare it: the transaction holds Compare(Value(record) < time+"\xff"),
// that is, the recorded time is not after this write's. A writer whose clock
// is behind the last record (another replica's, or its own stepped back)
// fails that compare, reads the record, and writes again with its time:
// recorded times never go backwards.

// recordTimeLayout is the records' fixed-width UTC time.
const recordTimeLayout = "2006-01-02T15:04:05.000000000Z"

// recordDoc is a record's value; Time first (see above).
type recordDoc struct {
	Time   string `json:"time"`
	Writer string `json:"writer,omitempty"`
	Via    string `json:"via,omitempty"`
}

// recordState is what the record key is known to hold: nothing (exists
// false), a record of time at, or a value that is none (broken, at mod).
type recordState struct {
	exists bool
	broken bool
	mod    int64
	at     time.Time
}

func (s *Store) recordKey() string { return s.meta + "writes" }

// lastRecord is what this store last knew the record key to hold (by its
// own writes and reads): a guess the transaction's compare checks.
func (s *Store) lastRecord() recordState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.record
}

// recorded notes a record this store wrote.
func (s *Store) recorded(at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.record.exists || s.record.broken || at.After(s.record.at) {
		s.record = recordState{exists: true, at: at}
	}
}

// readRecordState is what a read of the record key found.
func readRecordState(kvs []*mvccpb.KeyValue) recordState {
	if len(kvs) == 0 {
		return recordState{}
	}
	rec, ok := decodeRecord(kvs[0].Value)
	if !ok {
		return recordState{exists: true, broken: true, mod: kvs[0].ModRevision}
	}
	return recordState{exists: true, at: rec.Time}
}

// recordOps are the compare and the put that record a write made at at over
// last (see above).
func (s *Store) recordOps(ctx context.Context, at time.Time, last recordState) (clientv3.Cmp, clientv3.Op) {
	ts := at.UTC().Format(recordTimeLayout)
	b, _ := json.Marshal(recordDoc{Time: ts, Writer: store.WriterOf(ctx), Via: store.ViaOf(ctx)}) // strings only: never fails
	var c clientv3.Cmp
	switch {
	case !last.exists:
		c = clientv3.Compare(clientv3.CreateRevision(s.recordKey()), "=", 0)
	case last.broken:
		c = clientv3.Compare(clientv3.ModRevision(s.recordKey()), "=", last.mod)
	default:
		c = clientv3.Compare(clientv3.Value(s.recordKey()), "<", `{"time":"`+ts+`"`+"\xff")
	}
	return c, clientv3.OpPut(s.recordKey(), string(b))
}

// decodeRecord reads a record's value.
func decodeRecord(v []byte) (store.WriteRecord, bool) {
	var d recordDoc
	if json.Unmarshal(v, &d) != nil || !strings.HasPrefix(string(v), `{"time":"`) {
		return store.WriteRecord{}, false
	}
	t, err := time.Parse(recordTimeLayout, d.Time)
	if err != nil {
		return store.WriteRecord{}, false
	}
	return store.WriteRecord{Time: t, Writer: d.Writer, Via: d.Via}, true
}
