package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/fanout"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
	"github.com/verdictpdp/verdict/store"
)

// Errors of the server itself. Like every other error, they become gRPC codes
// in codeOf alone.
var (
	// errUnauthenticated: a call that needs an authorized caller came with no
	// credentials, or with a wrong bearer token.
	errUnauthenticated = errors.New("unauthenticated")
	// errPermissionDenied: the caller's identity is not on the allow-list.
	errPermissionDenied = errors.New("permission denied")
	// errNotCurrent: min_revision was not reached before the deadline.
	errNotCurrent = errors.New("the server's snapshot has not reached min_revision")
	// errShuttingDown ends streams when the server stops.
	errShuttingDown = errors.New("server shutting down")
	// errDecisionLogOff: DecisionLogService.Follow on a daemon whose
	// decision log is off.
	errDecisionLogOff = errors.New("the decision log is off (verdictd --decision-log)")
	// errFellBehind ends a watch stream that fell behind the server's bounded
	// history: the client resumes from the revision the error names.
	errFellBehind = errors.New("watch stream too slow")
	// errTooLarge: a message over its method's receive limit (methods.go).
	errTooLarge = errors.New("message too large")
	// errNoRow: a method the server registers but its method table has no
	// row for: refused, never open by omission.
	errNoRow = errors.New("method not served")
	// errWrongMessage: a row's check was handed a message of another type
	// (a wrong row: a bug, Internal).
	errWrongMessage = errors.New("wrong message type")
	// errAmbiguousAuthorization: a call with more than one authorization
	// header; none of them decides.
	errAmbiguousAuthorization = fmt.Errorf("%w: more than one authorization header", errUnauthenticated)
)

// codeOf maps an error to its gRPC code: the one table of the server (docs/api.md,
// "Errors"). Choices:
//   - store.ErrConflict is Aborted: an expected_revision did not hold, the
//     client should re-read and retry its read-modify-write (gRPC's guidance for
//     a failed test-and-set);
//   - store.ErrTooLarge is InvalidArgument: the request itself must change (be
//     split into several calls); retrying it as is can never succeed;
//   - errNotCurrent is Unavailable: another replica, or a retry, may answer;
//   - store.ErrClosed is Unavailable: the daemon is stopping;
//   - errFellBehind is ResourceExhausted: the stream's client read too slowly
//     for the server's bounded history; it resumes (from the revision named);
//   - errTooLarge is ResourceExhausted, as gRPC answers a message over the
//     server's own receive limit; so is fanout.ErrTooManyStreams, a WatchRules
//     stream over a cap (the message names it);
//   - errNoRow is Unimplemented: the server does not serve the method (as
//     gRPC answers a method nobody registered);
//   - a read below the retention window (*store.CompactedError) is
//     FailedPrecondition, naming the oldest revision held; a revision or a
//     time not reached yet (store.ErrFutureRevision) is OutOfRange, as a
//     read past the end of a range (docs/history.md).
func codeOf(err error) codes.Code {
	c, _ := classify(err)
	return c
}

// classify is codeOf's table; known is false for an error this module does not
// know: a status error of gRPC itself (passed through) or an unexpected one.
// The engine's errors map by the engine's own table of code names
// (engine.CodeName), which the suite runner reads too.
func classify(err error) (code codes.Code, known bool) {
	if err == nil {
		return codes.OK, true
	}
	if name, ok := engine.CodeName(err); ok {
		return codeNamed(name), true
	}
	var compacted *store.CompactedError
	switch {
	case errors.As(err, &compacted), errors.Is(err, errNoHistory):
		// A read below the retention window names the oldest revision held.
		return codes.FailedPrecondition, true
	case errors.Is(err, store.ErrFutureRevision):
		return codes.OutOfRange, true
	case errors.Is(err, store.ErrTooLarge), errors.Is(err, store.ErrInvalidArgument):
		return codes.InvalidArgument, true
	case errors.Is(err, store.ErrNotFound):
		return codes.NotFound, true
	case errors.Is(err, store.ErrIntegrity):
		return codes.FailedPrecondition, true
	case errors.Is(err, store.ErrConflict):
		return codes.Aborted, true
	case errors.Is(err, store.ErrCompacted):
		return codes.OutOfRange, true
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, store.ErrClosed), errors.Is(err, errNotCurrent),
		errors.Is(err, errShuttingDown), errors.Is(err, fanout.ErrStopped):
		return codes.Unavailable, true
	case errors.Is(err, errDecisionLogOff):
		return codes.FailedPrecondition, true
	case errors.Is(err, errFellBehind), errors.Is(err, fanout.ErrFellBehind), errors.Is(err, errTooLarge),
		errors.Is(err, fanout.ErrTooManyStreams):
		return codes.ResourceExhausted, true
	case errors.Is(err, errNoRow):
		return codes.Unimplemented, true
	case errors.Is(err, errUnauthenticated):
		return codes.Unauthenticated, true
	case errors.Is(err, errPermissionDenied):
		return codes.PermissionDenied, true
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, true
	case errors.Is(err, context.Canceled):
		return codes.Canceled, true
	}
	if se, ok := status.FromError(err); ok {
		// Already a status: gRPC's own errors (a stream's Send or Recv).
		return se.Code(), false
	}
	return codes.Internal, false
}

