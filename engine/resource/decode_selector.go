package resource

// Selectors, expressions and port lists (docs/resources.md, "Selectors").

import (
	"fmt"
	"strconv"
	"strings"
)

func decodeSelectors(o *obj, key string, required bool) []Selector {
	l, ok := o.list(key)
	if !ok {
		if required {
			o.errs.Add(o.field(key), "is required: a list of selectors ([{}] selects every workload)")
		}
		return nil
	}
	if len(l) == 0 {
		o.errs.Add(o.field(key), "must hold at least one selector ([{}] selects every workload)")
		return nil
	}
	if len(l) > MaxSelectors {
		o.errs.Add(o.field(key), fmt.Sprintf("has %d selectors, over the limit of %d", len(l), MaxSelectors))
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
			o.errs.Add(path, "must be an object")
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
			o.errs.Add(o.field("expressions"), fmt.Sprintf("has %d expressions, over the limit of %d", len(l), MaxTagsPerSelector))
			l = nil
		}
		for i, v := range l {
			path := fmt.Sprintf("%s[%d]", o.field("expressions"), i)
			m, ok := v.(map[string]any)
			if !ok {
				o.errs.Add(path, "must be an object")
				continue
			}
			eo := newObj(o.errs, path, m)
			e := Expression{Key: eo.str("key")}
			if e.Key == "" {
				o.errs.Add(eo.field("key"), "is required")
			} else if err := checkTagKey(e.Key); err != nil {
				o.errs.addErr(eo.field("key"), err)
			}
			op := eo.str("operator")
			idx := indexOf(operatorNames, op)
			if idx < 0 {
				o.errs.Add(eo.field("operator"), fmt.Sprintf("%q is not In, NotIn, Exists, DoesNotExist, Prefix or CIDR", op))
			} else {
				e.Operator = Operator(idx)
			}
			if vl, ok := eo.list("values"); ok {
				if len(vl) > MaxValuesPerExpression {
					o.errs.Add(eo.field("values"), fmt.Sprintf("has %d values, over the limit of %d", len(vl), MaxValuesPerExpression))
					vl = nil
				}
				for j, vv := range vl {
					vs, ok := scalarText(vv)
					vpath := fmt.Sprintf("%s[%d]", eo.field("values"), j)
					if !ok {
						o.errs.Add(vpath, "must be a string")
						continue
					}
					if err := CheckTagValue(vs, false); err != nil {
						o.errs.addErr(vpath, err)
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

func checkExpression(errs *FieldErrors, path string, e Expression) {
	switch e.Operator {
	case OpExists, OpDoesNotExist:
		if len(e.Values) > 0 {
			errs.Add(path+".values", fmt.Sprintf("must be empty for %s", e.Operator))
		}
	default:
		if len(e.Values) == 0 {
			errs.Add(path+".values", fmt.Sprintf("needs at least one value for %s", e.Operator))
		}
	}
	if e.Operator == OpCIDR {
		for j, v := range e.Values {
			if _, err := ParseCIDR(v); err != nil {
				errs.Add(fmt.Sprintf("%s.values[%d]", path, j), err.Error())
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
		o.errs.Add(o.field("ports"), fmt.Sprintf("has %d entries, over the limit of %d", len(l), MaxPortEntries))
		return nil
	}
	out := make([]PortEntry, 0, len(l))
	for i, v := range l {
		path := fmt.Sprintf("%s[%d]", o.field("ports"), i)
		m, ok := v.(map[string]any)
		if !ok {
			o.errs.Add(path, "must be an object")
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
			o.errs.Add(po.field("protocol"), fmt.Sprintf("%q is not TCP, UDP, ICMP or ANY", p))
		}
		pe.Ports = po.str("ports")
		if pe.Ports != "" {
			r, err := ParsePortRanges(pe.Ports)
			if err != nil {
				o.errs.Add(po.field("ports"), err.Error())
			}
			pe.Ranges = r
		}
		po.finish()
		out = append(out, pe)
	}
	return out
}

// ParsePortRanges reads "80,443,8000-8100".
func ParsePortRanges(s string) ([]PortRange, error) {
	var out []PortRange
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
		out = append(out, PortRange{Lo: l, Hi: h})
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
