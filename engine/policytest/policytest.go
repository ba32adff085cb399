// Package policytest runs policy test suites offline, on the engine alone, like
// `opa test` (docs/suites.md). A suite is one YAML file: resources, then cases
// that decide, resolve or apply and state what they expect. verdictctl test and
// make test run suites through this package.
package policytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Outcome of one case.
type Outcome uint8

// Outcomes.
const (
	Passed Outcome = iota
	Failed
	Skipped
)

// CaseResult is the outcome of one case of a suite.
type CaseResult struct {
	File    string
	Case    string
	Outcome Outcome
	Detail  string // for a failure: what was expected and what came; for a skip: why
}

// Suite is a loaded suite file.
type Suite struct {
	File     string
	Name     string
	Snapshot *engine.Snapshot
	Cases    []Case
}

// Case is one case of a suite.
type Case struct {
	Name    string
	Decide  *engine.Request
	Resolve *engine.ResolveRequest
	Apply   []any // documents, decoded when the case runs
	Reach   *analysis.ReachRequest
	Impact  *impactCase
	Expect  resource.Object
}

// impactCase is an impact case's change (documents decoded when it runs)
// and the observed flows to replay.
type impactCase struct {
	apply  []any
	delete []resource.Key
	flows  []analysis.ObservedFlow
}

// Load reads and compiles a suite file. Offline, creation and modification are
// ordered by the documents' creationTime and modificationTime (docs/order.md);
// the resources carry no store revisions.
func Load(path string) (*Suite, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse reads a suite from data; file names it in messages. A suite that
// does not load returns every problem found, as an *resource.ValidationError
// whose field paths are the suite document's ("resources[1].sources[0]",
// "cases[3]"), so that a caller can name each one's line; a YAML syntax error
// is returned as it is.
func Parse(file string, data []byte) (*Suite, error) {
	docs, err := resource.ParseYAML(data)
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, fmt.Errorf("a suite is one YAML document, found %d", len(docs))
	}
	top, ok := docs[0].Value.(map[string]any)
	if !ok {
		return nil, errors.New("a suite is an object with name, resources and cases")
	}
	s := &Suite{File: file}
	var problems []resource.FieldError
	add := func(field, reason string) {
		problems = append(problems, resource.FieldError{Field: field, Reason: reason})
	}
	for k := range top {
		switch k {
		case "name", "resources", "cases":
		default:
			add(k, "unknown field (a suite has name, resources and cases)")
		}
	}
	s.Name, _ = top["name"].(string)
	rawResources, _ := top["resources"].([]any)
	resources := make([]resource.Resource, 0, len(rawResources))
	index := map[string]int{} // a resource's key: its index in the file
	for i, v := range rawResources {
		r, err := resource.DecodeValue(v)
		if err != nil {
			var ve *resource.ValidationError
			if !errors.As(err, &ve) {
				add(fmt.Sprintf("resources[%d]", i), err.Error())
				continue
			}
			problems = append(problems, ve.Prefixed(fmt.Sprintf("resources[%d]", i)).Errors...)
			continue
		}
		index[r.Key().String()] = i
		resources = append(resources, r)
	}
	if len(problems) == 0 {
		s.Snapshot = engine.Build(0, resources)
		for _, r := range s.Snapshot.Invalid() {
			field := r.Path
			if i, ok := index[r.Path]; ok {
				field = fmt.Sprintf("resources[%d]", i)
			}
			add(field, fmt.Sprintf("invalid resource %s: %v", r.Path, r.Err))
		}
	}
	rawCases, ok := top["cases"].([]any)
	if !ok {
		add("cases", "a list is required")
	}
	for i, v := range rawCases {
		c, err := parseCase(v)
		if err != nil {
			add(fmt.Sprintf("cases[%d]", i), err.Error())
			continue
		}
		s.Cases = append(s.Cases, c)
	}
	if len(problems) > 0 {
		sort.SliceStable(problems, func(i, j int) bool { return problems[i].Field < problems[j].Field })
		return nil, &resource.ValidationError{Errors: problems}
	}
	return s, nil
}

