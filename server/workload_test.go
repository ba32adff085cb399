package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

func workloadRes(name string, addrs ...string) *verdictv1.Resource {
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Workload{Workload: &verdictv1.Workload{
		Name: name, Tags: map[string]string{"app": name}, Addresses: addrs, Principal: "spiffe://default/" + name,
		Ports: []*verdictv1.WorkloadPort{{Port: 8080, Tags: map[string]string{"kuma.io/protocol": "http"}}},
	}}}
}

// Workloads are applied, read back with their identity, listed, and an
// address conflict is refused naming both workloads.
func TestApplyWorkloads(t *testing.T) {
	t.Parallel()
	h := start(t, newBackend(decodeYAML(t, testPolicies)...), nil)
	ctx := ctxT(t)
	resp, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{workloadRes("web-1", "10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetKeys()) != 1 || resp.GetKeys()[0] != "default/workloads/web-1" {
		t.Fatalf("keys %v", resp.GetKeys())
	}
	got, err := h.pol.Get(ctx, &verdictv1.GetRequest{Key: "default/workloads/web-1", MinRevision: resp.GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	w := got.GetResource().GetResource().GetWorkload()
	if w.GetName() != "web-1" || w.GetAddresses()[0] != "10.0.0.1" || w.GetPorts()[0].GetPort() != 8080 ||
		w.GetPrincipal() != "spiffe://default/web-1" {
		t.Fatalf("got %v", got)
	}
	if want := resource.Identity("default", map[string]string{"app": "web-1"}); got.GetResource().GetIdentity() != want {
		t.Fatalf("identity %d, want %d", got.GetResource().GetIdentity(), want)
	}
	list, err := h.pol.List(ctx, &verdictv1.ListRequest{Prefix: "default/workloads/"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetResources()) != 1 || list.GetResources()[0].GetIdentity() == 0 {
		t.Fatalf("list %v", list)
	}

	_, err = h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{workloadRes("web-2", "10.0.0.1")}})
	v := violations(wantCode(t, err, codes.InvalidArgument))
	if why, ok := v["resources[0]"]; !ok || !strings.Contains(why, `"web-1"`) {
		t.Fatalf("conflict not refused naming web-1: %v", v)
	}

	bad := workloadRes("web-3")
	bad.GetWorkload().Tags["ip"] = "10.0.0.3"
	_, err = h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{bad}})
	v = violations(wantCode(t, err, codes.InvalidArgument))
	if _, ok := v[`resources[0].workload.tags["ip"]`]; !ok {
		t.Fatalf("reserved tag not refused by field: %v", v)
	}
}
