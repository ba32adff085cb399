package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policytest"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/fanout"
	"github.com/verdictpdp/verdict/store"
)

func TestCodeOf(t *testing.T) {
	t.Parallel()
	invalid := &resource.ValidationError{Errors: []resource.FieldError{{Field: "resources[0].policy.action", Reason: "bad"}}}
	tests := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"nil", nil, codes.OK},
		{"validation", invalid, codes.InvalidArgument},
		{"wrapped validation", fmt.Errorf("apply: %w", invalid), codes.InvalidArgument},
		{"mesh not found", fmt.Errorf("%w: x", engine.ErrMeshNotFound), codes.NotFound},
		{"closed by an invalid stored resource", fmt.Errorf("%w: x", engine.ErrInvalidStored), codes.FailedPrecondition},
		{"type not found", &engine.UnknownTypeError{Mesh: "m", Type: "T"}, codes.NotFound},
		{"key not found", fmt.Errorf("%w: k", store.ErrNotFound), codes.NotFound},
		{"a dangling reference at commit", fmt.Errorf("%w: k", store.ErrIntegrity), codes.FailedPrecondition},
		{"conflict", fmt.Errorf("%w: k", store.ErrConflict), codes.Aborted},
		{"too large", store.ErrTooLarge, codes.InvalidArgument},
		{"compacted", store.ErrCompacted, codes.OutOfRange},
		{"a read below the retention window", fmt.Errorf("at: %w", &store.CompactedError{Revision: 3, Oldest: 9}), codes.FailedPrecondition},
		{"a revision not reached yet", fmt.Errorf("%w: revision 9", store.ErrFutureRevision), codes.OutOfRange},
		{"no history", errNoHistory, codes.FailedPrecondition},
		{"store refuses the ops", fmt.Errorf("%w: two ops on k", store.ErrInvalidArgument), codes.InvalidArgument},
		{"store closed", store.ErrClosed, codes.Unavailable},
		{"store unavailable", fmt.Errorf("%w: dial", store.ErrUnavailable), codes.Unavailable},
		{"min_revision not reached", errNotCurrent, codes.Unavailable},
		{"shutting down", errShuttingDown, codes.Unavailable},
		{"unauthenticated", errUnauthenticated, codes.Unauthenticated},
		{"permission denied", errPermissionDenied, codes.PermissionDenied},
		{"two authorization headers", errAmbiguousAuthorization, codes.Unauthenticated},
		{"over the method's receive limit", fmt.Errorf("%w: 5 MiB", errTooLarge), codes.ResourceExhausted},
		{"a watch stream fell behind", fmt.Errorf("%w: resume from 3", fanout.ErrFellBehind), codes.ResourceExhausted},
		{"a WatchRules stream over a cap", fmt.Errorf("%w: 9 on this connection", fanout.ErrTooManyStreams), codes.ResourceExhausted},
		{"the fan-out stopped", fanout.ErrStopped, codes.Unavailable},
		{"no row in the method table", fmt.Errorf("%w: /x.Y/Z", errNoRow), codes.Unimplemented},
		{"a row's check given another message", errWrongMessage, codes.Internal},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), codes.Canceled},
		{"grpc status passes", status.Error(codes.ResourceExhausted, "too big"), codes.ResourceExhausted},
		{"anything else", errors.New("disk on fire"), codes.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := codeOf(tc.err); got != tc.code {
				t.Errorf("codeOf(%v) = %s, want %s", tc.err, got, tc.code)
			}
			if got := status.Code(toStatus(context.Background(), slog.New(slog.DiscardHandler), tc.err)); got != tc.code {
				t.Errorf("toStatus(%v) has code %s, want %s", tc.err, got, tc.code)
			}
		})
	}
}

func TestToStatusDetails(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	err := toStatus(context.Background(), log, &resource.ValidationError{Errors: []resource.FieldError{
		{Field: "resources[1].policy.sources[0].match", Reason: "key \"\" is empty"}, {Field: "deletes[0]", Reason: "bad"}}})
	st, _ := status.FromError(err)
	v := violations(st)
	if len(v) != 2 || v["resources[1].policy.sources[0].match"] != "key \"\" is empty" {
		t.Errorf("violations %v", v)
	}
	st, _ = status.FromError(toStatus(context.Background(), log, errors.New("secret path /etc/x")))
	if st.Message() != internalMessage {
		t.Errorf("internal error text sent to the client: %q", st.Message())
	}
	e := errorEntry(context.Background(), log, errors.New("secret"))
	if e.GetCode() != "Internal" || e.GetMessage() != internalMessage {
		t.Errorf("error entry %v", e)
	}
}

// TestCodeNamesAgreeWithPolicyTest: verdictctl test expects the codes the
// server answers with for the engine's errors.
func TestCodeNamesAgreeWithPolicyTest(t *testing.T) {
	t.Parallel()
	snap := engine.Build(1, nil)
	_, meshErr := snap.Decide(&engine.Request{Mesh: "none"})
	badReq := (&engine.Request{Mesh: "a/b"}).Validate()
	_, decodeErr := resource.DecodeJSON([]byte(`{"kind":"Policy"}`))
	for _, err := range []error{nil, meshErr, badReq, decodeErr, resource.ErrInvalid, engine.ErrMeshNotFound,
		fmt.Errorf("w: %w", resource.ErrInvalid), errors.New("other")} {
		if got, want := codeOf(err).String(), policytest.CodeName(err); got != want {
			t.Errorf("%v: server answers %s, policytest expects %s", err, got, want)
		}
		if name, ok := engine.CodeName(err); ok && codeNamed(name).String() != name {
			t.Errorf("%v: engine.CodeName %q is not a gRPC code name", err, name)
		}
	}
}
