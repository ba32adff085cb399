package etcd_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
	"github.com/verdictpdp/verdict/store/embedetcd"
	"github.com/verdictpdp/verdict/store/etcd"
	"github.com/verdictpdp/verdict/store/syncer"
)

// An embedded etcd (what `make run` uses without --etcd-endpoints), the store
// on it, and a syncer serving snapshots: a write, then a read of your write.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "verdict-example")
	defer os.RemoveAll(dir)

	e, err := embedetcd.Start(ctx, embedetcd.Config{Dir: dir, Fast: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	st, err := etcd.New(ctx, etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	sy, _ := syncer.New(syncer.Config{Store: st})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go sy.Run(runCtx)

	p, _ := resource.DecodeJSON([]byte(`{"kind":"Policy","name":"web-to-api",
		"sources":[{"match":{"kuma.io/service":"web"}}],"destinations":[{"match":{"kuma.io/service":"api"}}]}`))
	rev, err := st.Apply(ctx, []store.Op{{Resource: p, ExpectedRevision: store.MustNotExist}})
	if err != nil {
		fmt.Println(err)
		return
	}
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	snap, err := sy.WaitFor(waitCtx, rev) // read-your-writes
	if err != nil {
		fmt.Println(err)
		return
	}
	d, _ := snap.Decide(&engine.Request{Source: resource.Tags{"kuma.io/service": "web"}, Destination: resource.Tags{"kuma.io/service": "api"}})
	fmt.Println(d.Action, d.Policy)

	_, err = st.Apply(ctx, []store.Op{{Resource: p, ExpectedRevision: store.MustNotExist}})
	fmt.Println(err)
	// Output:
	// ALLOW web-to-api
	// revision conflict: default/policies/TrafficPermission/web-to-api exists (mod revision 2)
}