// codeNamed is the gRPC code of a code name ("InvalidArgument"); Internal
// for a name that is none.
func codeNamed(name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	return codes.Internal
}

// internalMessage is all a client learns of an unexpected error.
const internalMessage = "internal error (logged by the server)"

// toStatus turns err into the status error a handler returns: the code of
// codeOf, BadRequest field violations for validation errors, gRPC's own status
// errors unchanged, and for an unexpected error only a generic message (the
// text is logged, never sent).
func toStatus(ctx context.Context, log *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	code, known := classify(err)
	switch {
	case !known && code != codes.Internal:
		se, _ := status.FromError(err)
		return se.Err()
	case code == codes.Internal:
		log.ErrorContext(ctx, "internal error", "err", err)
		return status.Error(codes.Internal, internalMessage)
	case code == codes.InvalidArgument:
		err = capViolations(err)
		st := status.New(code, err.Error())
		if br := badRequest(err); br != nil {
			if d, derr := st.WithDetails(br); derr == nil {
				st = d
			}
		}
		return st.Err()
	}
	return status.Error(code, err.Error())
}

// MaxFieldViolations bounds the field violations an error lists (in its
// message and its BadRequest details): a request with 10,000 bad entries
// gets the first ones and a count of the rest, not a megabyte of trailer.
const MaxFieldViolations = 20

// maxViolationText bounds the field path and the description of one violation.
const maxViolationText = 512

// capViolations returns err with at most MaxFieldViolations violations, each
// of bounded text, the last saying how many more were not listed; other
// errors are returned as they are.
func capViolations(err error) error {
	var ve *resource.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	long := len(ve.Errors) > MaxFieldViolations
	for _, fe := range ve.Errors {
		long = long || len(fe.Field) > maxViolationText || len(fe.Reason) > maxViolationText
	}
	if !long {
		return err
	}
	out := &resource.ValidationError{Errors: make([]resource.FieldError, 0, MaxFieldViolations+1)}
	for i, fe := range ve.Errors {
		if i == MaxFieldViolations {
			out.Errors = append(out.Errors, resource.FieldError{Field: out.Errors[i-1].Field,
				Reason: fmt.Sprintf("and %d more violations, not listed", len(ve.Errors)-i)})
			break
		}
		out.Errors = append(out.Errors, resource.FieldError{Field: clip(fe.Field), Reason: clip(fe.Reason)})
	}
	return out
}

// clip cuts s to maxViolationText bytes (on a rune boundary), marking the cut.
func clip(s string) string {
	if len(s) <= maxViolationText {
		return s
	}
	cut := maxViolationText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// badRequest lists the field violations of a validation error.
func badRequest(err error) *errdetails.BadRequest {
	var ve *resource.ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) == 0 {
		return nil
	}
	br := &errdetails.BadRequest{FieldViolations: make([]*errdetails.BadRequest_FieldViolation, len(ve.Errors))}
	for i, fe := range ve.Errors {
		br.FieldViolations[i] = &errdetails.BadRequest_FieldViolation{Field: fe.Field, Description: fe.Reason}
	}
	return br
}

// errorEntry is the error of one flow of a batch or a stream, mapped like a
// call's error.
func errorEntry(ctx context.Context, log *slog.Logger, err error) *verdictv1.Error {
	code := codeOf(err)
	if code == codes.InvalidArgument {
		err = capViolations(err)
	}
	e := &verdictv1.Error{Code: code.String(), Message: err.Error()}
	if code == codes.Internal {
		log.ErrorContext(ctx, "internal error", "err", err)
		e.Message = internalMessage
	}
	var ve *resource.ValidationError
	if code == codes.InvalidArgument && errors.As(err, &ve) {
		for _, fe := range ve.Errors {
			e.FieldViolations = append(e.FieldViolations, &verdictv1.FieldViolation{Field: fe.Field, Description: fe.Reason})
		}
	}
	return e
}