func parseCase(v any) (Case, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Case{}, errors.New("a case is an object")
	}
	var c Case
	c.Name, _ = m["name"].(string)
	if c.Name == "" {
		return c, errors.New("name: required")
	}
	kinds := 0
	for k, val := range m {
		switch k {
		case "name":
		case "decide":
			kinds++
			req, err := parseRequest(val, true)
			if err != nil {
				return c, fmt.Errorf("%s: decide: %w", c.Name, err)
			}
			c.Decide = &engine.Request{Mesh: req.Mesh, Type: req.Type, Source: req.Source,
				Destination: req.Destination, SourceEndpoint: req.SourceEndpoint, DestinationEndpoint: req.DestinationEndpoint,
				Protocol: req.Protocol, Port: req.Port, Explain: req.Explain}
		case "resolve":
			kinds++
			req, err := parseRequest(val, false)
			if err != nil {
				return c, fmt.Errorf("%s: resolve: %w", c.Name, err)
			}
			c.Resolve = &engine.ResolveRequest{Mesh: req.Mesh, Type: req.Type, Source: req.Source,
				Destination: req.Destination, SourceEndpoint: req.SourceEndpoint, DestinationEndpoint: req.DestinationEndpoint,
				Protocol: req.Protocol, Port: req.Port}
		case "apply":
			kinds++
			l, ok := val.([]any)
			if !ok {
				return c, fmt.Errorf("%s: apply: a list of documents is required", c.Name)
			}
			c.Apply = l
		case "reach":
			kinds++
			req, err := parseRequest(val, false)
			if err != nil {
				return c, fmt.Errorf("%s: reach: %w", c.Name, err)
			}
			r, err := reachOf(req)
			if err != nil {
				return c, fmt.Errorf("%s: reach: %w", c.Name, err)
			}
			c.Reach = r
		case "impact":
			kinds++
			ic, err := parseImpact(val)
			if err != nil {
				return c, fmt.Errorf("%s: impact: %w", c.Name, err)
			}
			c.Impact = ic
		case "expect":
			e, ok := val.(map[string]any)
			if !ok {
				return c, fmt.Errorf("%s: expect: an object is required", c.Name)
			}
			for ek := range e {
				if !expectKeys[ek] {
					return c, fmt.Errorf("%s: expect: unknown field %q", c.Name, ek)
				}
			}
			c.Expect = e
		default:
			return c, fmt.Errorf("%s: unknown field %q", c.Name, k)
		}
	}
	if kinds != 1 {
		return c, fmt.Errorf("%s: a case has exactly one of decide, resolve, apply, reach or impact", c.Name)
	}
	if c.Expect == nil {
		c.Expect = resource.Object{}
	}
	return c, nil
}

var expectKeys = map[string]bool{
	"action": true, "policy": true, "conf": true, "outbound": true, "inbound": true, "revision": true,
	"error": true, "rules": true, "status": true, "audit": true, "sourceResolution": true, "destinationResolution": true,
	"workloads": true, "outside": true, "changes": true, "flows": true,
}

type request struct {
	Mesh, Type          string
	Source, Destination resource.Tags
	// SourceEndpoint and DestinationEndpoint: a side given by reference.
	SourceEndpoint, DestinationEndpoint *inventory.Endpoint
	Protocol                            resource.Protocol
	Port                                uint32
	Explain                             bool
}

func parseRequest(v any, decide bool) (request, error) {
	var r request
	m, ok := v.(map[string]any)
	if !ok {
		return r, errors.New("an object is required")
	}
	for k, val := range m {
		var err error
		switch k {
		case "mesh":
			r.Mesh, err = text(val)
		case "type":
			r.Type, err = text(val)
		case "source":
			r.Source, r.SourceEndpoint, err = endpoint(val)
		case "destination":
			r.Destination, r.DestinationEndpoint, err = endpoint(val)
		case "protocol":
			var s string
			if s, err = text(val); err == nil {
				r.Protocol, err = resource.ParseProtocol(s)
			}
		case "port":
			n, ok := val.(json.Number)
			var p int64
			if ok {
				p, err = n.Int64()
			}
			if !ok || err != nil || p < 0 || p > 65535 {
				err = fmt.Errorf("%v is not a port", val)
			}
			r.Port = uint32(p)
		case "explain":
			if !decide {
				return r, fmt.Errorf("unknown field %q", k)
			}
			r.Explain, _ = val.(bool)
		default:
			return r, fmt.Errorf("unknown field %q", k)
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", k, err)
		}
	}
	return r, nil
}

func text(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case json.Number:
		return t.String(), nil
	}
	return "", fmt.Errorf("%v is not a string", v)
}

