package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DecodeYAML reads every document of a YAML or JSON stream (SPEC section 3) and
// validates each on its own. Errors name the document ("documents[2]") and the
// field. Resources are returned in stream order; a stream with any invalid
// document returns the valid ones and a *ValidationError for the others.
func DecodeYAML(data []byte) ([]Resource, error) {
	docs, err := ParseYAML(data)
	if err != nil {
		return nil, invalid("", err.Error())
	}
	var out []Resource
	var errs errList
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
	return out, errs.err()
}

// DecodeJSON reads one resource from JSON: the form of etcd values and of the
// API's resources.
func DecodeJSON(data []byte) (Resource, error) {
	v, err := ParseJSON(data)
	if err != nil {
		return nil, invalid("", err.Error())
	}
	return DecodeValue(v)
}

// DecodeValue decodes and validates one resource from a generic tree (see
// ParseYAML). Kuma universal-format documents are normalized first: a document
// with type and no kind is a Policy, spec is unwrapped, an item's default is read
// as its action and conf, labels are ignored.
func DecodeValue(v any) (Resource, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, invalid("", "a resource must be an object")
	}
	var errs errList
	m = normalizeKuma(m, &errs)
	if err := errs.err(); err != nil {
		return nil, err
	}
	o := newObj(&errs, "", m)
	kindText := o.str("kind")
	kind, ok := ParseKind(kindText)
	if !ok {
		if kindText == "" {
			errs.add("kind", "is required: Mesh, Scope or Policy (or a Kuma policy with type)")
		} else {
			errs.add("kind", fmt.Sprintf("%q is not Mesh, Scope or Policy", kindText))
		}
		return nil, errs.err()
	}
	var r Resource
	switch kind {
	case KindMesh:
		r = decodeMesh(o)
	case KindScope:
		r = decodeScope(o)
	case KindPolicy:
		r = decodePolicy(o)
	}
	o.finish()
	if err := errs.err(); err != nil {
		return nil, err
	}
	if n := encodedSize(r); n > MaxResourceBytes {
		return nil, invalid("", fmt.Sprintf("the resource is %d bytes encoded, over the limit of %d", n, MaxResourceBytes))
	}
	return r, nil
}

// normalizeKuma rewrites a Kuma universal-format document into verdict's form.
func normalizeKuma(m map[string]any, errs *errList) map[string]any {
	_, hasKind := m["kind"]
	_, hasType := m["type"]
	_, hasSpec := m["spec"]
	_, hasLabels := m["labels"]
	if !hasSpec && !hasLabels && (hasKind || !hasType) && !itemsHaveDefault(m) {
		return m
	}
	out := make(map[string]any, len(m)+4)
	for k, v := range m {
		out[k] = v
	}
	if !hasKind && hasType {
		out["kind"] = "Policy"
	}
	delete(out, "labels")
	if hasSpec {
		delete(out, "spec")
		spec, ok := m["spec"].(map[string]any)
		if !ok && m["spec"] != nil {
			errs.add("spec", "must be an object")
		}
		for k, v := range spec {
			if _, dup := out[k]; dup {
				errs.add("spec."+k, "is also given outside spec")
				continue
			}
			out[k] = v
		}
	}
	for _, list := range []string{"from", "to"} {
		items, ok := out[list].([]any)
		if !ok {
			continue
		}
		newItems := make([]any, len(items))
		for i, it := range items {
			newItems[i] = it
			im, ok := it.(map[string]any)
			if !ok {
				continue
			}
			def, has := im["default"]
			if !has {
				continue
			}
			path := fmt.Sprintf("%s[%d]", list, i)
			if _, a := im["action"]; a {
				errs.add(path+".default", "is given with action; use one")
			}
			if _, c := im["conf"]; c {
				errs.add(path+".default", "is given with conf; use one")
			}
			ni := make(map[string]any, len(im)+1)
			for k, v := range im {
				if k != "default" {
					ni[k] = v
				}
			}
			dm, ok := def.(map[string]any)
			if !ok && def != nil {
				errs.add(path+".default", "must be an object")
			}
			conf := make(Object, len(dm))
			for k, v := range dm {
				if k == "action" {
					ni["action"] = v
					continue
				}
				conf[k] = v
			}
			if len(conf) > 0 {
				ni["conf"] = conf
			}
			newItems[i] = ni
		}
		out[list] = newItems
	}
	return out
}

func itemsHaveDefault(m map[string]any) bool {
	for _, list := range []string{"from", "to"} {
		items, _ := m[list].([]any)
		for _, it := range items {
			if im, ok := it.(map[string]any); ok {
				if _, has := im["default"]; has {
					return true
				}
			}
		}
	}
	return false
}

