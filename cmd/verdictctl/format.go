package main

// verdictctl fmt: a layout-only formatter. It reads the YAML nodes (comments
// included) and writes them back, changing only what docs/cli.md ("fmt")
// lists: indentation, quoting and list style. Document order, each
// document's form (a Kuma document stays Kuma), key order, comments and
// blank lines are kept; what a decoder reads is unchanged (a test holds every
// formatted document to decode as the original does).

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// blankMark stands for a blank line while the nodes are written: a head
// comment the writer puts on its own line, turned back into a blank line.
const blankMark = "#verdictctl-fmt:blank-line"

// formatYAML lays out a YAML stream; a JSON document (starting with '{' or
// '[') is re-indented as JSON.
func formatYAML(data []byte) ([]byte, error) {
	if t := bytes.TrimSpace(data); len(t) > 0 && (t[0] == '{' || t[0] == '[') && json.Valid(t) {
		var out bytes.Buffer
		if err := json.Indent(&out, t, "", "  "); err != nil {
			return nil, err
		}
		out.WriteByte('\n')
		return out.Bytes(), nil
	}
	lines := strings.Split(string(data), "\n")
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	pads := map[string]string{}
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if doc.Kind == yaml.DocumentNode && len(doc.Content) == 0 {
			continue // an empty document: nothing to write
		}
		restyle(&doc, lines, false, pads)
		if err := enc.Encode(&doc); err != nil {
			return nil, err
		}
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	out := strings.Split(finish(buf.String(), pads), "\n")
	// A stream that opens with a separator (after its first comments)
	// keeps it: the writer puts none before the first document.
	if i := firstCode(lines); i >= 0 && strings.HasPrefix(lines[i], "---") {
		if j := firstCode(out); j >= 0 && !strings.HasPrefix(out[j], "---") {
			out = append(out[:j], append([]string{"---"}, out[j:]...)...)
		}
	}
	return []byte(strings.Join(out, "\n")), nil
}

// firstCode is the index of the first line that is neither blank nor a
// comment; -1 when there is none.
func firstCode(lines []string) int {
	for i, l := range lines {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return i
		}
	}
	return -1
}

// restyle sets the styles fmt normalizes and marks the blank lines to keep.
// pads collects each line comment's spacing as written, to restore it.
func restyle(n *yaml.Node, lines []string, inFlow bool, pads map[string]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			restyle(c, lines, false, pads)
		}
		return
	case yaml.ScalarNode:
		unquote(n, inFlow)
	case yaml.SequenceNode, yaml.MappingNode:
		flow := n.Style&yaml.FlowStyle != 0
		switch {
		case flow && spansLines(n):
			// yaml.v3 writes a flow collection on one line: one the author
			// wrapped is written as a block instead.
			n.Style &^= yaml.FlowStyle
			flow = false
		case n.Kind == yaml.SequenceNode && !flow && scalarItems(n):
			n.Style |= yaml.FlowStyle
			flow = true
		}
		step := 1
		if n.Kind == yaml.MappingNode {
			step = 2
		}
		for i, c := range n.Content {
			// (A collection's first element on the collection's own line is
			// its parent's to mark.)
			if !flow && i%step == 0 && c.Line != n.Line && blankBefore(lines, c.Line) {
				if c.HeadComment == "" {
					c.HeadComment = blankMark
				} else {
					c.HeadComment = blankMark + "\n" + c.HeadComment
				}
			}
			restyle(c, lines, flow, pads)
		}
	}
	if n.LineComment != "" && n.Line > 0 && n.Line <= len(lines) {
		line := lines[n.Line-1]
		if i := strings.LastIndex(line, n.LineComment); i > 0 {
			before := line[:i]
			code := strings.TrimRight(before, " \t")
			pads[strings.TrimSpace(code)+"\x00"+n.LineComment] = before[len(code):]
		}
	}
}

// unquote drops quotes a string does not need; one that needs them keeps the
// ones written (the writer adds quotes where it must).
func unquote(n *yaml.Node, inFlow bool) {
	if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 || n.Tag != "!!str" || n.Value == "" {
		return
	}
	if needsQuotes(n.Value, inFlow) {
		return
	}
	n.Style &^= yaml.SingleQuotedStyle | yaml.DoubleQuotedStyle
}

// needsQuotes: the writer would not write the string plain where it
// stands (a block, or a flow collection), or plain it would read as another
// type.
func needsQuotes(s string, inFlow bool) bool {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	want := s
	if inFlow {
		n = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle, Content: []*yaml.Node{n}}
		want = "[" + s + "]"
	}
	b, err := yaml.Marshal(n)
	return err != nil || strings.TrimSuffix(string(b), "\n") != want
}

// spansLines: a flow collection written over more than one line.
func spansLines(n *yaml.Node) bool {
	last := n
	for len(last.Content) > 0 {
		last = last.Content[len(last.Content)-1]
	}
	return last.Line > n.Line
}

// scalarItems: a sequence of plain values, none with a comment (a comment
// keeps its item on a line of its own).
func scalarItems(n *yaml.Node) bool {
	if len(n.Content) == 0 {
		return false
	}
	for _, c := range n.Content {
		if c.Kind != yaml.ScalarNode || c.HeadComment != "" || c.LineComment != "" || c.FootComment != "" ||
			c.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 || strings.Contains(c.Value, "\n") {
			return false
		}
	}
	return true
}

// blankBefore: the line above line (comments skipped) is blank.
func blankBefore(lines []string, line int) bool {
	for i := line - 2; i >= 0; i-- {
		t := strings.TrimSpace(lines[i])
		switch {
		case t == "":
			return true
		case strings.HasPrefix(t, "#"):
			continue
		}
		return false
	}
	return false
}

// finish turns blank marks back into blank lines and restores the spacing
// before line comments.
func finish(s string, pads map[string]string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	for _, l := range lines {
		if strings.TrimSpace(l) == blankMark {
			out = append(out, "")
			continue
		}
		for j := strings.Index(l, " #"); j > 0; {
			code, comment := l[:j], l[j+1:]
			if pad, ok := pads[strings.TrimSpace(code)+"\x00"+comment]; ok {
				l = code + pad + comment
				break
			}
			k := strings.Index(l[j+1:], " #")
			if k < 0 {
				break
			}
			j += 1 + k
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
