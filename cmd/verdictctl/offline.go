package main

// The commands that need no server: test, validate, fmt.

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policytest"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/docpos"
)

// suiteFiles expands directories (recursively) to their .yaml and .yml files,
// in name order; files stay as given.
func suiteFiles(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			out = append(out, a)
			continue
		}
		var found []string
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		sort.Strings(found)
		out = append(out, found...)
	}
	return out, nil
}

// testReport is the result of verdictctl test, for json and junit output.
type testReport struct {
	Passed     int          `json:"passed"`
	Failed     int          `json:"failed"`
	Skipped    int          `json:"skipped"`
	LoadErrors []testLoad   `json:"loadErrors,omitempty"`
	Cases      []testResult `json:"cases"`
}

type testLoad struct {
	File   string `json:"file"`
	Line   int    `json:"line,omitempty"`
	Column int    `json:"column,omitempty"`
	Path   string `json:"path,omitempty"`
	Error  string `json:"error"`
}

type testResult struct {
	File    string `json:"file"`
	Suite   string `json:"suite"`
	Case    string `json:"case"`
	Outcome string `json:"outcome"` // pass, fail, skip
	Detail  string `json:"detail,omitempty"`
}

func runTest(args []string, e *env) int {
	fset := newFlags("test", e)
	verbose := fset.Bool("v", false, "print every case, passed or not")
	runRE := fset.String("run", "", "run only the cases whose \"suite/case\" name matches this `REGEX`")
	var output outputFlag
	output.register(fset, "text", "json", "junit")
	output.other = map[string]func(io.Writer, any) error{"junit": func(w io.Writer, v any) error { return printJUnit(w, v.(testReport)) }}
	rest, stop, code := fset.parse(args)
	if stop {
		return code
	}
	if len(rest) == 0 {
		return fset.usage("name at least one suite file or directory")
	}
	var filter *regexp.Regexp
	if *runRE != "" {
		var err error
		if filter, err = regexp.Compile(*runRE); err != nil {
			return fset.usage("--run: %v", err)
		}
	}
	files, err := suiteFiles(rest)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl test: %v\n", err)
		return exitError
	}
	out := output.printer(e.stdout)
	var rep testReport
	var lines []string // the text report's lines, in order
	for i, f := range files {
		data, err := os.ReadFile(f)
		var s *policytest.Suite
		if err == nil {
			s, err = policytest.Parse(f, data)
		}
		if err != nil {
			for _, p := range suiteProblems(docpos.NewSource(f, i, data), err) {
				rep.LoadErrors = append(rep.LoadErrors, testLoad{File: f, Line: p.Line, Column: p.Col, Path: p.Path, Error: p.Msg})
				lines = append(lines, "did not load: "+p.String())
			}
			continue
		}
		if filter != nil {
			kept := s.Cases[:0:0]
			for _, c := range s.Cases {
				if filter.MatchString(s.Name + "/" + c.Name) {
					kept = append(kept, c)
				}
			}
			s.Cases = kept
		}
		for _, r := range s.Run() {
			tr := testResult{File: r.File, Suite: s.Name, Case: r.Case, Detail: r.Detail}
			switch r.Outcome {
			case policytest.Passed:
				rep.Passed++
				tr.Outcome = "pass"
			case policytest.Skipped:
				rep.Skipped++
				tr.Outcome = "skip"
			default:
				rep.Failed++
				tr.Outcome = "fail"
			}
			rep.Cases = append(rep.Cases, tr)
			switch {
			case tr.Outcome == "fail":
				lines = append(lines, fmt.Sprintf("FAIL %s: %s: %s", r.File, r.Case, r.Detail))
			case *verbose && tr.Outcome == "pass":
				lines = append(lines, fmt.Sprintf("PASS %s: %s", r.File, r.Case))
			case *verbose:
				lines = append(lines, fmt.Sprintf("SKIP %s: %s: %s", r.File, r.Case, r.Detail))
			}
		}
	}
	err = out.print(rep, func(w io.Writer, _ bool) error {
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
		line := fmt.Sprintf("%d passed, %d failed", rep.Passed, rep.Failed)
		if rep.Skipped > 0 {
			line += fmt.Sprintf(", %d skipped", rep.Skipped)
		}
		if n := loadFailures(rep); n > 0 {
			line += fmt.Sprintf(" (%s)", count(n, "file did not load", "files did not load"))
		}
		_, err := fmt.Fprintln(w, line)
		return err
	})
	if err != nil {
		return fail(e, "test", err, nil)
	}
	switch {
	case len(rep.LoadErrors) > 0:
		return exitError
	case rep.Failed > 0:
		return exitFailed
	}
	return exitOK
}