// obj reads the fields of one object and reports the ones never read as unknown.
type obj struct {
	errs *errList
	path string
	m    map[string]any
	used map[string]struct{}
}

func newObj(errs *errList, path string, m map[string]any) *obj {
	return &obj{errs: errs, path: path, m: m, used: make(map[string]struct{}, len(m))}
}

func (o *obj) field(key string) string { return joinPath(o.path, key) }

func (o *obj) take(key string) (any, bool) {
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
		o.errs.add(o.field(k), "unknown field")
	}
}

func (o *obj) str(key string) string {
	v, ok := o.take(key)
	if !ok {
		return ""
	}
	s, ok := scalarText(v)
	if !ok {
		o.errs.add(o.field(key), "must be a string")
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
	o.errs.add(o.field(key), fmt.Sprintf("must be an integer from %d to %d", math.MinInt32, math.MaxInt32))
	return 0
}

func (o *obj) boolean(key string, def bool) bool {
	v, ok := o.take(key)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		o.errs.add(o.field(key), "must be true or false")
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
		o.errs.add(o.field(key), "must be an object")
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
		o.errs.add(o.field(key), "must be a list")
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
		o.errs.add(path, fmt.Sprintf("has %d entries, over the limit of %d", len(m), MaxTagsPerSelector))
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := scalarText(v)
		if !ok {
			o.errs.add(path+"["+strconv.Quote(k)+"]", "must be a string")
			continue
		}
		if err := checkTagKey(k); err != nil {
			o.errs.add(path, err.Error())
			continue
		}
		if err := checkTagValue(s, wildcard); err != nil {
			o.errs.add(path+"["+strconv.Quote(k)+"]", err.Error())
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
	if !ok {
		o.errs.add(o.field(key), fmt.Sprintf("%q is not ALLOW or DENY", s))
	}
	return a
}

// parseAction accepts verdict's ALLOW / DENY and Kuma's Allow / Deny spellings;
// Kuma's AllowWithShadowDeny allows (it only logs a would-be deny).
func parseAction(s string) (Action, bool) {
	switch s {
	case "ALLOW", "Allow", "AllowWithShadowDeny":
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
			o.errs.add(o.field(key), "is required")
		}
		return ""
	}
	if err := checkName(s); err != nil {
		o.errs.add(o.field(key), err.Error())
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
		o.errs.add(o.field("mesh"), "must not be empty")
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
		o.errs.add(o.field(key), fmt.Sprintf("%q is not an RFC 3339 time", s))
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

func decodeMesh(o *obj) *Mesh {
	m := &Mesh{Name: o.name("name", true)}
	m.DefaultAction = o.action("defaultAction")
	m.UnenforcedAction = o.action("unenforcedAction")
	if s := o.str("tieBreak"); s != "" {
		i := indexOf(tieBreakNames, s)
		if i < 0 {
			o.errs.add(o.field("tieBreak"), fmt.Sprintf("%q is not Name, NewestCreated or NewestModified", s))
		} else {
			m.TieBreak = TieBreak(i)
		}
	}
	if s := o.str("itemOrder"); s != "" {
		i := indexOf(itemOrderNames, s)
		if i < 0 {
			o.errs.add(o.field("itemOrder"), fmt.Sprintf("%q is not FirstWins or LastWins", s))
		} else {
			m.ItemOrder = ItemOrder(i)
		}
	}
	if types, ok := o.object("types"); ok {
		m.Types = make(map[string]TypeSettings, len(types))
		for t, v := range types {
			path := o.field("types") + "[" + strconv.Quote(t) + "]"
			if err := checkName(t); err != nil {
				o.errs.add(path, "type name: "+err.Error())
				continue
			}
			tm, ok := v.(map[string]any)
			if !ok {
				o.errs.add(path, "must be an object")
				continue
			}
			to := newObj(o.errs, path, tm)
			var ts TypeSettings
			if s := to.str("combine"); s != "" {
				i := indexOf(combineNames, s)
				if i < 0 {
					o.errs.add(to.field("combine"), fmt.Sprintf("%q is not FirstMatch or DenyOverrides", s))
				} else {
					ts.Combine = Combine(i)
				}
			}
			ts.DefaultAction = to.action("defaultAction")
			ts.UnenforcedAction = to.action("unenforcedAction")
			to.finish()
			m.Types[t] = ts
		}
	}
	m.Meta = o.meta()
	return m
}

func decodeScope(o *obj) *Scope {
	s := &Scope{Mesh: o.meshName(), Name: o.name("name", true), Enforced: true}
	s.Parent = o.name("parent", false)
	if s.Parent != "" && s.Parent == s.Name {
		o.errs.add(o.field("parent"), "a scope cannot be its own parent")
	}
	s.Priority = o.int32("priority")
	s.Selectors = decodeSelectors(o, "selectors", true)
	s.CatchAll = o.action("catchAll")
	if l, ok := o.list("catchAllTypes"); ok {
		if len(l) == 0 {
			o.errs.add(o.field("catchAllTypes"), "must name at least one type (leave it out for [TrafficPermission]; leave catchAll out for none)")
		}
		s.CatchAllTypes = make([]string, 0, len(l))
		for i, v := range l {
			t, ok := scalarText(v)
			path := fmt.Sprintf("%s[%d]", o.field("catchAllTypes"), i)
			if !ok {
				o.errs.add(path, "must be a string")
				continue
			}
			if err := checkName(t); err != nil {
				o.errs.add(path, err.Error())
				continue
			}
			s.CatchAllTypes = append(s.CatchAllTypes, t)
		}
	}
	s.Enforced = o.boolean("enforced", true)
	s.Meta = o.meta()
	return s
}

func decodeSelectors(o *obj, key string, required bool) []Selector {
	l, ok := o.list(key)
	if !ok {
		if required {
			o.errs.add(o.field(key), "is required: a list of selectors ([{}] selects every workload)")
		}
		return nil
	}
	if len(l) == 0 {
		o.errs.add(o.field(key), "must hold at least one selector ([{}] selects every workload)")
		return nil
	}
	if len(l) > MaxSelectors {
		o.errs.add(o.field(key), fmt.Sprintf("has %d selectors, over the limit of %d", len(l), MaxSelectors))
		return nil
	}
	out := make([]Selector, 0, len(l))
	for i, v := range l {
		path := fmt.Sprintf("%s[%d]", o.field(key), i)
		m, ok := v.(map[string]any)
		if v == nil {
			m, ok = map[string]any{}, true
		}
		if !ok {
			o.errs.add(path, "must be an object")
			continue
		}
		out = append(out, decodeSelector(newObj(o.errs, path, m)))
	}
	return out
}

func decodeSelector(o *obj) Selector {
	var s Selector
	s.Match = o.stringMap("match", true)
	if l, ok := o.list("expressions"); ok {
		if len(l) > MaxTagsPerSelector {
			o.errs.add(o.field("expressions"), fmt.Sprintf("has %d expressions, over the limit of %d", len(l), MaxTagsPerSelector))
			l = nil
		}
		for i, v := range l {
			path := fmt.Sprintf("%s[%d]", o.field("expressions"), i)
			m, ok := v.(map[string]any)
			if !ok {
				o.errs.add(path, "must be an object")
				continue
			}
			eo := newObj(o.errs, path, m)
			e := Expression{Key: eo.str("key")}
			if e.Key == "" {
				o.errs.add(eo.field("key"), "is required")
			} else if err := checkTagKey(e.Key); err != nil {
				o.errs.add(eo.field("key"), err.Error())
			}
			op := eo.str("operator")
			idx := indexOf(operatorNames, op)
			if idx < 0 {
				o.errs.add(eo.field("operator"), fmt.Sprintf("%q is not In, NotIn, Exists, DoesNotExist, Prefix or CIDR", op))
			} else {
				e.Operator = Operator(idx)
			}
			if vl, ok := eo.list("values"); ok {
				if len(vl) > MaxValuesPerExpression {
					o.errs.add(eo.field("values"), fmt.Sprintf("has %d values, over the limit of %d", len(vl), MaxValuesPerExpression))
					vl = nil
				}
				for j, vv := range vl {
					vs, ok := scalarText(vv)
					vpath := fmt.Sprintf("%s[%d]", eo.field("values"), j)
					if !ok {
						o.errs.add(vpath, "must be a string")
						continue
					}
					if err := checkTagValue(vs, false); err != nil {
						o.errs.add(vpath, err.Error())
						continue
					}
					e.Values = append(e.Values, vs)
				}
			}
			eo.finish()
			if idx >= 0 {
				checkExpression(o.errs, path, e)
			}
			s.Expressions = append(s.Expressions, e)
		}
	}
	o.finish()
	return s
}

func checkExpression(errs *errList, path string, e Expression) {
	switch e.Operator {
	case OpExists, OpDoesNotExist:
		if len(e.Values) > 0 {
			errs.add(path+".values", fmt.Sprintf("must be empty for %s", e.Operator))
		}
	default:
		if len(e.Values) == 0 {
			errs.add(path+".values", fmt.Sprintf("needs at least one value for %s", e.Operator))
		}
	}
	if e.Operator == OpCIDR {
		for j, v := range e.Values {
			if _, err := parseCIDR(v); err != nil {
				errs.add(fmt.Sprintf("%s.values[%d]", path, j), err.Error())
			}
		}
	}
}

func decodePorts(o *obj) []PortEntry {
	l, ok := o.list("ports")
	if !ok {
		return nil
	}
	if len(l) > MaxPortEntries {
		o.errs.add(o.field("ports"), fmt.Sprintf("has %d entries, over the limit of %d", len(l), MaxPortEntries))
		return nil
	}
	out := make([]PortEntry, 0, len(l))
	for i, v := range l {
		path := fmt.Sprintf("%s[%d]", o.field("ports"), i)
		m, ok := v.(map[string]any)
		if !ok {
			o.errs.add(path, "must be an object")
			continue
		}
		po := newObj(o.errs, path, m)
		var pe PortEntry
		switch p := strings.ToUpper(po.str("protocol")); p {
		case "", "ANY":
		case "TCP":
			pe.Protocol = TCP
		case "UDP":
			pe.Protocol = UDP
		case "ICMP":
			pe.Protocol = ICMP
		default:
			o.errs.add(po.field("protocol"), fmt.Sprintf("%q is not TCP, UDP, ICMP or ANY", p))
		}
		pe.Ports = po.str("ports")
		if pe.Ports != "" {
			r, err := parsePortRanges(pe.Ports)
			if err != nil {
				o.errs.add(po.field("ports"), err.Error())
			}
			pe.ranges = r
		}
		po.finish()
		out = append(out, pe)
	}
	return out
}

// parsePortRanges reads "80,443,8000-8100".
func parsePortRanges(s string) ([]portRange, error) {
	var out []portRange
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		l, err := parsePort(lo)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", part, err)
		}
		h := l
		if isRange {
			if h, err = parsePort(hi); err != nil {
				return nil, fmt.Errorf("%q: %v", part, err)
			}
			if h < l {
				return nil, fmt.Errorf("range %q ends below its start", part)
			}
		}
		out = append(out, portRange{lo: l, hi: h})
		if len(out) > MaxPortRanges {
			return nil, fmt.Errorf("more than %d port ranges", MaxPortRanges)
		}
	}
	return out, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port from 1 to 65535", s)
	}
	return uint16(n), nil
}

