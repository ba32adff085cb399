package docpos

// Package docpos names problems in YAML documents by position: "file:line:column: path: why",
// the way compilers and linters name them, sorted by position. The field
// paths come from the engine's decoder, from a test suite's loader, or from
// the server (a BadRequest's "resources[2].policy.sources[0]"); the
// positions come from the YAML nodes of the file the document was read from.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
	yaml "go.yaml.in/yaml/v3"
)

// Problem is one error found in a document.
type Problem struct {
	File      string // as given on the command line; "stdin" for -
	Order     int    // the file's place among the files read (sorting)
	Line, Col int    // 0 when not known
	Path      string // "documents[2].sources[0].match"; empty: the document or the file
	Msg       string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
			if p.Col > 0 {
				fmt.Fprintf(&b, ":%d", p.Col)
			}
		}
		b.WriteString(": ")
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Problems sort by file, then position.
type Problems []Problem

func (ps Problems) Sort() {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.Order != b.Order {
			return a.Order < b.Order
		}
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
}

// Print writes the Problems, sorted, one a line after indent.
func (ps Problems) Print(w io.Writer, indent string) {
	ps.Sort()
	for _, p := range ps {
		fmt.Fprintf(w, "%s%s\n", indent, p)
	}
}

func (ps Problems) Strings() []string {
	ps.Sort()
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// Source is a file's text and its documents' YAML nodes.
type Source struct {
	name  string
	order int
	data  []byte
	docs  []*yaml.Node // each document's top node, counted as resource.ParseYAML counts them
}

// NewSource parses data's nodes (a stream that does not parse keeps the
// documents read before the error).
func NewSource(name string, order int, data []byte) *Source {
	s := &Source{name: name, order: order, data: data}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			return s
		}
		if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" {
			continue // skipped by the engine's reader too
		}
		s.docs = append(s.docs, doc.Content[0])
	}
}

// At is the problem at path ("sources[0].match") of document doc: the
// position of the deepest node the path reaches.
func (s *Source) At(doc int, path, msg string) Problem {
	p := Problem{File: s.name, Order: s.order, Path: documentPath(doc, path), Msg: msg}
	if doc >= 0 && doc < len(s.docs) {
		n := locate(s.docs[doc], path)
		p.Line, p.Col = n.Line, n.Column
	}
	return p
}

func documentPath(doc int, path string) string {
	if doc < 0 {
		return path
	}
	d := fmt.Sprintf("documents[%d]", doc)
	switch {
	case path == "":
		return d
	case strings.HasPrefix(path, "["):
		return d + path
	}
	return d + "." + path
}

var (
	pathPart = regexp.MustCompile(`^([^.\[]+)?((?:\[(?:\d+|"(?:[^"\\]|\\.)*")\])*)`)
	indexes  = regexp.MustCompile(`\[(\d+|"(?:[^"\\]|\\.)*")\]`)
)

// locate returns the node a path reaches in n: a key's node for a field
// (where its name is written), an element for an index; the deepest one
// reached when the path goes on where the document does not.
func locate(n *yaml.Node, path string) *yaml.Node {
	at := n
	for path != "" && n != nil {
		m := pathPart.FindStringSubmatch(path)
		if m == nil || m[0] == "" {
			return at
		}
		path = strings.TrimPrefix(path[len(m[0]):], ".")
		if m[1] != "" {
			key, val := field(n, m[1])
			if key == nil {
				return at
			}
			at, n = key, val
		}
		for _, idx := range indexes.FindAllStringSubmatch(m[2], -1) {
			if strings.HasPrefix(idx[1], `"`) { // a map key: tags["app"]
				k, err := strconv.Unquote(idx[1])
				if err != nil {
					return at
				}
				key, val := field(n, k)
				if key == nil {
					return at
				}
				at, n = key, val
				continue
			}
			j, _ := strconv.Atoi(idx[1])
			if n.Kind != yaml.SequenceNode || j >= len(n.Content) {
				return at
			}
			n = n.Content[j]
			at = n
		}
	}
	return at
}

// field finds a key of a mapping node: the key's node and its value's.
func field(n *yaml.Node, name string) (key, val *yaml.Node) {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, nil
	}
	for k := 0; k+1 < len(n.Content); k += 2 {
		if n.Content[k].Value == name {
			return n.Content[k], n.Content[k+1]
		}
	}
	return nil, nil
}

var (
	docField  = regexp.MustCompile(`^documents\[(\d+)\](?: \(line \d+\))?\.?(.*)$`)
	lineIn    = regexp.MustCompile(`(?:^|: )line (\d+): (.*)$`)
	yamlNoise = regexp.MustCompile(`^(?:YAML: )?(?:yaml: )?(?:document \d+ \(line \d+\): )?`)
)

// DecodeProblems are the Problems of resource.DecodeYAML's error for s, each
// with its position; an error that is not a validation error is one
// Problem of the file.
func (s *Source) DecodeProblems(err error) Problems {
	var ve *resource.ValidationError
	if !errors.As(err, &ve) {
		return Problems{s.Syntax(err.Error())}
	}
	var out Problems
	for _, fe := range ve.Errors {
		if m := docField.FindStringSubmatch(fe.Field); m != nil {
			i, _ := strconv.Atoi(m[1])
			out = append(out, s.At(i, m[2], fe.Reason))
			continue
		}
		if fe.Field == "" {
			out = append(out, s.Syntax(fe.Reason))
			continue
		}
		out = append(out, Problem{File: s.name, Order: s.order, Path: fe.Field, Msg: fe.Reason})
	}
	return out
}

// Syntax is a problem of the file's text ("YAML: yaml: line 4: did not find
// expected key"): at its line, and the column where the broken construct
// begins.
func (s *Source) Syntax(msg string) Problem {
	msg = yamlNoise.ReplaceAllString(msg, "")
	p := Problem{File: s.name, Order: s.order, Msg: msg}
	m := lineIn.FindStringSubmatch(msg)
	if m == nil {
		return p
	}
	p.Line, _ = strconv.Atoi(m[1])
	p.Msg = m[2]
	p.Col = syntaxColumn(lineText(s.data, p.Line), p.Msg)
	return p
}

// lineText is line n (from 1) of data.
func lineText(data []byte, n int) string {
	lines := strings.Split(string(data), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return lines[n-1]
}

// syntaxColumn guesses the column of a YAML syntax error on a line (yaml.v3
// reports lines only): the bracket a "did not find expected ']'" opened, else
// the line's first character.
func syntaxColumn(line, msg string) int {
	for _, b := range [][2]string{{"']'", "["}, {"'}'", "{"}} {
		if strings.Contains(msg, b[0]) {
			if i := strings.Index(line, b[1]); i >= 0 {
				return i + 1
			}
		}
	}
	if i := strings.IndexFunc(line, func(r rune) bool { return r != ' ' && r != '\t' }); i >= 0 {
		return i + 1
	}
	return 1
}