// loadFailures counts the files that did not load.
func loadFailures(rep testReport) int {
	files := map[string]bool{}
	for _, l := range rep.LoadErrors {
		files[l.File] = true
	}
	return len(files)
}

// suiteProblems are the docpos.Problems of a suite that did not load, each with its
// position in the file.
func suiteProblems(src *docpos.Source, err error) docpos.Problems {
	var ve *resource.ValidationError
	if !errors.As(err, &ve) {
		return docpos.Problems{src.Syntax(err.Error())}
	}
	var out docpos.Problems
	for _, fe := range ve.Errors {
		p := src.At(0, fe.Field, fe.Reason)
		p.Path = fe.Field // the suite is one document: its paths need no documents[0]
		out = append(out, p)
	}
	out.Sort()
	return out
}

// printJUnit writes the report as JUnit XML: a testsuite per file, a
// failing case with its detail, a file that did not load as an error.
func printJUnit(w io.Writer, rep testReport) error {
	type failure struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	}
	type testcase struct {
		Name      string   `xml:"name,attr"`
		Classname string   `xml:"classname,attr"`
		Failure   *failure `xml:"failure,omitempty"`
		Error     *failure `xml:"error,omitempty"`
		Skipped   *failure `xml:"skipped,omitempty"`
	}
	type testsuite struct {
		Name     string     `xml:"name,attr"`
		Tests    int        `xml:"tests,attr"`
		Failures int        `xml:"failures,attr"`
		Errors   int        `xml:"errors,attr"`
		Skipped  int        `xml:"skipped,attr"`
		Cases    []testcase `xml:"testcase"`
	}
	type testsuites struct {
		XMLName xml.Name    `xml:"testsuites"`
		Suites  []testsuite `xml:"testsuite"`
	}
	var out testsuites
	index := map[string]int{}
	suite := func(file string) *testsuite {
		i, ok := index[file]
		if !ok {
			i = len(out.Suites)
			index[file] = i
			out.Suites = append(out.Suites, testsuite{Name: file})
		}
		return &out.Suites[i]
	}
	for _, c := range rep.Cases {
		s := suite(c.File)
		tc := testcase{Name: c.Case, Classname: c.Suite}
		switch c.Outcome {
		case "fail":
			tc.Failure = &failure{Message: "failed", Text: c.Detail}
			s.Failures++
		case "skip":
			tc.Skipped = &failure{Message: c.Detail}
			s.Skipped++
		}
		s.Tests++
		s.Cases = append(s.Cases, tc)
	}
	for _, l := range rep.LoadErrors {
		s := suite(l.File)
		s.Tests++
		s.Errors++
		p := docpos.Problem{File: l.File, Line: l.Line, Col: l.Column, Path: l.Path, Msg: l.Error}
		s.Cases = append(s.Cases, testcase{Name: "load", Classname: l.File, Error: &failure{Message: "did not load", Text: p.String()}})
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func runValidate(args []string, e *env) int {
	fset := newFlags("validate", e)
	whole := fset.Bool("whole", false, "check the set as a whole too (references, conflicts), as if it were the whole store")
	var output outputFlag
	output.register(fset, "text", "json", "yaml")
	rest, stop, code := fset.parse(args)
	if stop {
		return code
	}
	if len(rest) == 0 {
		return fset.usage("name at least one file, directory or -")
	}
	items, probs, err := readResources(rest, e.stdin)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl validate: %v\n", err)
		return exitError
	}
	if len(probs) == 0 && *whole {
		puts := make([]resource.Resource, len(items))
		ops := make([]*op, len(items))
		for i, it := range items {
			puts[i] = it.res
			ops[i] = &op{key: it.res.Key(), res: it.res, from: it}
		}
		if err := engine.Empty().CheckApply(puts, nil); err != nil {
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				return fail(e, "validate", err, nil)
			}
			for _, fe := range ve.Errors {
				p := origin(ops)(fe.Field)
				p.Msg = fe.Reason
				probs = append(probs, p)
			}
		}
	}
	res := validateReport{Valid: len(probs) == 0, Resources: len(items), Errors: probs.Strings()}
	err = output.printer(e.stdout).print(res, func(w io.Writer, _ bool) error {
		if len(probs) == 0 {
			_, err := fmt.Fprintf(w, "%s valid\n", count(len(items), "resource", "resources"))
			return err
		}
		return nil
	})
	if err != nil {
		return fail(e, "validate", err, nil)
	}
	if len(probs) > 0 {
		if output.printer(e.stdout).forPeople() {
			fmt.Fprintln(e.stderr, "verdictctl validate: invalid:")
			probs.Print(e.stderr, "  ")
		}
		return exitFailed
	}
	return exitOK
}