func decodeTargetRef(o *obj) TargetRef {
	var t TargetRef
	kind := o.str("kind")
	switch kind {
	case "Mesh":
		t.Kind = TargetMesh
	case "MeshSubset":
		t.Kind = TargetMeshSubset
	case "Service", "MeshService":
		t.Kind = TargetService
	case "ServiceSubset", "MeshServiceSubset":
		t.Kind = TargetServiceSubset
	case "Proxy", "Dataplane":
		t.Kind = TargetProxy
	case "":
		o.errs.add(o.field("kind"), "is required: Mesh, MeshSubset, Service, ServiceSubset or Proxy")
	default:
		o.errs.add(o.field("kind"), fmt.Sprintf("%q is not Mesh, MeshSubset, Service, ServiceSubset or Proxy", kind))
	}
	t.Name = o.str("name")
	t.Tags = o.stringMap("tags", false)
	o.finish()
	if kind == "" {
		return t
	}
	switch t.Kind {
	case TargetMesh, TargetMeshSubset:
		if t.Name != "" {
			o.errs.add(o.field("name"), fmt.Sprintf("must be empty for kind %s", t.Kind))
		}
	default:
		if t.Name == "" {
			o.errs.add(o.field("name"), fmt.Sprintf("is required for kind %s", t.Kind))
		} else if err := checkTagValue(t.Name, false); err != nil {
			o.errs.add(o.field("name"), err.Error())
		}
	}
	switch t.Kind {
	case TargetMesh, TargetService, TargetProxy:
		if len(t.Tags) > 0 {
			o.errs.add(o.field("tags"), fmt.Sprintf("must be empty for kind %s", t.Kind))
		}
	}
	return t
}

