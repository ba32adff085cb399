package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
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
	return engine.ParseJSON(b)
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
