package resource

import (
	"errors"
	"fmt"
)

// DecodeYAML reads every document of a YAML or JSON stream (docs/resources.md) and
// validates each on its own. Errors name the document ("documents[2]") and the
// field. Resources are returned in stream order; a stream with any invalid
// document returns the valid ones and a *ValidationError for the others.
func DecodeYAML(data []byte) ([]Resource, error) {
	docs, err := ParseYAML(data)
	if err != nil {
		return nil, Invalid("", err.Error())
	}
	var out []Resource
	var errs FieldErrors
	for i, d := range docs {
		r, err := DecodeValue(d.Value)
		if err != nil {
			var ve *ValidationError
			if asValidation(err, &ve) {
				prefix := fmt.Sprintf("documents[%d]", i)
				if d.Line > 0 {
					prefix = fmt.Sprintf("documents[%d] (line %d)", i, d.Line)
				}
				errs.errs = append(errs.errs, ve.Prefixed(prefix).Errors...)
				continue
			}
			return out, err
		}
		out = append(out, r)
	}
	return out, errs.Err()
}

// DecodeJSON reads one resource from JSON: the form of etcd values and of the
// API's resources.
func DecodeJSON(data []byte) (Resource, error) {
	v, err := ParseJSON(data)
	if err != nil {
		return nil, Invalid("", err.Error())
	}
	return DecodeValue(v)
}

// DecodeValue decodes and validates one resource from a generic tree (see
// ParseYAML). Kuma universal-format documents are normalized first
// (normalizeKuma, docs/kuma.md); errors name the fields as the document wrote
// them.
func DecodeValue(v any) (Resource, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, Invalid("", "a resource must be an object")
	}
	var errs FieldErrors
	var r Resource
	if isDataplane(m) {
		r, errs.errs = decodeDataplaneDoc(m)
	} else {
		m, paths, outOfScope := normalizeKuma(m, &errs)
		if outOfScope {
			return nil, errs.Err()
		}
		var derrs []FieldError
		r, derrs = decodeResource(m)
		rewriteErrors(derrs, paths)
		errs.errs = append(errs.errs, derrs...)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	if n := encodedSize(r); n > MaxResourceBytes {
		return nil, Invalid("", fmt.Sprintf("the resource is %d bytes encoded, over the limit of %d", n, MaxResourceBytes))
	}
	return r, nil
}

// decodeResource decodes a document in verdict's form; error paths are the
// document's.
func decodeResource(m map[string]any) (Resource, []FieldError) {
	var errs FieldErrors
	o := newObj(&errs, "", m)
	kindText := o.str("kind")
	kind, ok := ParseKind(kindText)
	if !ok {
		if kindText == "" {
			errs.Add("kind", "is required: Mesh, Scope, Policy or Workload (or a Kuma policy or Dataplane with type)")
		} else {
			errs.Add("kind", fmt.Sprintf("%q is not Mesh, Scope, Policy or Workload", kindText))
		}
		return nil, errs.errs
	}
	var r Resource
	switch kind {
	case KindMesh:
		r = decodeMesh(o)
	case KindScope:
		r = decodeScope(o)
	case KindPolicy:
		r = decodePolicy(o)
	case KindWorkload:
		r = decodeWorkload(o)
	}
	o.finish()
	return r, errs.errs
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func asValidation(err error, target **ValidationError) bool {
	return errors.As(err, target)
}
