package main

// reach, matrix and impact: the analysis service (docs/analysis.md).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// runReach is `verdictctl reach`: one end of the flows, --dst-… (who can
// reach it) or --src-… (what it can reach).
func runReach(ctx context.Context, args []string, e *env) int {
	fs := newFlags("reach", e)
	var ff flowFlags
	ff.register(fs)
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	if err := ff.check(); err != nil {
		return fs.usage("%v", err)
	}
	src, srcGiven, err := ff.src.endpoint()
	if err != nil {
		return fs.usage("%v", err)
	}
	dst, dstGiven, err := ff.dst.endpoint()
	if err != nil {
		return fs.usage("%v", err)
	}
	req := &verdictv1.ReachRequest{Mesh: ff.mesh, Type: ff.typ, Protocol: ff.proto, Port: ff.port, MinRevision: ff.minRev,
		AtRevision: ff.past.rev, AtTime: ff.past.atTime()}
	switch {
	case srcGiven && dstGiven:
		return fs.usage("give one end: --dst-… (who can reach it) or --src-… (what it can reach), not both")
	case dstGiven:
		req.Endpoint, req.Direction = dst, verdictv1.ReachDirection_REACH_DIRECTION_TO
	case srcGiven:
		req.Endpoint, req.Direction = src, verdictv1.ReachDirection_REACH_DIRECTION_FROM
	default:
		return fs.usage("name one end: --dst-workload NAME (who can reach it) or --src-workload NAME (what it can reach), or another form")
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "reach", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	stream, err := verdictv1.NewAnalysisServiceClient(conn).Reach(cctx, req)
	if err != nil {
		return fail(e, "reach", err, nil)
	}
	all := &verdictv1.ReachResponse{}
	note, waited := working(e, ff.output.printer(e.stdout), "reach")
	for {
		page, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			waited()
			return fail(e, "reach", err, nil)
		}
		note(count(len(all.Entries)+len(page.GetEntries()), "entry", "entries"))
		if all.Revision == 0 {
			all.Revision, all.Endpoint, all.Notes = page.GetRevision(), page.GetEndpoint(), page.GetNotes()
		}
		all.Entries = append(all.Entries, page.GetEntries()...)
	}
	waited()
	err = ff.output.printer(e.stdout).print(all, func(w io.Writer, wide bool) error {
		printReach(w, req, all, wide)
		return nil
	})
	if err != nil {
		return fail(e, "reach", err, nil)
	}
	return exitOK
}

// flowText is a protocol and a port as a person reads them.
func flowText(proto string, port uint32) string {
	switch {
	case proto == "" && port == 0:
		return "with no protocol or port"
	case port == 0:
		return "on " + proto
	case proto == "":
		return fmt.Sprintf("on port %d", port)
	}
	return fmt.Sprintf("on %s %d", proto, port)
}

func endpointWord(ep *verdictv1.Endpoint) string {
	tags, ref := apiconv.Endpoint(ep)
	if ref == nil {
		return apiconv.EndpointText(endpointOf(tags))
	}
	return apiconv.EndpointText(*ref)
}

