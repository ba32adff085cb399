package main

import (
	"context"
	"fmt"
	"io"
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
	fs := newFlags("inspect", e)
	mesh := fs.String("mesh", "", "the `MESH` (default \"default\")")
	var types fileList
	fs.Var(&types, "type", "policy `TYPE`; repeatable (default TrafficPermission)")
	workload := fs.String("workload", "", "the workload's `TAGS` k=v,k2=v2")
	workloadName := fs.String("workload-name", "", "the workload by `NAME`")
	workloadAddr := fs.String("workload-address", "", "the workload by `IP` address")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	wl, err := workloadEndpoint(*workload, *workloadName, *workloadAddr)
	if err != nil {
		return fs.usage("%v", err)
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
	code := exitOK
	type typeView struct {
		name    string
		rules   *verdictv1.WatchRulesResponse
		res     *verdictv1.ResolveResponse
		resErr  string
		failure error
	}
	var views []typeView
	perType := map[string]any{}
	for _, typ := range types {
		v := typeView{name: typ}
		section := map[string]any{}
		perType[typ] = section
		if v.rules, v.failure = firstRules(ctx, &cf, watch, &verdictv1.WatchRulesRequest{Mesh: *mesh, Type: typ, Workload: wl, IncludeAudit: true}); v.failure != nil {
			section["rulesError"] = v.failure.Error()
		} else {
			section["rules"] = msgTree(v.rules)
		}
		cctx, cancel := cf.ctx(ctx)
		res, err := dec.Resolve(cctx, &verdictv1.ResolveRequest{Mesh: *mesh, Type: typ, Source: wl})
		cancel()
		if err != nil {
			// Not every type has a configuration for one workload (a type
			// whose rules need both ends): said, not failed.
			v.resErr = status.Convert(err).Message()
			section["configurationError"] = v.resErr
		} else {
			v.res = res
			section["configuration"] = msgTree(res)
		}
		views = append(views, v)
	}
	doc["types"] = perType
	err = output.printer(e.stdout).print(doc, func(w io.Writer, _ bool) error {
		if wl.GetWorkload() == "" && wl.GetAddress() == "" && wl.GetPrincipal() == "" && wl.GetIdentity() == 0 {
			fmt.Fprintf(w, "workload %s\n", endpointText(wl))
		} else {
			fmt.Fprintln(w, endpointText(wl)) // "workload cart-1", "address 10.0.0.7"
		}
		if r := d.GetSourceResolution(); r != nil {
			fmt.Fprintf(w, "resolved: %s\n", resolutionText(r))
		}
		if len(trace.GetMembers()) == 0 {
			fmt.Fprintln(w, "scopes: none (the mesh root only)")
		} else {
			fmt.Fprintf(w, "scopes: %s (most specific: %s)\n", strings.Join(trace.GetMembers(), ", "), trace.GetMostSpecificScope())
		}
		for _, v := range views {
			fmt.Fprintf(w, "\n%s rules, in decision order:\n", v.name)
			if v.rules != nil {
				printRules(w, v.rules, false)
			}
			if v.res == nil {
				fmt.Fprintf(w, "%s effective configuration: none for one workload (%s)\n", v.name, v.resErr)
				continue
			}
			fmt.Fprintf(w, "%s effective configuration:\n", v.name)
			printResolution(w, &verdictv1.Resolution{Side: v.res.GetSide(), Rules: v.res.GetRules(), Status: v.res.GetStatus()})
			if v.res.GetOutbound() != nil {
				printResolution(w, v.res.GetOutbound())
			}
		}
		return nil
	})
	if err != nil {
		return fail(e, "inspect", err, nil)
	}
	for _, v := range views {
		if v.failure != nil {
			code = fail(e, "inspect", v.failure, nil)
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