// endpoint reads one end of a flow: {tags: {...}} as tags, or one of
// {workload: NAME}, {address: IP}, {principal: ID}, {identity: N} as an
// endpoint by reference (several forms are kept, for Validate to refuse).
func endpoint(v any) (resource.Tags, *inventory.Endpoint, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, errors.New("an endpoint is {tags: {...}}, {workload: NAME}, {address: IP}, {principal: ID} or {identity: N}")
	}
	var ep inventory.Endpoint
	byRef := false
	for k, val := range m {
		var err error
		switch k {
		case "tags":
			ep.Tags, err = tagMap(val)
		case "workload":
			ep.Workload, err = text(val)
		case "address":
			ep.Address, err = text(val)
		case "principal":
			ep.Principal, err = text(val)
		case "identity":
			ep.Identity, err = identity(val)
		default:
			return nil, nil, fmt.Errorf("unknown field %q (an endpoint has tags, workload, address, principal or identity)", k)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", k, err)
		}
		byRef = byRef || k != "tags"
	}
	if !byRef {
		if ep.Tags == nil {
			ep.Tags = resource.Tags{}
		}
		return ep.Tags, nil, nil
	}
	return nil, &ep, nil
}

func identity(v any) (uint64, error) {
	s, err := text(v)
	if err == nil {
		var id uint64
		if id, err = strconv.ParseUint(s, 10, 64); err == nil && id != 0 {
			return id, nil
		}
	}
	return 0, fmt.Errorf("%v is not an identity (a number from 1 to 2^64-1)", v)
}

func tagMap(val any) (resource.Tags, error) {
	tm, ok := val.(map[string]any)
	if !ok && val != nil {
		return nil, errors.New("an object is required")
	}
	tags := resource.Tags{}
	for tk, tv := range tm {
		s, err := text(tv)
		if err != nil {
			if b, ok := tv.(bool); ok {
				s = fmt.Sprint(b)
			} else {
				return nil, fmt.Errorf("[%q]: %w", tk, err)
			}
		}
		tags[tk] = s
	}
	return tags, nil
}

// Run runs every case of the suite.
func (s *Suite) Run() []CaseResult {
	out := make([]CaseResult, 0, len(s.Cases))
	for _, c := range s.Cases {
		r := CaseResult{File: s.File, Case: c.Name}
		var problems []string
		switch {
		case c.Decide != nil:
			problems = s.runDecide(c)
		case c.Resolve != nil:
			problems = s.runResolve(c)
		case c.Reach != nil:
			problems = s.runReach(c)
		case c.Impact != nil:
			problems = s.runImpact(c)
		default:
			problems = s.runApply(c)
		}
		if len(problems) > 0 {
			r.Outcome = Failed
			r.Detail = strings.Join(problems, "; ")
		}
		out = append(out, r)
	}
	return out
}

// CodeName maps an error of the engine to the code name the server answers
// with: engine.CodeName's table, which server/errors.go reads too; OK for no
// error and Internal for any other.
func CodeName(err error) string {
	if err == nil {
		return "OK"
	}
	if name, ok := engine.CodeName(err); ok {
		return name
	}
	return "Internal"
}

func checkError(expect resource.Object, err error) (problems []string, done bool) {
	want, hasWant := expect["error"]
	got := CodeName(err)
	if !hasWant {
		if err != nil {
			return []string{fmt.Sprintf("expected no error, got %s: %v", got, err)}, true
		}
		return nil, false
	}
	if w, _ := want.(string); w != got {
		if err == nil {
			return []string{fmt.Sprintf("expected error %v, got success", want)}, true
		}
		return []string{fmt.Sprintf("expected error %v, got %s: %v", want, got, err)}, true
	}
	return nil, true
}

func (s *Suite) runDecide(c Case) []string {
	if err := c.Decide.Validate(); err != nil {
		p, _ := checkError(c.Expect, err)
		return p
	}
	d, err := s.Snapshot.Decide(c.Decide)
	if p, done := checkError(c.Expect, err); done {
		return p
	}
	var problems []string
	for k, want := range c.Expect {
		switch k {
		case "action":
			problems = compareField(problems, "action", want, d.Action.String())
		case "policy":
			problems = compareField(problems, "policy", want, d.Policy)
		case "revision":
			problems = compareField(problems, "revision", want, fmt.Sprint(d.Revision))
		case "conf":
			problems = compareWhole(problems, "conf", want, d.Conf)
		case "outbound":
			problems = compareSide(problems, "outbound", want, d.Outbound)
		case "inbound":
			problems = compareSide(problems, "inbound", want, d.Inbound)
		case "audit":
			problems = compareAudit(problems, want, d.Audit)
		case "sourceResolution":
			problems = compareResolution(problems, k, want, c.Decide.Mesh, d.SourceResolution)
		case "destinationResolution":
			problems = compareResolution(problems, k, want, c.Decide.Mesh, d.DestinationResolution)
		default:
			problems = append(problems, fmt.Sprintf("expect.%s does not apply to a decide case", k))
		}
	}
	sort.Strings(problems)
	return problems
}

