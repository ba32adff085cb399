package engine

import (
	"errors"
	"strings"
)

// Errors the engine returns. Match them with errors.Is.
var (
	// ErrInvalid marks a resource, a document or a request that fails validation;
	// the error is a *ValidationError naming every field and reason.
	ErrInvalid = errors.New("invalid")
	// ErrMeshNotFound is returned by Decide and Resolve for a mesh that holds no
	// resource at all (a typo in a mesh name must not fail open).
	ErrMeshNotFound = errors.New("mesh not found")
)

// codeNames is the API status code of each of the engine's errors, by its gRPC
// code name (as google.golang.org/grpc/codes.Code.String spells it: the engine
// imports no gRPC). The first row whose error matches wins.
var codeNames = [...]struct {
	err  error
	name string
}{
	{ErrInvalid, "InvalidArgument"},
	{ErrMeshNotFound, "NotFound"},
	{ErrInvalidStored, "FailedPrecondition"},
	{ErrTypeNotFound, "NotFound"},
	{ErrIdentityNotFound, "NotFound"},
	{ErrIdentityCollision, "FailedPrecondition"},
	{ErrRegistryFull, "ResourceExhausted"},
	{ErrEndpointNotFound, "NotFound"},
	{ErrPeerNotAddressable, "FailedPrecondition"},
}

// CodeName returns the status code name the API answers err with when err is
// one of the engine's errors (ok false otherwise). The server's error table
// (server/errors.go) and the suite runner (engine/policytest) both read it, so
// a suite expects exactly the codes the server answers with.
func CodeName(err error) (name string, ok bool) {
	for _, row := range codeNames {
		if errors.Is(err, row.err) {
			return row.name, true
		}
	}
	return "", false
}

// FieldError is one validation failure: the path of the field and the reason.
type FieldError struct {
	Field  string // "sources[0].match", "policies[3].ports[1].ports"
	Reason string
}

func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// ValidationError lists every field that failed validation. It matches ErrInvalid.
type ValidationError struct {
	Errors []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// Prefixed returns a copy of e whose field paths start with prefix
// ("resources[2]" + ".sources[0]").
func (e *ValidationError) Prefixed(prefix string) *ValidationError {
	out := &ValidationError{Errors: make([]FieldError, len(e.Errors))}
	for i, fe := range e.Errors {
		out.Errors[i] = FieldError{Field: joinPath(prefix, fe.Field), Reason: fe.Reason}
	}
	return out
}

// errList collects field errors while a document or a request is read.
type errList struct {
	errs []FieldError
}

func (l *errList) add(field, reason string) {
	l.errs = append(l.errs, FieldError{Field: field, Reason: reason})
}

func (l *errList) err() error {
	if len(l.errs) == 0 {
		return nil
	}
	return &ValidationError{Errors: l.errs}
}

// invalid builds a one-field validation error.
func invalid(field, reason string) error {
	return &ValidationError{Errors: []FieldError{{Field: field, Reason: reason}}}
}

func joinPath(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "":
		return prefix
	case field[0] == '[':
		return prefix + field
	}
	return prefix + "." + field
}
