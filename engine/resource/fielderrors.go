package resource

import (
	"errors"
	"strings"
)

// ErrInvalid marks a resource, a document or a request that fails validation;
// the error is a *ValidationError naming every field and reason.
var ErrInvalid = errors.New("invalid")

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
		out.Errors[i] = FieldError{Field: JoinPath(prefix, fe.Field), Reason: fe.Reason}
	}
	return out
}

// errList collects field errors while a document or a request is read.
type FieldErrors struct {
	errs []FieldError
}

func (l *FieldErrors) Add(field, reason string) {
	l.errs = append(l.errs, FieldError{Field: field, Reason: reason})
}

func (l *FieldErrors) Err() error {
	if len(l.errs) == 0 {
		return nil
	}
	return &ValidationError{Errors: l.errs}
}

// Invalid builds a one-field validation error.
func Invalid(field, reason string) error {
	return &ValidationError{Errors: []FieldError{{Field: field, Reason: reason}}}
}

func JoinPath(prefix, field string) string {
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
