package resource

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrInvalid marks a resource, a document or a request that fails validation;
// the error is a *ValidationError naming every field and reason.
var ErrInvalid = errors.New("invalid")

// FieldError is one validation failure: the path of the field and the reason.
type FieldError struct {
	Field  string // "sources[0].match", "policies[3].ports[1].ports"
	Reason string
	// Stricter names the check of this release the field fails that earlier
	// releases did not make (StricterControl, StricterKumaSchema); "" for the
	// others. A stored document that fails only such checks was accepted
	// before: verdictd reports it (docs/storage.md).
	Stricter string
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
		out.Errors[i] = FieldError{Field: JoinPath(prefix, fe.Field), Reason: fe.Reason, Stricter: fe.Stricter}
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

// addStricter adds an error of one of this release's stricter checks.
func (l *FieldErrors) addStricter(field, reason, check string) {
	l.errs = append(l.errs, FieldError{Field: field, Reason: reason, Stricter: check})
}

// addErr adds err's text; an error of the control-character check is marked
// as that stricter check's.
func (l *FieldErrors) addErr(field string, err error) {
	var ce *controlError
	if errors.As(err, &ce) {
		l.addStricter(field, err.Error(), StricterControl)
		return
	}
	l.Add(field, err.Error())
}

// The checks this release makes that earlier ones did not (FieldError.Stricter).
const (
	StricterControl    = "control characters in tags"
	StricterKumaSchema = "Kuma schema of default"
)

// ErrNewlyRefused matches a StricterError.
var ErrNewlyRefused = errors.New("newly refused by a stricter check")

// StricterError is the error of a document that fails only checks this
// release makes and earlier ones did not (Stricter): one accepted before,
// refused now. It matches ErrNewlyRefused and ErrInvalid.
type StricterError struct {
	Checks []string // the stricter checks failed, sorted
	Err    *ValidationError
}

func (e *StricterError) Error() string {
	return fmt.Sprintf("%v (%s), which this release makes and earlier ones did not: %v", ErrNewlyRefused,
		strings.Join(e.Checks, ", "), e.Err)
}

func (e *StricterError) Unwrap() []error { return []error{ErrNewlyRefused, e.Err} }

// AsStricter returns err as a *StricterError when it is a validation error
// whose every field fails one of this release's stricter checks; else nil.
func AsStricter(err error) *StricterError {
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) == 0 {
		return nil
	}
	var checks []string
	for _, fe := range ve.Errors {
		if fe.Stricter == "" {
			return nil
		}
		if !slices.Contains(checks, fe.Stricter) {
			checks = append(checks, fe.Stricter)
		}
	}
	slices.Sort(checks)
	return &StricterError{Checks: checks, Err: ve}
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
