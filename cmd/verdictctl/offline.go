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
	"github.com/verdictpdp/verdict/internal/apiconv"
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
	File  string `json:"file"`
	Error string `json:"error"`
}

type testResult struct {
	File    string `json:"file"`
	Suite   string `json:"suite"`
	Case    string `json:"case"`
	Outcome string `json:"outcome"` // pass, fail, skip
	Detail  string `json:"detail,omitempty"`
}

func runTest(args []string, e *env) int {
	fset := newFlags("test", "FILE|DIR...", "Runs policy test suites offline on the engine (docs/suites.md): no server.\n"+
		"Exit code 0 when every case passed, 1 when a case failed, 3 when a file did not load.", e.stderr)
	verbose := fset.Bool("v", false, "print every case, passed or not")
	runRE := fset.String("run", "", "run only the cases whose \"suite/case\" name matches this regular expression")
	var output outputFlag
	output.register(fset, "text", "text", "json", "junit")
	rest, code := parse(fset, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) == 0 {
		fmt.Fprintln(e.stderr, "verdictctl test: name at least one suite file or directory")
		return exitUsage
	}
	var filter *regexp.Regexp
	if *runRE != "" {
		var err error
		if filter, err = regexp.Compile(*runRE); err != nil {
			fmt.Fprintf(e.stderr, "verdictctl test: --run: %v\n", err)
			return exitUsage
		}
	}
	files, err := suiteFiles(rest)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl test: %v\n", err)
		return exitError
	}
	var rep testReport
	for _, f := range files {
		s, err := policytest.Load(f)
		if err != nil {
			rep.LoadErrors = append(rep.LoadErrors, testLoad{File: f, Error: err.Error()})
			if output.value == "text" {
				fmt.Fprintf(e.stdout, "%s: did not load: %v\n", f, err)
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
			if output.value != "text" {
				continue
			}
			switch {
			case tr.Outcome == "fail":
				fmt.Fprintf(e.stdout, "FAIL %s: %s: %s\n", r.File, r.Case, r.Detail)
			case *verbose && tr.Outcome == "pass":
				fmt.Fprintf(e.stdout, "PASS %s: %s\n", r.File, r.Case)
			case *verbose:
				fmt.Fprintf(e.stdout, "SKIP %s: %s: %s\n", r.File, r.Case, r.Detail)
			}
		}
	}
	switch output.value {
	case "json":
		if err := printValue(e.stdout, "json", rep); err != nil {
			return fail(e, "test", err, nil)
		}
	case "junit":
		if err := printJUnit(e.stdout, rep); err != nil {
			return fail(e, "test", err, nil)
		}
	default:
		line := fmt.Sprintf("%d passed, %d failed", rep.Passed, rep.Failed)
		if rep.Skipped > 0 {
			line += fmt.Sprintf(", %d skipped", rep.Skipped)
		}
		if n := len(rep.LoadErrors); n > 0 {
			line += fmt.Sprintf(" (%d files did not load)", n)
		}
		fmt.Fprintln(e.stdout, line)
	}
	switch {
	case len(rep.LoadErrors) > 0:
		return exitError
	case rep.Failed > 0:
		return exitFailed
	}
	return exitOK
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
		s.Cases = append(s.Cases, testcase{Name: "load", Classname: l.File, Error: &failure{Message: "did not load", Text: l.Error}})
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
	fset := newFlags("validate", "FILE|DIR|-...", "Checks documents offline with the server's decoder (resource.Decode*): every field of\n"+
		"every document. --whole also checks the set as a store of its own: references between its\n"+
		"resources, conflicts (a reference to a resource only the server holds then fails).", e.stderr)
	whole := fset.Bool("whole", false, "check the set as a whole too (references, conflicts), as if it were the whole store")
	var output outputFlag
	output.register(fset, "text", "text", "json", "yaml")
	rest, code := parse(fset, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) == 0 {
		fmt.Fprintln(e.stderr, "verdictctl validate: name at least one file, directory or -")
		return exitUsage
	}
	items, err := readResources(rest, e.stdin)
	var problems []string
	if err != nil {
		problems = strings.Split(err.Error(), "\n")
	} else if *whole {
		puts := make([]resource.Resource, len(items))
		ops := make([]*op, len(items))
		for i, it := range items {
			puts[i] = it.res
			ops[i] = &op{key: it.res.Key(), res: it.res, origin: it.origin}
		}
		if err := engine.Empty().CheckApply(puts, nil); err != nil {
			problems = append(problems, validationLines(err, origin(ops))...)
		}
	}
	if output.value != "text" {
		res := map[string]any{"valid": len(problems) == 0, "resources": len(items)}
		if len(problems) > 0 {
			res["errors"] = problems
		}
		if err := printValue(e.stdout, output.value, res); err != nil {
			return fail(e, "validate", err, nil)
		}
	} else if len(problems) > 0 {
		fmt.Fprintln(e.stderr, "verdictctl validate: invalid:")
		for _, p := range problems {
			fmt.Fprintf(e.stderr, "  %s\n", p)
		}
	} else {
		fmt.Fprintf(e.stdout, "%d resources valid\n", len(items))
	}
	if len(problems) > 0 {
		return exitError
	}
	return exitOK
}

// validationLines lists a validation error's fields, mapped through origin.
func validationLines(err error, origin func(string) string) []string {
	var ve *resource.ValidationError
	if !errors.As(err, &ve) {
		return []string{err.Error()}
	}
	out := make([]string, len(ve.Errors))
	for i, fe := range ve.Errors {
		out[i] = origin(fe.Error())
	}
	return out
}

func runFmt(args []string, e *env) int {
	fset := newFlags("fmt", "FILE|DIR|-...", "Prints documents in verdict's canonical native form (identifying fields first, the rest\n"+
		"sorted), as the server decodes them: Kuma documents come out in the native form. -w rewrites\n"+
		"the files; --check lists the files that are not canonical and exits 1.", e.stderr)
	write := fset.Bool("w", false, "rewrite the files in place")
	check := fset.Bool("check", false, "list files not in canonical form; exit 1 if any")
	rest, code := parse(fset, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) == 0 {
		fmt.Fprintln(e.stderr, "verdictctl fmt: name at least one file, directory or -")
		return exitUsage
	}
	var files []string
	for _, a := range rest {
		if a == "-" {
			files = append(files, a)
			continue
		}
		fs, err := suiteFiles([]string{a})
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl fmt: %v\n", err)
			return exitError
		}
		files = append(files, fs...)
	}
	if *write && slices.Contains(files, "-") {
		fmt.Fprintln(e.stderr, "verdictctl fmt: -w cannot rewrite stdin")
		return exitUsage
	}
	differ := false
	for _, f := range files {
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
		out, err := canonical(data)
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl fmt: %s: %v\n", f, err)
			return exitError
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
	if differ {
		return exitFailed
	}
	return exitOK
}

// canonical decodes documents and writes them back in the native form.
func canonical(data []byte) ([]byte, error) {
	rs, err := resource.DecodeYAML(data)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for i, r := range rs {
		if i > 0 {
			buf.WriteString("---\n")
		}
		pb, err := apiconv.ResourceToProto(r)
		if err != nil {
			return nil, err
		}
		doc, err := resourceDoc(pb)
		if err != nil {
			return nil, err
		}
		if err := printYAMLDoc(&buf, doc); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
