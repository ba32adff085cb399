package etcd_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/storetest"
)

// TestReplicasRegister: replicas registered on one etcd list each other,
// outside the resources (List sees none); a replica that stops is gone at
// once (its lease revoked).
func TestReplicasRegister(t *testing.T) {
	e := startEtcd(t)
	a, b := newStore(t, e.Endpoints()), newStore(t, e.Endpoints())
	register := func(st *etcd.Store, id, addr string) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { st.Register(ctx, id, addr, 2*time.Second) })
		stop = func() { cancel(); wg.Wait() }
		t.Cleanup(stop)
		return stop
	}
	live := func() string {
		rs, err := b.Replicas(storetest.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		s := ""
		for _, r := range rs {
			if r.Revision <= 0 {
				t.Fatalf("replica %+v: no revision", r)
			}
			s += fmt.Sprintf("%s=%s ", r.ID, r.Address)
		}
		return s
	}
	stopA := register(a, "a", "10.0.0.1:7070")
	register(b, "b", "10.0.0.2:7070")
	storetest.Eventually(t, "both registered", func() bool { return live() == "a=10.0.0.1:7070 b=10.0.0.2:7070 " })
	page, err := b.List(storetest.Context(t), store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 0 {
		t.Fatalf("List shows the registrations: %v", page.Items)
	}
	stopA()
	if got := live(); got != "b=10.0.0.2:7070 " {
		t.Fatalf("after a stopped: %q, want b alone", got)
	}
}