func decodeItems(o *obj, key string) []Item {
	l, ok := o.list(key)
	if !ok {
		return nil
	}
	if len(l) > MaxItems {
		o.errs.add(o.field(key), fmt.Sprintf("has %d items, over the limit of %d", len(l), MaxItems))
		return nil
	}
	out := make([]Item, 0, len(l))
	for i, v := range l {
		path := fmt.Sprintf("%s[%d]", o.field(key), i)
		m, ok := v.(map[string]any)
		if !ok {
			o.errs.add(path, "must be an object")
			continue
		}
		io := newObj(o.errs, path, m)
		var it Item
		if tr, ok := io.sub("targetRef"); ok {
			it.TargetRef = decodeTargetRef(tr)
		} else {
			o.errs.add(io.field("targetRef"), "is required")
		}
		it.Action = io.action("action")
		it.Conf = io.conf("conf")
		io.finish()
		out = append(out, it)
	}
	return out
}

func decodeBlock(o *obj, key string) *Block {
	bo, ok := o.sub(key)
	if !ok {
		return nil
	}
	b := &Block{}
	switch s := bo.str("strategy"); s {
	case "", "atomic":
	case "merge":
		b.Strategy = Merge
	default:
		o.errs.add(bo.field("strategy"), fmt.Sprintf("%q is not atomic or merge", s))
	}
	b.When = bo.str("when")
	if b.When != "" {
		p, err := compileWhen(b.When)
		if err != nil {
			o.errs.add(bo.field("when"), err.Error())
		}
		b.when = p
	}
	b.Rules = bo.conf("rules")
	if b.Rules == nil {
		o.errs.add(bo.field("rules"), "is required: an object of named rules")
	}
	bo.finish()
	return b
}