func printReach(w io.Writer, req *verdictv1.ReachRequest, r *verdictv1.ReachResponse, wide bool) {
	what := "Who can reach " + endpointWord(req.GetEndpoint())
	if req.GetDirection() == verdictv1.ReachDirection_REACH_DIRECTION_FROM {
		what = "What " + endpointWord(req.GetEndpoint()) + " can reach"
	}
	workloads, outside := 0, 0
	for _, en := range r.GetEntries() {
		if en.GetWorkload() != "" {
			workloads++
		} else {
			outside++
		}
	}
	fmt.Fprintf(w, "%s %s (revision %d): %s, %s\n", what, flowText(req.GetProtocol(), req.GetPort()), r.GetRevision(),
		count(workloads, "workload", "workloads"), count(outside, "class outside the inventory", "classes outside the inventory"))
	if len(r.GetEntries()) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "  PEER\tOUTBOUND\tINBOUND"
	if wide {
		header += "\tIDENTITY\tTAGS"
	}
	fmt.Fprintln(tw, header)
	for _, en := range r.GetEntries() {
		peer := en.GetWorkload()
		switch o := en.GetOutside().(type) {
		case *verdictv1.ReachEntry_Any:
			peer = "any address outside the inventory"
		case *verdictv1.ReachEntry_Cidr:
			peer = "addresses " + o.Cidr
		case *verdictv1.ReachEntry_Principal:
			peer = "principal " + o.Principal
			if len(en.GetExcept()) > 0 {
				peer += " except " + strings.Join(en.GetExcept(), ", ")
			}
		}
		line := fmt.Sprintf("  %s\t%s\t%s", peer, sideText(en.GetOutbound()), sideText(en.GetInbound()))
		if wide {
			id := "-"
			if en.GetIdentity() != 0 {
				id = strconv.FormatUint(en.GetIdentity(), 10)
			}
			line += fmt.Sprintf("\t%s\t%s", id, peerTagsText(en.GetTags()))
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	for _, n := range r.GetNotes() {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// sideText is a side's deciding policy, or how it was decided without one.
func sideText(s *verdictv1.SideDecision) string {
	if s.GetPolicy() != "" {
		return s.GetPolicy()
	}
	return strings.ToLower(reasonText(s.GetReason()))
}

// endpointOf is the tag form of an endpoint.
func endpointOf(t map[string]string) inventory.Endpoint { return inventory.Endpoint{Tags: t} }

func peerTagsText(t map[string]string) string {
	if len(t) == 0 {
		return "-"
	}
	return apiconv.EndpointText(endpointOf(t))
}

// runMatrix is `verdictctl matrix`.
func runMatrix(ctx context.Context, args []string, e *env) int {
	fs := newFlags("matrix", e)
	var mesh, typ, srcTags, dstTags, proto string
	var port uint32
	var minRev int64
	fs.StringVar(&mesh, "mesh", "", "the `MESH` (default \"default\")")
	fs.StringVar(&typ, "type", "", "policy `TYPE` (default TrafficPermission)")
	fs.StringVar(&srcTags, "src", "", "the sources: workloads with these `TAGS` (k=v,..; default every workload)")
	fs.StringVar(&dstTags, "dst", "", "the destinations: workloads with these `TAGS` (k=v,..; default every workload)")
	fs.Func("proto", "only the flows of this `PROTOCOL`: TCP, UDP or ICMP (default: every class)", func(s string) error {
		if _, err := resource.ParseProtocol(s); err != nil || s == "" {
			return errors.New("not TCP, UDP or ICMP")
		}
		proto = strings.ToUpper(s)
		return nil
	})
	fs.Func("port", "with --proto, only this `PORT`'s class", func(s string) error {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return errors.New("not a port (1-65535)")
		}
		port = uint32(n)
		return nil
	})
	fs.Int64Var(&minRev, "min-revision", 0, "answer from a snapshot at or after this revision")
	var past pastFlags
	past.register(fs, true)
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	if port != 0 && proto == "" {
		return fs.usage("--port needs --proto (TCP, UDP or ICMP)")
	}
	if err := past.check(minRev); err != nil {
		return fs.usage("%v", err)
	}
	srcSel, err := parseTags(srcTags)
	if err != nil {
		return fs.usage("--src: %v", err)
	}
	dstSel, err := parseTags(dstTags)
	if err != nil {
		return fs.usage("--dst: %v", err)
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "matrix", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	stream, err := verdictv1.NewAnalysisServiceClient(conn).Matrix(cctx, &verdictv1.MatrixRequest{Mesh: mesh, Type: typ,
		Sources: srcSel, Destinations: dstSel, Protocol: proto, Port: port, MinRevision: minRev, AtRevision: past.rev, AtTime: past.atTime()})
	if err != nil {
		return fail(e, "matrix", err, nil)
	}
	all := &verdictv1.MatrixResponse{}
	note, waited := working(e, output.printer(e.stdout), "matrix")
	for {
		page, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			waited()
			return fail(e, "matrix", err, nil)
		}
		all.Revision = page.GetRevision()
		all.Entries = append(all.Entries, page.GetEntries()...)
		note(count(len(all.Entries), "pair", "pairs"))
	}
	waited()
	err = output.printer(e.stdout).print(all, func(w io.Writer, wide bool) error {
		fmt.Fprintf(w, "Allowed pairs (revision %d): %s\n", all.GetRevision(), count(len(all.GetEntries()), "pair", "pairs"))
		if len(all.GetEntries()) == 0 {
			return nil
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SOURCE\tDESTINATION\tFLOWS\tOUTBOUND\tINBOUND")
		for _, en := range all.GetEntries() {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", en.GetSource(), en.GetDestination(), classText(en.GetProtocol(), en.GetPortLo(), en.GetPortHi()),
				orDash(en.GetOutboundPolicy()), orDash(en.GetInboundPolicy()))
		}
		return tw.Flush()
	})
	if err != nil {
		return fail(e, "matrix", err, nil)
	}
	return exitOK
}

// classText is a class of flows: "TCP 5432", "TCP 8000-8099", "ICMP",
// "no protocol".
func classText(proto string, lo, hi uint32) string {
	switch {
	case proto == "" && lo == 0:
		return "no protocol"
	case lo == 0:
		return proto
	case proto == "":
		proto = "any protocol"
	}
	if lo == hi {
		return fmt.Sprintf("%s %d", proto, lo)
	}
	return fmt.Sprintf("%s %d-%d", proto, lo, hi)
}

// keyList is a repeatable key flag.
type keyList []string

func (k *keyList) String() string     { return strings.Join(*k, ",") }
func (k *keyList) Set(s string) error { *k = append(*k, s); return nil }

// runImpact is `verdictctl impact`.
func runImpact(ctx context.Context, args []string, e *env) int {
	fs := newFlags("impact", e)
	var files fileList
	fs.Var(&files, "f", "`FILE`, directory or - (stdin) of documents to apply; repeatable")
	var deletes keyList
	fs.Var(&deletes, "delete", "a `KEY` to delete (\"default/policies/TrafficPermission/old\"); repeatable")
	flows := fs.String("flows", "", "a `FILE` of decision-log JSON lines (verdictd --decision-log) to replay beside the observed flows")
	failOn := "any"
	fs.Func("fail-on", "exit 1 when `WHAT` changes: any (any flow's answer), deny (a flow newly denied) or allow (a flow newly allowed)", func(s string) error {
		switch s {
		case "any", "deny", "allow":
			failOn = s
			return nil
		}
		return errors.New("not any, deny or allow")
	})
	fleet := fs.Bool("fleet", true, "replay the flows every live replica observed (registered in etcd); false: the answering replica's own only")
	explain := fs.Bool("explain", false, "explain each changed flow's answer after the change (json, yaml)")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, stop, code := fs.parse(args)
	if stop {
		return code
	}
	if len(rest) > 0 || len(files) == 0 && len(deletes) == 0 {
		return fs.usage("give the change with -f FILE|DIR|- and/or --delete KEY (and nothing else)")
	}
	for _, k := range deletes {
		if _, err := resource.ParseKey(k); err != nil {
			return fs.usage("--delete %q: %v", k, err)
		}
	}
	items, code := readInput(e, "impact", files, exitError)
	if code != exitOK {
		return code
	}
	req := &verdictv1.ImpactRequest{Deletes: deletes, Fleet: *fleet, Explain: *explain}
	for _, it := range items {
		pb, err := apiconv.ResourceToProto(it.res)
		if err != nil {
			return fail(e, "impact", err, nil)
		}
		req.Resources = append(req.Resources, pb)
	}
	if *flows != "" {
		recs, err := readFlows(*flows, e.stdin)
		if err != nil {
			fmt.Fprintf(e.stderr, "verdictctl impact: --flows: %v\n", err)
			return exitError
		}
		req.Flows = recs
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "impact", err, nil)
	}
	defer conn.Close()
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	_, waited := working(e, output.printer(e.stdout), "impact")
	resp, err := verdictv1.NewAnalysisServiceClient(conn).Impact(cctx, req)
	waited()
	if err != nil {
		return fail(e, "impact", err, nil)
	}
	err = output.printer(e.stdout).print(resp, func(w io.Writer, wide bool) error {
		printImpact(w, resp, wide)
		return nil
	})
	if err != nil {
		return fail(e, "impact", err, nil)
	}
	for _, c := range resp.GetChanges() {
		before, after := c.GetBefore().GetAction(), c.GetAfter().GetAction()
		switch {
		case failOn == "any",
			failOn == "deny" && after == verdictv1.Action_ACTION_DENY && before != verdictv1.Action_ACTION_DENY,
			failOn == "allow" && after == verdictv1.Action_ACTION_ALLOW && before != verdictv1.Action_ACTION_ALLOW:
			return exitFailed
		}
	}
	return exitOK
}

// readFlows reads decision-log JSON lines ("-": stdin); blank lines are
// skipped, a line that is not a record is an error naming it. Fields a
// record of this verdictctl does not know (a newer daemon's) are skipped:
// a flow needs its mesh, type, ends, protocol and port alone.
func readFlows(path string, stdin io.Reader) ([]*verdictv1.DecisionRecord, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }() // read only
		r = f
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	var out []*verdictv1.DecisionRecord
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		rec := &verdictv1.DecisionRecord{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(line), rec); err != nil {
			return nil, fmt.Errorf("line %d: not a decision record: %v", n, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

func answerText(a *verdictv1.ImpactAnswer) string {
	if a.GetError() != "" {
		return "none (" + a.GetError() + ")"
	}
	s := actionText(a.GetAction())
	if a.GetPolicy() != "" {
		s += " (" + a.GetPolicy() + ")"
	} else {
		s += " (" + strings.ToLower(reasonText(a.GetInbound().GetReason())) + ")"
	}
	return s
}

func printImpact(w io.Writer, r *verdictv1.ImpactResponse, wide bool) {
	observed := 0
	for _, c := range r.GetChanges() {
		if c.GetObserved() {
			observed++
		}
	}
	if len(r.GetChanges()) == 0 {
		fmt.Fprintf(w, "No flow changes (revision %d; %s considered, %d decided again).\n", r.GetRevision(),
			count(int(r.GetConsidered()), "flow", "flows"), r.GetRedecided())
		printReplicas(w, r)
		return
	}
	fmt.Fprintf(w, "%s change (revision %d): %d between workloads, %d observed\n", count(len(r.GetChanges()), "flow", "flows"),
		r.GetRevision(), len(r.GetChanges())-observed, observed)
	printFlowChanges(w, r, wide, "-o wide")
	printReplicas(w, r)
}

// printFlowChanges prints the changed flows of r and its groups: the flows
// whose action changes (with wide, all of them, with their type and how
// often each was seen); the others, which only change their deciding
// policy, are counted, and the line says which output (more) lists them.
func printFlowChanges(w io.Writer, r *verdictv1.ImpactResponse, wide bool, more string) {
	var shown []*verdictv1.ImpactChange
	quiet := 0
	for _, c := range r.GetChanges() {
		if wide || c.GetBefore().GetAction() != c.GetAfter().GetAction() || c.GetBefore().GetError() != "" || c.GetAfter().GetError() != "" {
			shown = append(shown, c)
		} else {
			quiet++
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "  FLOW\tPORTS\tBEFORE\t\tAFTER"
	if wide {
		header += "\tTYPE\tSEEN"
	}
	if len(shown) > 0 {
		fmt.Fprintln(tw, header)
	}
	for _, c := range shown {
		line := fmt.Sprintf("  %s -> %s\t%s\t%s\t->\t%s", endpointWord(c.GetSource()), endpointWord(c.GetDestination()),
			classText(c.GetProtocol(), c.GetPortLo(), c.GetPortHi()), answerText(c.GetBefore()), answerText(c.GetAfter()))
		if wide {
			seen := "-"
			if c.GetObserved() {
				seen = strconv.FormatUint(c.GetCount(), 10)
			}
			line += fmt.Sprintf("\t%s/%s\t%s", c.GetMesh(), c.GetType(), seen)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	switch {
	case quiet == 1:
		fmt.Fprintf(w, "1 more flow keeps its action, decided by another policy (%s lists it).\n", more)
	case quiet > 1:
		fmt.Fprintf(w, "%d more flows keep their action, decided by another policy (%s lists them).\n", quiet, more)
	}
	groups := append([]*verdictv1.ImpactGroup(nil), r.GetGroups()...)
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].GetFlows() > groups[j].GetFlows() })
	fmt.Fprintln(w, "By policy, destination and ports:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, g := range groups {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", orDash(g.GetPolicy()), g.GetDestination(), classText(g.GetProtocol(), g.GetPortLo(), g.GetPortHi()),
			count(int(g.GetFlows()), "flow", "flows"))
	}
	tw.Flush()
}

func printReplicas(w io.Writer, r *verdictv1.ImpactResponse) {
	for _, rep := range r.GetReplicas() {
		if rep.GetError() != "" {
			fmt.Fprintf(w, "replica %s (%s) did not answer: %s\n", rep.GetId(), rep.GetAddress(), rep.GetError())
		}
	}
}