func (s *Suite) runResolve(c Case) []string {
	res, err := s.Snapshot.Resolve(c.Resolve)
	if p, done := checkError(c.Expect, err); done {
		return p
	}
	var problems []string
	for k, want := range c.Expect {
		switch k {
		case "rules":
			problems = compareWhole(problems, "rules", want, res.Main.RuleValues())
		case "status":
			problems = compareWhole(problems, "status", want, res.Main.StatusMap())
		case "outbound":
			wm, ok := want.(map[string]any)
			if !ok {
				problems = append(problems, "expect.outbound of a resolve case is {rules, status}")
				continue
			}
			if res.Outbound == nil {
				problems = append(problems, "expected an outbound answer, got none")
				continue
			}
			for ok, ov := range wm {
				switch ok {
				case "rules":
					problems = compareWhole(problems, "outbound.rules", ov, res.Outbound.RuleValues())
				case "status":
					problems = compareWhole(problems, "outbound.status", ov, res.Outbound.StatusMap())
				default:
					problems = append(problems, fmt.Sprintf("expect.outbound.%s does not apply to a resolve case", ok))
				}
			}
		default:
			problems = append(problems, fmt.Sprintf("expect.%s does not apply to a resolve case", k))
		}
	}
	sort.Strings(problems)
	return problems
}

func (s *Suite) runApply(c Case) []string {
	var puts []resource.Resource
	var errs []resource.FieldError
	for i, v := range c.Apply {
		r, err := resource.DecodeValue(v)
		if err != nil {
			var ve *resource.ValidationError
			if errors.As(err, &ve) {
				errs = append(errs, ve.Prefixed(fmt.Sprintf("apply[%d]", i)).Errors...)
				continue
			}
			return []string{err.Error()}
		}
		puts = append(puts, r)
	}
	var err error
	if len(errs) > 0 {
		err = &resource.ValidationError{Errors: errs}
	} else {
		err = s.Snapshot.CheckApply(puts, nil)
	}
	p, done := checkError(c.Expect, err)
	if !done {
		for k := range c.Expect {
			p = append(p, fmt.Sprintf("expect.%s does not apply to an apply case", k))
		}
	}
	return p
}

func compareField(problems []string, name string, want any, got string) []string {
	w, err := text(want)
	if err != nil {
		return append(problems, fmt.Sprintf("expect.%s: %v", name, err))
	}
	if w != got {
		return append(problems, fmt.Sprintf("%s: expected %q, got %q", name, w, got))
	}
	return problems
}

func compareSide(problems []string, name string, want any, got engine.SideDecision) []string {
	wm, ok := want.(map[string]any)
	if !ok {
		return append(problems, fmt.Sprintf("expect.%s must be an object", name))
	}
	for k, v := range wm {
		var g string
		switch k {
		case "action":
			g = got.Action.String()
		case "policy":
			g = got.Policy
		case "scope":
			g = got.Scope
		case "rule":
			g = got.Rule
		case "reason":
			g = got.Reason.String()
		case "conf":
			problems = compareWhole(problems, name+".conf", v, got.Conf)
			continue
		default:
			problems = append(problems, fmt.Sprintf("expect.%s.%s is not a side field", name, k))
			continue
		}
		problems = compareField(problems, name+"."+k, v, g)
	}
	return problems
}

// compareAudit checks the shadow result (docs/audit.md): null expects none;
// an object expects one, with the fields it lists.
func compareAudit(problems []string, want any, got *engine.Audit) []string {
	if want == nil {
		if got != nil {
			return append(problems, fmt.Sprintf("audit: expected none, got %s by policy %q (%s)", got.Action, got.Policy, got.Side))
		}
		return problems
	}
	wm, ok := want.(map[string]any)
	if !ok {
		return append(problems, "expect.audit must be an object or null")
	}
	if got == nil {
		return append(problems, fmt.Sprintf("audit: expected %s, got none (the shadow decision agrees)", show(want)))
	}
	for k, v := range wm {
		var g string
		switch k {
		case "action":
			g = got.Action.String()
		case "policy":
			g = got.Policy
		case "scope":
			g = got.Scope
		case "rule":
			g = got.Rule
		case "side":
			g = got.Side
		default:
			problems = append(problems, fmt.Sprintf("expect.audit.%s is not an audit field (action, policy, scope, rule, side)", k))
			continue
		}
		problems = compareField(problems, "audit."+k, v, g)
	}
	return problems
}

