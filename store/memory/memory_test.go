package memory_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/memory"
	"github.com/verdictpdp/verdict/store/storetest"
	"github.com/verdictpdp/verdict/store/syncer/syncertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness(t *testing.T) storetest.Harness {
	st := memory.New(memory.Config{ProgressInterval: 50 * time.Millisecond})
	t.Cleanup(func() { st.Close() })
	return storetest.Harness{
		Store:  st,
		Writer: st,
		RawPut: func(_ context.Context, path string, value []byte) (int64, error) {
			return st.PutRaw(path, value), nil
		},
		RawDelete: func(_ context.Context, path string) (int64, error) {
			return st.DeleteRaw(path), nil
		},
		Compact: func(_ context.Context, rev int64) error { return st.Compact(rev) },
		Interrupt: func() func() {
			st.Disconnect()
			return st.Reconnect
		},
	}
}

func TestContract(t *testing.T) { storetest.Run(t, harness) }

func TestSyncerContract(t *testing.T) { syncertest.Run(t, harness) }

func TestCompact(t *testing.T) {
	st := memory.New(memory.Config{})
	defer st.Close()
	r := storetest.Apply(t, st, storetest.Put(storetest.Policy(t, "default", "a", 0)))
	tests := []struct {
		name string
		rev  int64
		ok   bool
	}{
		{"beyond the current revision", r + 1, false},
		{"at the current revision", r, true},
		{"again", r, false},
	}
	for _, tt := range tests {
		if err := st.Compact(tt.rev); (err == nil) != tt.ok {
			t.Fatalf("%s: Compact(%d) = %v", tt.name, tt.rev, err)
		}
	}
	if _, err := st.List(context.Background(), store.ListOptions{Revision: r}); err != nil {
		t.Fatalf("list at the compaction revision: %v", err)
	}
}