func decodePolicy(o *obj) *Policy {
	p := &Policy{Mesh: o.meshName(), Name: o.name("name", true)}
	_, typeGiven := o.m["type"]
	p.Type = o.name("type", false)
	if p.Type == "" {
		if typeGiven {
			o.errs.add(o.field("type"), "must not be empty")
		}
		p.Type = DefaultType
	}
	p.Scope = o.name("scope", false)
	switch r := o.str("rank"); r {
	case "", "Default":
	case "Absolute":
		p.Rank = RankAbsolute
	default:
		o.errs.add(o.field("rank"), fmt.Sprintf("%q is not Default or Absolute", r))
	}
	p.Priority = o.int32("priority")
	_, hasSources := o.m["sources"]
	_, hasDestinations := o.m["destinations"]
	if hasSources || hasDestinations {
		p.Sources = decodeSelectors(o, "sources", true)
		p.Destinations = decodeSelectors(o, "destinations", true)
	}
	p.Ports = decodePorts(o)
	p.Action = o.action("action")
	p.Conf = o.conf("conf")
	if tr, ok := o.sub("targetRef"); ok {
		t := decodeTargetRef(tr)
		p.TargetRef = &t
	}
	p.From = decodeItems(o, "from")
	p.To = decodeItems(o, "to")
	p.Defaults = decodeBlock(o, "defaults")
	p.Overrides = decodeBlock(o, "overrides")
	if l, ok := o.list("unset"); ok {
		for i, v := range l {
			s, ok := scalarText(v)
			path := fmt.Sprintf("%s[%d]", o.field("unset"), i)
			if !ok || s == "" {
				o.errs.add(path, "must be a rule name")
				continue
			}
			p.Unset = append(p.Unset, s)
		}
	}
	p.Meta = o.meta()
	checkPolicyForm(o, p, hasSources || hasDestinations)
	return p
}

// checkPolicyForm validates what a policy's fields mean together.
func checkPolicyForm(o *obj, p *Policy, sd bool) {
	tr := p.TargetRef != nil
	switch {
	case sd && tr:
		o.errs.add(o.field("targetRef"), "a policy uses sources/destinations or targetRef, not both")
	case !sd && !tr:
		o.errs.add("", "a policy needs sources and destinations, or a targetRef")
	}
	if sd {
		if len(p.From) > 0 || len(p.To) > 0 {
			o.errs.add(o.field("from"), "from/to items need a targetRef policy, not sources/destinations")
		}
	}
	if tr {
		if p.Scope != "" {
			o.errs.add(o.field("scope"), "a targetRef policy names no scope: its targetRef is its attachment")
		}
		if p.Action != ActionUnset {
			o.errs.add(o.field("action"), "a targetRef policy sets the action on each from/to item")
		}
		if len(p.Ports) > 0 && !p.hasItems() {
			o.errs.add(o.field("ports"), "ports restrict rules; a targetRef policy without from/to items has none")
		}
	}
	if p.hasItems() && p.hasBlocks() {
		o.errs.add(o.field("defaults"), "from/to items and defaults/overrides blocks cannot be mixed")
	}
	if p.hasItems() && p.Conf != nil {
		o.errs.add(o.field("conf"), "a policy with from/to items carries its conf on each item")
	}
	if p.Conf != nil && p.hasBlocks() {
		o.errs.add(o.field("conf"), "conf is an atomic defaults block; use conf or defaults/overrides, not both")
	}
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
