package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// compactJSON is one line of protobuf JSON.
func compactJSON(m proto.Message) string {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err.Error()
	}
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return string(b)
	}
	return out.String()
}

// resourceDoc is a resource's document as a generic tree.
func resourceDoc(r *verdictv1.Resource) (any, error) {
	var m proto.Message
	switch {
	case r.GetMesh() != nil:
		m = r.GetMesh()
	case r.GetScope() != nil:
		m = r.GetScope()
	case r.GetWorkload() != nil:
		m = r.GetWorkload()
	default:
		m = r.GetPolicy()
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	return resource.ParseJSON(b)
}

// keyOrder puts a document's identifying fields first.
var keyOrder = func() map[string]int {
	m := map[string]int{}
	for i, k := range []string{"kind", "mesh", "name", "type", "scope", "parent", "priority", "rank", "selectors", "tags", "addresses", "principal",
		"sources", "destinations", "targetRef", "from", "to", "ports", "action", "catchAll", "catchAllTypes",
		"enforced", "conf", "defaults", "overrides", "unset", "defaultAction", "unenforcedAction", "tieBreak",
		"itemOrder", "types", "creationTime", "modificationTime"} {
		m[k] = i
	}
	return m
}()

// yamlNode builds a YAML node from a generic tree: identifying keys first,
// the others sorted; numbers as numbers.
func yamlNode(v any) *yaml.Node {
	switch t := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			oi, iok := keyOrder[keys[i]]
			oj, jok := keyOrder[keys[j]]
			switch {
			case iok && jok:
				return oi < oj
			case iok != jok:
				return iok
			}
			return keys[i] < keys[j]
		})
		n := &yaml.Node{Kind: yaml.MappingNode}
		for _, k := range keys {
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, yamlNode(t[k]))
		}
		return n
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode}
		for _, e := range t {
			n.Content = append(n.Content, yamlNode(e))
		}
		if len(t) > 0 && isScalarList(t) {
			n.Style = yaml.FlowStyle
		}
		return n
	case json.Number:
		tag := "!!float"
		if _, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
			tag = "!!int"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: t.String()}
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(t)}
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	case string:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: t}
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Value: fmt.Sprint(v)}
}

func isScalarList(l []any) bool {
	for _, e := range l {
		switch e.(type) {
		case map[string]any, []any:
			return false
		}
	}
	return true
}

// printYAMLDoc writes one YAML document, after optional comment lines.
func printYAMLDoc(w io.Writer, v any, comments ...string) error {
	n := yamlNode(v)
	if len(comments) > 0 {
		n.HeadComment = strings.Join(comments, "\n")
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return err
	}
	return enc.Close()
}

// printStored writes a stored resource as YAML with its key, revisions and
// error as comments (the document itself can be applied back).
func printStored(w io.Writer, sr *verdictv1.StoredResource) error {
	comments := []string{fmt.Sprintf("key: %s  createRevision: %d  modRevision: %d", sr.GetKey(), sr.GetCreateRevision(), sr.GetModRevision())}
	if sr.GetResource().GetWorkload() != nil {
		comments = append(comments, fmt.Sprintf("identity: %d", sr.GetIdentity()))
	}
	if sr.GetError() != "" {
		comments = append(comments, "INVALID: "+sr.GetError())
	}
	if cs := sr.GetConditions(); len(cs) > 0 {
		// the policy's standing conditions (docs/lint.md), each with why
		comments = append(comments, "conditions: "+strings.Join(cs, ", "))
		for _, c := range cs {
			comments = append(comments, fmt.Sprintf("  %s: %s", c, sr.GetConditionMessages()[c]))
		}
	}
	if sr.GetResource() == nil {
		_, err := fmt.Fprintf(w, "# %s\n# (the stored value does not decode)\n", strings.Join(comments, "\n# "))
		return err
	}
	doc, err := resourceDoc(sr.GetResource())
	if err != nil {
		return err
	}
	return printYAMLDoc(w, doc, comments...)
}

// outputFlag is -o/--output: one of the formats the command knows (the
// first is its default); any other value is a usage error (exit 2) found
// before any call. The printer it makes is the only place that tells the
// formats apart.
type outputFlag struct {
	value   string
	allowed []string
	// other formats of one command (test's junit): how to write its value.
	other map[string]func(w io.Writer, v any) error
}

