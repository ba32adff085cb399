package main

import (
	"bytes"
	"encoding/json"
	"flag"
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

// printJSON writes a message as indented protobuf JSON. (protojson's own
// spacing is deliberately unstable; encoding/json re-indents it, field order kept.)
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

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

// outputFlag is -o/--output, refused unless one of the formats the command
// knows (a usage error, exit 2).
type outputFlag struct {
	value   string
	allowed []string
}

func (o *outputFlag) register(fs *flag.FlagSet, def string, allowed ...string) {
	o.value, o.allowed = def, allowed
	set := func(s string) error {
		if s == "table" && slices.Contains(allowed, "text") { // list's former name for text
			s = "text"
		}
		if !slices.Contains(allowed, s) {
			return fmt.Errorf("%q is not one of %s", s, strings.Join(allowed, ", "))
		}
		o.value = s
		return nil
	}
	usage := "output: " + strings.Join(allowed, ", ") + " (default " + def + ")"
	fs.Func("o", usage, set)
	fs.Func("output", usage, set)
}

// structured reports whether the output is a document (json or yaml).
func (o *outputFlag) structured() bool { return o.value == "json" || o.value == "yaml" }

// printMessage writes a message as indented JSON or as YAML.
func printMessage(w io.Writer, format string, m proto.Message) error {
	if format == "json" {
		return printJSON(w, m)
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	doc, err := resource.ParseJSON(b)
	if err != nil {
		return err
	}
	return printYAMLDoc(w, doc)
}

// printValue writes a plain value (maps, slices, strings, numbers) as
// indented JSON or as YAML.
func printValue(w io.Writer, format string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if format == "json" {
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err = w.Write(out.Bytes())
		return err
	}
	doc, err := resource.ParseJSON(b)
	if err != nil {
		return err
	}
	return printYAMLDoc(w, doc)
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