// validateReport is validate's answer as a document.
type validateReport struct {
	Valid     bool     `json:"valid"`
	Resources int      `json:"resources"`
	Errors    []string `json:"errors,omitempty"`
}

func runFmt(args []string, e *env) int {
	fset := newFlags("fmt", e)
	write := fset.Bool("w", false, "rewrite the files in place")
	check := fset.Bool("check", false, "list the files fmt would change; exit 1 if any")
	rest, stop, code := fset.parse(args)
	if stop {
		return code
	}
	if len(rest) == 0 {
		return fset.usage("name at least one file, directory or -")
	}
	if *write && *check {
		return fset.usage("-w and --check exclude each other")
	}
	// A directory is read as apply -f reads one: its .yaml, .yml and .json
	// files.
	files, err := inputFiles(rest)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl fmt: %v\n", err)
		return exitError
	}
	if *write && slices.Contains(files, "-") {
		return fset.usage("-w cannot rewrite stdin")
	}
	differ := false
	var probs docpos.Problems
	for i, f := range files {
		var data []byte
		var err error
		if f == "-" {
			data, err = io.ReadAll(e.stdin)
		} else {
			data, err = os.ReadFile(f)
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl fmt: %v\n", err)
			return exitError
		}
		name := f
		if f == "-" {
			name = "stdin"
		}
		out, err := formatYAML(data)
		if err != nil {
			probs = append(probs, docpos.NewSource(name, i, data).Syntax(err.Error()))
			continue
		}
		switch {
		case *check:
			if !bytes.Equal(out, data) {
				differ = true
				fmt.Fprintln(e.stdout, f)
			}
		case *write:
			if !bytes.Equal(out, data) {
				if err := os.WriteFile(f, out, 0o644); err != nil {
					fmt.Fprintf(e.stderr, "verdictctl fmt: %v\n", err)
					return exitError
				}
			}
		default:
			if _, err := e.stdout.Write(out); err != nil {
				return exitError
			}
		}
	}
	if len(probs) > 0 {
		fmt.Fprintln(e.stderr, "verdictctl fmt: not YAML:")
		probs.Print(e.stderr, "  ")
		return exitError
	}
	if differ {
		return exitFailed
	}
	return exitOK
}
