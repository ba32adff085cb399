package main

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// runInspect shows one workload at once, like kumactl inspect dataplane: its
// scopes, its ordered inbound and outbound rules per type (WatchRules' first
// message), and its effective configuration (Resolve).
func runInspect(ctx context.Context, args []string, e *env) int {
	fs := newFlags("inspect", "--workload k=v,.. | --workload-name NAME | --workload-address IP [--type T]...",
		"Shows a workload's member scopes, its inbound and outbound rules in decision order for each\n"+
			"--type (default TrafficPermission), and each type's effective configuration.", e.stderr)
	mesh := fs.String("mesh", "", "mesh (default \"default\")")
	var types fileList
	fs.Var(&types, "type", "policy type; repeatable (default TrafficPermission)")
	workload := fs.String("workload", "", "the workload's tags k=v,k2=v2")
	workloadName := fs.String("workload-name", "", "the workload by name")
	workloadAddr := fs.String("workload-address", "", "the workload by address")
	var output outputFlag
	output.register(fs, "text", "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) > 0 {
		fmt.Fprintf(e.stderr, "verdictctl inspect: unexpected argument %q\n", rest[0])
		return exitUsage
	}
	wl, err := workloadEndpoint(*workload, *workloadName, *workloadAddr)
	if err != nil {
		fmt.Fprintf(e.stderr, "verdictctl inspect: %v\n", err)
		return exitUsage
	}
	if len(types) == 0 {
		types = fileList{resource.DefaultType}
	}
	conn, err := cf.dial()
	if err != nil {
		return fail(e, "inspect", err, nil)
	}
	defer conn.Close()
	dec := verdictv1.NewDecisionServiceClient(conn)
	watch := verdictv1.NewWatchServiceClient(conn)

	// The scopes: the outbound side of a flow from the workload to itself
	// lists the source's member scopes.
	cctx, cancel := cf.ctx(ctx)
	d, err := dec.Decide(cctx, &verdictv1.DecideRequest{Mesh: *mesh, Type: types[0], Source: wl, Destination: wl, Explain: true})
	cancel()
	if err != nil {
		return fail(e, "inspect", err, nil)
	}
	trace := d.GetExplanation().GetOutbound()
	doc := map[string]any{"workload": endpointText(wl), "scopes": trace.GetMembers(), "mostSpecificScope": trace.GetMostSpecificScope()}
	if r := d.GetSourceResolution(); r != nil {
		doc["resolution"] = msgTree(r)
	}
	if !output.structured() {
		fmt.Fprintf(e.stdout, "workload %s\n", endpointText(wl))
		if r := d.GetSourceResolution(); r != nil {
			fmt.Fprintf(e.stdout, "resolved: %s\n", resolutionText(r))
		}
		if len(trace.GetMembers()) == 0 {
			fmt.Fprintln(e.stdout, "scopes: none (the mesh root only)")
		} else {
			fmt.Fprintf(e.stdout, "scopes: %s (most specific: %s)\n", strings.Join(trace.GetMembers(), ", "), trace.GetMostSpecificScope())
		}
	}
	code = exitOK
	perType := map[string]any{}
	for _, typ := range types {
		section := map[string]any{}
		perType[typ] = section
		if !output.structured() {
			fmt.Fprintf(e.stdout, "\n%s rules, in decision order:\n", typ)
		}
		rules, err := firstRules(ctx, &cf, watch, &verdictv1.WatchRulesRequest{Mesh: *mesh, Type: typ, Workload: wl, IncludeAudit: true})
		if err != nil {
			section["rulesError"] = err.Error()
			code = fail(e, "inspect", err, nil)
		} else {
			section["rules"] = msgTree(rules)
			if !output.structured() {
				printRules(e.stdout, rules)
			}
		}
		cctx, cancel := cf.ctx(ctx)
		res, err := dec.Resolve(cctx, &verdictv1.ResolveRequest{Mesh: *mesh, Type: typ, Source: wl})
		cancel()
		switch {
		case err != nil:
			// Not every type has a configuration for one workload (a type
			// whose rules need both ends): said, not failed.
			section["configurationError"] = status.Convert(err).Message()
			if !output.structured() {
				fmt.Fprintf(e.stdout, "%s effective configuration: none for one workload (%s)\n", typ, status.Convert(err).Message())
			}
		default:
			section["configuration"] = msgTree(res)
			if !output.structured() {
				fmt.Fprintf(e.stdout, "%s effective configuration:\n", typ)
				printResolution(e.stdout, &verdictv1.Resolution{Side: res.GetSide(), Rules: res.GetRules(), Status: res.GetStatus()})
				if res.GetOutbound() != nil {
					printResolution(e.stdout, res.GetOutbound())
				}
			}
		}
	}
	doc["types"] = perType
	if output.structured() {
		if err := printValue(e.stdout, output.value, doc); err != nil {
			return fail(e, "inspect", err, nil)
		}
	}
	return code
}

// firstRules reads the first message of a WatchRules stream: the rules now.
func firstRules(ctx context.Context, cf *connFlags, c verdictv1.WatchServiceClient, req *verdictv1.WatchRulesRequest) (*verdictv1.WatchRulesResponse, error) {
	cctx, cancel := cf.ctx(ctx)
	defer cancel()
	s, err := c.WatchRules(cctx, req)
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

// msgTree is a message as a generic tree, for a json or yaml document.
func msgTree(m proto.Message) any {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err.Error()
	}
	v, err := resource.ParseJSON(b)
	if err != nil {
		return err.Error()
	}
	return v
}
