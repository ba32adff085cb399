package server

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/verdictpdp/verdict/store/embedetcd"
)

func TestMain(m *testing.M) {
	opts := []goleak.Option{goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")}
	for _, f := range embedetcd.Lingering() { // the watch test's etcd member
		opts = append(opts, goleak.IgnoreAnyFunction(f))
	}
	goleak.VerifyTestMain(m, opts...)
}
