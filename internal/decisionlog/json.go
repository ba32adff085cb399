package decisionlog

import (
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The JSON-lines encoder: a record in the proto3 JSON mapping, as protojson
// writes it — lowerCamelCase names, 64-bit integers as strings, a timestamp
// in RFC 3339 (UTC, 0, 3, 6 or 9 fractional digits), fields at their zero
// value left out, map keys sorted — written by hand: protojson's reflection
// took three times as long per record and 55 allocations, and the log's one
// goroutine must keep up with a server's decisions. TestJSONMatchesProtojson
// holds it to protojson on any record; TestJSONKnowsTheSchema fails when the
// message gains a field this encoder does not write. One difference: a string
// that is not valid UTF-8 (protojson refuses the whole record) has its bad
// bytes written as U+FFFD — a record is never lost to one.

// jsonFields lists, per message, the fields appendRecord writes;
// TestJSONKnowsTheSchema compares it with the descriptors.
var jsonFields = map[string][]string{
	"verdict.v1.DecisionRecord": {"time", "rpc", "revision", "mesh", "type", "source", "destination", "protocol", "port",
		"action", "policy", "outbound", "inbound", "audit", "caller", "latency_ns", "repeats", "truncated", "dropped"},
	"verdict.v1.RecordEndpoint": {"tags", "workload", "address", "principal", "identity"},
	"verdict.v1.RecordSide":     {"action", "policy", "scope", "rule", "reason"},
	"verdict.v1.RecordAudit":    {"action", "policy", "scope", "rule", "side"},
	"verdict.v1.RecordCaller":   {"address", "identity"},
	"verdict.v1.RecordsDropped": {"mesh", "reason", "count"},
}

// appendRecord appends r as one JSON object (no newline).
func appendRecord(b []byte, r *Record) []byte {
	o := jsonObject{b: append(b, '{')}
	if t := r.Time; t != nil {
		o.key("time")
		o.b = appendTime(o.b, t.GetSeconds(), t.GetNanos())
	}
	o.str("rpc", r.Rpc)
	o.int64("revision", r.Revision)
	o.str("mesh", r.Mesh)
	o.str("type", r.Type)
	if r.Source != nil {
		o.key("source")
		o.b = appendEndpoint(o.b, r.Source)
	}
	if r.Destination != nil {
		o.key("destination")
		o.b = appendEndpoint(o.b, r.Destination)
	}
	o.str("protocol", r.Protocol)
	if r.Port != 0 {
		o.key("port")
		o.b = strconv.AppendUint(o.b, uint64(r.Port), 10)
	}
	o.str("action", r.Action)
	o.str("policy", r.Policy)
	if r.Outbound != nil {
		o.key("outbound")
		o.b = appendSide(o.b, r.Outbound)
	}
	if r.Inbound != nil {
		o.key("inbound")
		o.b = appendSide(o.b, r.Inbound)
	}
	if a := r.Audit; a != nil {
		o.key("audit")
		s := jsonObject{b: append(o.b, '{')}
		s.str("action", a.Action)
		s.str("policy", a.Policy)
		s.str("scope", a.Scope)
		s.str("rule", a.Rule)
		s.str("side", a.Side)
		o.b = append(s.b, '}')
	}
	if c := r.Caller; c != nil {
		o.key("caller")
		s := jsonObject{b: append(o.b, '{')}
		s.str("address", c.Address)
		s.str("identity", c.Identity)
		o.b = append(s.b, '}')
	}
	o.int64("latencyNs", r.LatencyNs)
	o.int64("repeats", r.Repeats)
	if r.Truncated {
		o.key("truncated")
		o.b = append(o.b, "true"...)
	}
	if len(r.Dropped) > 0 {
		o.key("dropped")
		o.b = append(o.b, '[')
		for i, d := range r.Dropped {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			s := jsonObject{b: append(o.b, '{')}
			s.str("mesh", d.GetMesh())
			s.str("reason", d.GetReason())
			s.int64("count", d.GetCount())
			o.b = append(s.b, '}')
		}
		o.b = append(o.b, ']')
	}
	return append(o.b, '}')
}

func appendEndpoint(b []byte, e *verdictv1.RecordEndpoint) []byte {
	o := jsonObject{b: append(b, '{')}
	if len(e.Tags) > 0 {
		o.key("tags")
		var buf [16]string
		keys := buf[:0]
		for k := range e.Tags {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		o.b = append(o.b, '{')
		for i, k := range keys {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.b = appendString(o.b, k)
			o.b = append(o.b, ':')
			o.b = appendString(o.b, e.Tags[k])
		}
		o.b = append(o.b, '}')
	}
	o.str("workload", e.Workload)
	o.str("address", e.Address)
	o.str("principal", e.Principal)
	if e.Identity != 0 {
		o.key("identity")
		o.b = append(o.b, '"')
		o.b = strconv.AppendUint(o.b, e.Identity, 10)
		o.b = append(o.b, '"')
	}
	return append(o.b, '}')
}

func appendSide(b []byte, s *verdictv1.RecordSide) []byte {
	o := jsonObject{b: append(b, '{')}
	o.str("action", s.Action)
	o.str("policy", s.Policy)
	o.str("scope", s.Scope)
	o.str("rule", s.Rule)
	o.str("reason", s.Reason)
	return append(o.b, '}')
}

// jsonObject writes the members of an object, commas between them.
type jsonObject struct {
	b    []byte
	more bool
}

// key starts a member (its name is plain ASCII).
func (o *jsonObject) key(name string) {
	if o.more {
		o.b = append(o.b, ',')
	}
	o.more = true
	o.b = append(o.b, '"')
	o.b = append(o.b, name...)
	o.b = append(o.b, '"', ':')
}

// str writes a string member unless it is empty.
func (o *jsonObject) str(name, v string) {
	if v == "" {
		return
	}
	o.key(name)
	o.b = appendString(o.b, v)
}

// int64 writes a 64-bit member as a string, unless it is 0.
func (o *jsonObject) int64(name string, v int64) {
	if v == 0 {
		return
	}
	o.key(name)
	o.b = append(o.b, '"')
	o.b = strconv.AppendInt(o.b, v, 10)
	o.b = append(o.b, '"')
}

// appendTime writes a timestamp as protojson does: RFC 3339 in UTC, with 0,
// 3, 6 or 9 fractional digits.
func appendTime(b []byte, secs int64, nanos int32) []byte {
	b = append(b, '"')
	b = time.Unix(secs, 0).UTC().AppendFormat(b, "2006-01-02T15:04:05")
	if nanos != 0 {
		var buf [10]byte
		frac := strconv.AppendInt(buf[:0], int64(nanos)+1e9, 10)[1:] // nine digits
		switch {
		case nanos%1e6 == 0:
			frac = frac[:3]
		case nanos%1e3 == 0:
			frac = frac[:6]
		}
		b = append(append(b, '.'), frac...)
	}
	return append(b, 'Z', '"')
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string, escaping as protojson does: '"',
// '\\' and the control characters (\b, \f, \n, \r, \t by name); a byte that
// is not UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			b = append(b, s[start:i]...)
			b = append(b, "\ufffd"...)
			i++
			start = i
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