func (o *outputFlag) register(fs *flagSet, allowed ...string) {
	o.value, o.allowed = allowed[0], allowed
	fs.Func("output", "`FORMAT` of the answer: "+strings.Join(allowed, ", ")+" (default "+allowed[0]+")", func(s string) error {
		if s == "table" && slices.Contains(allowed, "text") { // list's former name for text
			s = "text"
		}
		if !slices.Contains(allowed, s) {
			return fmt.Errorf("not one of %s", strings.Join(allowed, ", "))
		}
		o.value = s
		return nil
	})
	fs.alias("output", "o")
}

// printer makes the printer of the chosen format, writing to w.
func (o *outputFlag) printer(w io.Writer) *printer {
	return &printer{w: w, format: o.value, other: o.other[o.value]}
}

// printer writes a command's answer in the format -o chose. A command hands
// it a value and a text renderer: json is the value's JSON (a message's
// protobuf JSON, any other value's JSON with 64-bit integers as strings, as
// protobuf JSON writes them), yaml the same tree as YAML, text and wide the
// renderer's output.
type printer struct {
	w      io.Writer
	format string
	other  func(w io.Writer, v any) error
}

// textFunc renders an answer for people; wide asks for more columns.
type textFunc func(w io.Writer, wide bool) error

// forPeople reports whether the output is text for people rather than a
// document for programs: progress and hints are shown only then.
func (p *printer) forPeople() bool { return p.format == "text" || p.format == "wide" }

// wide reports whether -o wide was asked for.
func (p *printer) wide() bool { return p.format == "wide" }

// print writes one answer.
func (p *printer) print(v any, text textFunc) error {
	switch {
	case p.other != nil:
		return p.other(p.w, v)
	case p.format == "json":
		b, err := marshal(v)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err = p.w.Write(out.Bytes())
		return err
	case p.format == "yaml":
		if d, ok := v.(ownYAML); ok {
			return d.yaml(p.w)
		}
		t, err := tree(v)
		if err != nil {
			return err
		}
		return printYAMLDoc(p.w, t)
	}
	return text(p.w, p.wide())
}

// record writes one message of a stream: a JSON line, a YAML document after
// "---", or the renderer's text.
func (p *printer) record(v any, text textFunc) error {
	switch p.format {
	case "json":
		b, err := marshal(v)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if err := json.Compact(&out, b); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err = p.w.Write(out.Bytes())
		return err
	case "yaml":
		if _, err := fmt.Fprintln(p.w, "---"); err != nil {
			return err
		}
	}
	return p.print(v, text)
}

// ownYAML is a value whose YAML is its own (re-appliable documents with
// comments), not the tree of its JSON.
type ownYAML interface{ yaml(w io.Writer) error }

// marshal is a value's JSON: protobuf JSON for a message, encoding/json for
// any other value (whose 64-bit integers carry the ",string" option).
func marshal(v any) ([]byte, error) {
	if m, ok := v.(proto.Message); ok {
		return protojson.Marshal(m)
	}
	return json.Marshal(v)
}

// tree is a value as a generic tree (objects, lists, json.Number).
func tree(v any) (any, error) {
	b, err := marshal(v)
	if err != nil {
		return nil, err
	}
	return resource.ParseJSON(b)
}

// selectorText renders a selector as "k=v,k2 in (a,b)" (kubectl's form);
// an empty selector is "*" (any workload).
func selectorText(s *verdictv1.Selector) string {
	var parts []string
	keys := make([]string, 0, len(s.GetMatch()))
	for k := range s.GetMatch() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k+"="+s.GetMatch()[k])
	}
	for _, e := range s.GetExpressions() {
		vals := "(" + strings.Join(e.GetValues(), ",") + ")"
		switch e.GetOperator() {
		case "In":
			parts = append(parts, e.GetKey()+" in "+vals)
		case "NotIn":
			parts = append(parts, e.GetKey()+" notin "+vals)
		case "Exists":
			parts = append(parts, e.GetKey())
		case "DoesNotExist":
			parts = append(parts, "!"+e.GetKey())
		default: // Prefix, CIDR
			parts = append(parts, e.GetKey()+" "+strings.ToLower(e.GetOperator())+" "+vals)
		}
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, ",")
}

// selectorsText renders selectors of which any one matches.
func selectorsText(ss []*verdictv1.Selector) string {
	if len(ss) == 0 {
		return "*"
	}
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = selectorText(s)
	}
	return strings.Join(parts, " | ")
}
