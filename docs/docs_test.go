// Package docs_test holds the reference in docs/ (and the README's API
// list) to what the repository has: every RPC of proto/verdict/v1, read from
// the generated Go package's descriptors, and every suite file of testdata/.
package docs_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/verdictpdp/verdict/proto/verdict/v1" // registers verdict.v1's files
)

var codeSpan = regexp.MustCompile("`([^`]+)`")

// apiMethods is every RPC of the proto package verdict.v1, by service name.
func apiMethods(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	protoregistry.GlobalFiles.RangeFilesByPackage("verdict.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				out[string(sd.Name())] = append(out[string(sd.Name())], string(sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(out) == 0 {
		t.Fatal("no service registered for verdict.v1")
	}
	return out
}

// apiTable reads the service table at the top of docs/api.md: per service
// (the first cell), the names in code spans of its RPC cells.
func apiTable(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, line := range readLines(t, "api.md") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		svc := codeSpan.FindStringSubmatch(cells[1])
		if svc == nil {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[2], -1) {
			out[svc[1]] = append(out[svc[1]], m[1])
		}
	}
	return out
}

// readmeAPIList reads the README's list under "## The API": per service (the
// item's first code span), the names in code spans of the whole item.
func readmeAPIList(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	in, svc := false, ""
	for _, line := range readLines(t, "../README.md") {
		switch {
		case strings.HasPrefix(line, "## "):
			in, svc = line == "## The API", ""
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "- "):
			svc = ""
			if m := codeSpan.FindStringSubmatch(line); m != nil {
				svc = m[1]
			}
		case !strings.HasPrefix(line, "  "):
			svc = "" // the item ended
		}
		if svc == "" {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			out[svc] = append(out[svc], m[1])
		}
	}
	return out
}

// TestEveryRPCDocumented: each RPC of verdict.v1 is in its service's row of
// docs/api.md's table and in its service's item of the README's API list.
func TestEveryRPCDocumented(t *testing.T) {
	t.Parallel()
	methods := apiMethods(t)
	for _, doc := range []struct {
		name   string
		listed map[string][]string
	}{
		{"docs/api.md's service table", apiTable(t)},
		{"the README's API list", readmeAPIList(t)},
	} {
		t.Run(doc.name, func(t *testing.T) {
			for svc, ms := range methods {
				for _, m := range ms {
					if !slices.Contains(doc.listed[svc], m) {
						t.Errorf("%s.%s is missing from %s", svc, m, doc.name)
					}
				}
			}
		})
	}
}

// TestEverySuiteListed: each suite file under testdata/ is named in a row of
// docs/suites.md's table of the repository's suites, and every file named
// there exists.
func TestEverySuiteListed(t *testing.T) {
	t.Parallel()
	var files []string
	err := filepath.WalkDir("../testdata", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, strings.TrimPrefix(filepath.ToSlash(p), "../"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no suite file under testdata/")
	}
	var listed []string
	in := false
	for _, line := range readLines(t, "suites.md") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## The suites in this repository"
			continue
		}
		if cells := strings.Split(line, "|"); in && len(cells) >= 3 {
			for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
				listed = append(listed, m[1])
			}
		}
	}
	for _, f := range files {
		if !slices.Contains(listed, f) {
			t.Errorf("%s is missing from docs/suites.md's table", f)
		}
	}
	for _, f := range listed {
		if !slices.Contains(files, f) {
			t.Errorf("docs/suites.md's table names %s, which is no suite file", f)
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
