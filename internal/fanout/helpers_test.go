package fanout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store/syncer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func decodeYAML(t testing.TB, s string) []resource.Resource {
	t.Helper()
	rs, err := resource.DecodeYAML([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// testSource is a replica for the feed and the hub: apply makes the next
// revision and hands it to every subscriber.
type testSource struct {
	mu   sync.Mutex
	snap *engine.Snapshot
	subs []*testSub
}

func newTestSource(t testing.TB, yaml string) *testSource {
	t.Helper()
	var rs []resource.Resource
	if yaml != "" {
		rs = decodeYAML(t, yaml)
	}
	return &testSource{snap: engine.Build(1, rs)}
}

func (s *testSource) Snapshot() *engine.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

func (s *testSource) Synced() bool { return true }

func (s *testSource) Subscribe(buffer int) syncer.Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := &testSub{src: s, ch: make(chan syncer.Update, max(buffer, 1024))}
	s.subs = append(s.subs, sub)
	return sub
}

type testSub struct {
	src  *testSource
	ch   chan syncer.Update
	once sync.Once
}

func (s *testSub) Updates() <-chan syncer.Update { return s.ch }
func (s *testSub) Err() error                    { return nil }
func (s *testSub) Close() {
	s.once.Do(func() {
		s.src.mu.Lock()
		defer s.src.mu.Unlock()
		s.src.subs = slices.DeleteFunc(s.src.subs, func(o *testSub) bool { return o == s })
	})
}

// running runs f (a Run) until the test ends.
func running(t testing.TB, f func(context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// errEnough ends a Serve once a test has the messages it wants.
var errEnough = errors.New("enough")

// collect serves one stream until it has sent n messages, and returns them
// decoded as T.
func collect[T proto.Message](t testing.TB, n int, serve func(send func(any) error) error) []T {
	t.Helper()
	var out []T
	err := serve(func(m any) error {
		var msg T
		msg = msg.ProtoReflect().New().Interface().(T)
		switch m := m.(type) {
		case *Message:
			parts, err := m.Parts()
			if err != nil {
				return err
			}
			if err := proto.Unmarshal(bytes.Join(parts, nil), msg); err != nil {
				return err
			}
		case T:
			msg = m
		default:
			return fmt.Errorf("sent a %T", m)
		}
		out = append(out, msg)
		if len(out) == n {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("the stream ended after %d messages: %v", len(out), err)
	}
	return out
}
