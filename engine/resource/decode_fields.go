package resource

// The field walker: reads one object's fields by name, collects errors with
// their paths and reports the fields never read as unknown.

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
)

// obj reads the fields of one object and reports the ones never read as unknown.
type obj struct {
	errs  *FieldErrors
	path  string
	m     map[string]any
	used  map[string]struct{}
	asked []string // every field read, present or not: the object's known fields
}

func newObj(errs *FieldErrors, path string, m map[string]any) *obj {
	return &obj{errs: errs, path: path, m: m, used: make(map[string]struct{}, len(m))}
}

func (o *obj) field(key string) string { return JoinPath(o.path, key) }

func (o *obj) take(key string) (any, bool) {
	o.asked = append(o.asked, key)
	v, ok := o.m[key]
	if !ok {
		return nil, false
	}
	o.used[key] = struct{}{}
	if v == nil {
		return nil, false
	}
	return v, true
}

func (o *obj) finish() {
	if len(o.used) == len(o.m) {
		return
	}
	var unknown []string
	for k := range o.m {
		if _, ok := o.used[k]; !ok {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		reason := "unknown field"
		if near := NearestNames(k, o.asked, 1); len(near) > 0 {
			reason += "; did you mean " + near[0] + "?"
		}
		o.errs.Add(o.field(k), reason)
	}
}

func (o *obj) str(key string) string {
	v, ok := o.take(key)
	if !ok {
		return ""
	}
	s, ok := scalarText(v)
	if !ok {
		o.errs.Add(o.field(key), "must be a string")
	}
	return s
}

func scalarText(v any) (string, bool) {
	switch t := v.(type) {
	case string:
		return t, true
	case json.Number:
		return t.String(), true
	case bool:
		return strconv.FormatBool(t), true
	}
	return "", false
}

func (o *obj) int32(key string) int32 {
	v, ok := o.take(key)
	if !ok {
		return 0
	}
	s, ok := scalarText(v)
	if _, isBool := v.(bool); ok && !isBool {
		n, err := strconv.ParseInt(s, 10, 32)
		if err == nil {
			return int32(n)
		}
		if f, ferr := strconv.ParseFloat(s, 64); ferr == nil && f == math.Trunc(f) && f >= math.MinInt32 && f <= math.MaxInt32 {
			return int32(f)
		}
	}
	o.errs.Add(o.field(key), fmt.Sprintf("must be an integer from %d to %d", math.MinInt32, math.MaxInt32))
	return 0
}

func (o *obj) boolean(key string, def bool) bool {
	v, ok := o.take(key)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		o.errs.Add(o.field(key), "must be true or false")
	}
	return b
}

func (o *obj) object(key string) (map[string]any, bool) {
	v, ok := o.take(key)
	if !ok {
		return nil, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		o.errs.Add(o.field(key), "must be an object")
		return nil, false
	}
	return m, true
}

func (o *obj) list(key string) ([]any, bool) {
	v, ok := o.take(key)
	if !ok {
		return nil, false
	}
	l, ok := v.([]any)
	if !ok {
		o.errs.Add(o.field(key), "must be a list")
		return nil, false
	}
	return l, true
}

func (o *obj) sub(key string) (*obj, bool) {
	m, ok := o.object(key)
	if !ok {
		return nil, false
	}
	return newObj(o.errs, o.field(key), m), true
}

// stringMap reads a map of strings (tags, match) and validates keys and values.
func (o *obj) stringMap(key string, wildcard bool) map[string]string {
	m, ok := o.object(key)
	if !ok {
		return nil
	}
	path := o.field(key)
	if len(m) > MaxTagsPerSelector {
		o.errs.Add(path, fmt.Sprintf("has %d entries, over the limit of %d", len(m), MaxTagsPerSelector))
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := scalarText(v)
		if !ok {
			o.errs.Add(path+"["+strconv.Quote(k)+"]", "must be a string")
			continue
		}
		if err := checkTagKey(k); err != nil {
			o.errs.addErr(path, err)
			continue
		}
		if err := CheckTagValue(s, wildcard); err != nil {
			o.errs.addErr(path+"["+strconv.Quote(k)+"]", err)
			continue
		}
		out[k] = s
	}
	return out
}

func (o *obj) action(key string) Action {
	s := o.str(key)
	if s == "" {
		return ActionUnset
	}
	a, ok := parseAction(s)
	switch {
	case s == shadowDeny:
		// Read as a plain ALLOW it would silently drop the would-be deny.
		o.errs.Add(o.field(key), "AllowWithShadowDeny is the action of a from or to item (an enforced ALLOW and an "+
			"audit DENY); here write ALLOW, and a policy with mode: Audit for the would-be deny (docs/audit.md)")
	case !ok:
		o.errs.Add(o.field(key), fmt.Sprintf("%q is not ALLOW or DENY", s))
	}
	return a
}

// shadowDeny is Kuma's item action: an enforced ALLOW and an audit DENY.
const shadowDeny = "AllowWithShadowDeny"

// itemAction is a from or to item's action: an action, or Kuma's
// AllowWithShadowDeny (an ALLOW, and shadow set).
func (o *obj) itemAction(key string) (a Action, shadow bool) {
	if v, _ := o.m[key].(string); v == shadowDeny {
		o.str(key)
		return Allow, true
	}
	return o.action(key), false
}

// parseAction accepts verdict's ALLOW / DENY and Kuma's Allow / Deny spellings.
func parseAction(s string) (Action, bool) {
	switch s {
	case "ALLOW", "Allow":
		return Allow, true
	case "DENY", "Deny":
		return Deny, true
	}
	return ActionUnset, false
}

func (o *obj) name(key string, required bool) string {
	s := o.str(key)
	if s == "" {
		if required {
			o.errs.Add(o.field(key), "is required")
		}
		return ""
	}
	if err := CheckName(s); err != nil {
		o.errs.Add(o.field(key), err.Error())
	}
	return s
}

func (o *obj) meshName() string {
	_, given := o.m["mesh"]
	s := o.name("mesh", false)
	if s == "" && !given {
		return DefaultMesh
	}
	if s == "" {
		o.errs.Add(o.field("mesh"), "must not be empty")
	}
	return s
}

func (o *obj) time(key string) time.Time {
	s := o.str(key)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		o.errs.Add(o.field(key), fmt.Sprintf("%q is not an RFC 3339 time", s))
	}
	return t
}

func (o *obj) meta() Meta {
	return Meta{CreationTime: o.time("creationTime"), ModificationTime: o.time("modificationTime")}
}

// conf reads an opaque JSON object.
func (o *obj) conf(key string) Object {
	m, ok := o.object(key)
	if !ok {
		return nil
	}
	return m
}
