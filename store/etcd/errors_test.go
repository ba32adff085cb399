package etcd

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/store"
)

func TestMapErr(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error // nil: none of the store's
	}{
		{"compacted", rpctypes.ErrCompacted, store.ErrCompacted},
		{"future revision", rpctypes.ErrFutureRev, store.ErrInvalidArgument},
		{"too many operations", rpctypes.ErrTooManyOps, store.ErrTooLarge},
		{"request too large", rpctypes.ErrRequestTooLarge, store.ErrTooLarge},
		{"no leader", rpctypes.ErrNoLeader, store.ErrUnavailable},
		{"leader changed", rpctypes.ErrLeaderChanged, store.ErrUnavailable},
		{"not leader", rpctypes.ErrNotLeader, store.ErrUnavailable},
		{"waiting for the applied index", rpctypes.Error(rpctypes.ErrGRPCTimeoutWaitAppliedIndex), store.ErrUnavailable},
		{"unhealthy cluster", rpctypes.Error(rpctypes.ErrGRPCUnhealthy), store.ErrUnavailable},
		{"a transport error", status.Error(codes.Unavailable, "connection refused"), store.ErrUnavailable},
		{"a deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), store.ErrUnavailable},
		{"a wrapped deadline status", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), store.ErrUnavailable},
		{"permission denied", rpctypes.ErrPermissionDenied, nil},
	}
	all := []error{store.ErrCompacted, store.ErrInvalidArgument, store.ErrTooLarge, store.ErrUnavailable}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mapErr("op", tt.err)
			for _, e := range all {
				if errors.Is(got, e) != (e == tt.want) { //nolint:errorlint // the table names sentinels: identity is meant
					t.Fatalf("mapErr(%v) = %v; want %v", tt.err, got, tt.want)
				}
			}
			if !errors.Is(got, tt.err) && tt.want == store.ErrUnavailable { //nolint:errorlint // a sentinel from the table
				t.Fatalf("mapErr(%v) = %v lost the cause", tt.err, got)
			}
		})
	}
}