// compareResolution compares the fields of a resolution the case names:
// form (tags, workload, address, principal, identity), resolvedAs (TAGS,
// WORKLOAD, EXTERNAL, PRINCIPAL_HOLDERS, KUMA_SPIFFE, UNKNOWN_PRINCIPAL,
// IDENTITY), workload, holders, identity, tags.
func compareResolution(problems []string, name string, want any, mesh string, got inventory.EndpointResolution) []string {
	wm, ok := want.(map[string]any)
	if !ok {
		return append(problems, fmt.Sprintf("expect.%s must be an object", name))
	}
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	id := got.Identity
	if id == 0 && got.Form == inventory.FormTags { // as the API answers it
		id = resource.Identity(mesh, got.Tags)
	}
	for k, v := range wm {
		var g string
		switch k {
		case "form":
			g = got.Form.String()
		case "resolvedAs":
			g = got.ResolvedAs.String()
		case "workload":
			g = got.Workload
		case "holders":
			g = strconv.Itoa(got.Holders)
		case "identity":
			g = strconv.FormatUint(id, 10)
		case "tags":
			problems = compareWhole(problems, name+".tags", v, map[string]any(tagsTree(got.Tags)))
			continue
		default:
			problems = append(problems, fmt.Sprintf("expect.%s.%s is not a resolution field", name, k))
			continue
		}
		problems = compareField(problems, name+"."+k, v, g)
	}
	return problems
}

func tagsTree(t resource.Tags) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}

func compareWhole(problems []string, name string, want, got any) []string {
	if !equalTree(want, got) {
		return append(problems, fmt.Sprintf("%s: expected %s, got %s", name, show(want), show(got)))
	}
	return problems
}

// equalTree compares generic trees; numbers compare by value, an absent object
// equals an empty one.
func equalTree(a, b any) bool {
	switch at := a.(type) {
	case map[string]any:
		bt, ok := b.(map[string]any)
		if !ok {
			return len(at) == 0 && isNilMap(b)
		}
		if len(at) != len(bt) {
			return false
		}
		for k, v := range at {
			bv, ok := bt[k]
			if !ok || !equalTree(v, bv) {
				return false
			}
		}
		return true
	case []any:
		bt, ok := b.([]any)
		if !ok || len(at) != len(bt) {
			return false
		}
		for i := range at {
			if !equalTree(at[i], bt[i]) {
				return false
			}
		}
		return true
	case json.Number:
		bn, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, ok1 := new(big.Float).SetString(at.String())
		y, ok2 := new(big.Float).SetString(bn.String())
		return ok1 && ok2 && x.Cmp(y) == 0
	case nil:
		if isNilMap(b) {
			return true
		}
		return b == nil
	}
	if isNilMap(a) {
		if bm, ok := b.(map[string]any); ok {
			return len(bm) == 0
		}
		return b == nil
	}
	return reflect.DeepEqual(a, b)
}

func isNilMap(v any) bool {
	if v == nil {
		return true
	}
	m, ok := v.(map[string]any)
	return ok && m == nil
}

func show(v any) string {
	if isNilMap(v) {
		return "{}"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Summary counts outcomes.
type Summary struct {
	Passed, Failed, Skipped int
	LoadErrors              int
}

// OK reports whether every case passed and every file loaded.
func (s Summary) OK() bool { return s.Failed == 0 && s.LoadErrors == 0 }

// RunFiles runs every suite, prints one line per failing case and per file that
// did not load, and ends with the line "N passed, M failed".
func RunFiles(w io.Writer, paths []string) Summary {
	var sum Summary
	for _, p := range paths {
		s, err := Load(p)
		if err != nil {
			sum.LoadErrors++
			fmt.Fprintf(w, "%s: did not load: %v\n", p, err)
			continue
		}
		for _, r := range s.Run() {
			switch r.Outcome {
			case Passed:
				sum.Passed++
			case Skipped:
				sum.Skipped++
			case Failed:
				sum.Failed++
				fmt.Fprintf(w, "%s: %s: %s\n", r.File, r.Case, r.Detail)
			}
		}
	}
	line := fmt.Sprintf("%d passed, %d failed", sum.Passed, sum.Failed)
	if sum.Skipped > 0 {
		line += fmt.Sprintf(", %d skipped", sum.Skipped)
	}
	if sum.LoadErrors > 0 {
		line += fmt.Sprintf(" (%d files did not load)", sum.LoadErrors)
	}
	fmt.Fprintln(w, line)
	return sum
}
