package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httpauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	netauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/verdictpdp/verdict/engine/resource"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

// checkSite is one place where the example's Envoy asks verdict: an
// ext_authz filter on a listener (for the HTTP filter, one route), with what
// that filter puts in its CheckRequests.
type checkSite struct {
	name       string
	port       uint32
	http       bool
	labels     map[string]string // destination.labels: the node metadata under bootstrap_metadata_labels_key
	extensions map[string]string // context_extensions: the route's ExtAuthzPerRoute
}

// workload is the name the site gives its destination (the first set, as
// docs/envoy.md orders them).
func (s checkSite) workload() string {
	if w := s.extensions["verdict.workload"]; w != "" {
		return w
	}
	return s.labels["verdict.workload"]
}

// TestEnvoyExample holds examples/envoy/bootstrap.yaml and docs/envoy.md's
// commands to examples/policies.yaml: against a verdictd started as `make
// run` starts it, every Check the example's Envoy can send — each ext_authz
// site, from each example workload's address — names a workload verdict
// knows (decided, not refused, the destination resolved as that workload),
// and some of them are allowed; docs/envoy.md's verdictctl lines run as
// written.
func TestEnvoyExample(t *testing.T) {
	t.Parallel()
	sites := bootstrapCheckSites(t, filepath.Join(repoRoot, "examples/envoy/bootstrap.yaml"))
	if len(sites) == 0 {
		t.Fatal("the example has no ext_authz filter")
	}
	sources := exampleAddresses(t, filepath.Join(repoRoot, "examples/policies.yaml"))
	if len(sources) == 0 {
		t.Fatal("the example policies hold no workload address")
	}

	d := startDaemon(t, "--bootstrap", "examples/policies.yaml")
	conn := d.conn(t)
	waitServing(t, conn)
	authz := authv3.NewAuthorizationClient(conn)
	allowed := 0
	for _, site := range sites {
		if site.workload() == "" {
			t.Errorf("%s: names no workload (verdict.workload in context_extensions or the node labels)", site.name)
			continue
		}
		for _, src := range sources {
			resp, err := authz.Check(ctxT(t), envoyCheck(site, src))
			if err != nil {
				t.Fatalf("%s from %s: %v", site.name, src, err)
			}
			md := resp.GetDynamicMetadata().GetFields()
			if why := md["refused"].GetStringValue(); why != "" {
				t.Errorf("%s from %s: refused: %s", site.name, src, why)
				continue
			}
			dst := md["destination"].GetStructValue().GetFields()
			if got := dst["resolved_as"].GetStringValue(); got != "RESOLVED_AS_WORKLOAD" || dst["workload"].GetStringValue() != site.workload() {
				t.Errorf("%s from %s: destination resolved as %s %q, want the workload %q", site.name, src, got, dst["workload"].GetStringValue(), site.workload())
			}
			if resp.GetStatus().GetCode() == int32(codes.OK) {
				allowed++
			}
		}
	}
	if allowed == 0 {
		t.Error("no Check of the example is allowed: the example shows only denials")
	}

	if n := runDocExamples(t, d, "docs/envoy.md"); n == 0 {
		t.Error("docs/envoy.md shows no verdictctl command")
	}
}

// bootstrapCheckSites reads an Envoy bootstrap with Envoy's own config
// protos and returns its ext_authz sites.
func bootstrapCheckSites(t *testing.T, path string) []checkSite {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("%s: not an Envoy bootstrap: %v", path, err)
	}
	nodeLabels := func(key string) map[string]string {
		if key == "" {
			return nil
		}
		out := map[string]string{}
		for k, v := range b.GetNode().GetMetadata().GetFields()[key].GetStructValue().GetFields() {
			out[k] = v.GetStringValue()
		}
		return out
	}
	var sites []checkSite
	for _, l := range b.GetStaticResources().GetListeners() {
		port := l.GetAddress().GetSocketAddress().GetPortValue()
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				sites = append(sites, filterSites(t, l, f, port, nodeLabels)...)
			}
		}
	}
	return sites
}

func filterSites(t *testing.T, l *listenerv3.Listener, f *listenerv3.Filter, port uint32, nodeLabels func(string) map[string]string) []checkSite {
	t.Helper()
	msg, err := f.GetTypedConfig().UnmarshalNew()
	if err != nil {
		t.Fatalf("%s: %s: %v", l.GetName(), f.GetName(), err)
	}
	switch c := msg.(type) {
	case *netauthzv3.ExtAuthz:
		return []checkSite{{name: l.GetName(), port: port, labels: nodeLabels(c.GetBootstrapMetadataLabelsKey())}}
	case *hcmv3.HttpConnectionManager:
		var labels map[string]string
		found := false
		for _, hf := range c.GetHttpFilters() {
			m, err := hf.GetTypedConfig().UnmarshalNew()
			if err != nil {
				t.Fatalf("%s: %s: %v", l.GetName(), hf.GetName(), err)
			}
			if a, ok := m.(*httpauthzv3.ExtAuthz); ok {
				found, labels = true, nodeLabels(a.GetBootstrapMetadataLabelsKey())
			}
		}
		if !found {
			return nil
		}
		perRoute := func(cfg map[string]*anypb.Any) map[string]string {
			out := map[string]string{}
			for _, a := range cfg {
				m, err := a.UnmarshalNew()
				if err != nil {
					t.Fatalf("%s: %v", l.GetName(), err)
				}
				if pr, ok := m.(*httpauthzv3.ExtAuthzPerRoute); ok {
					for k, v := range pr.GetCheckSettings().GetContextExtensions() {
						out[k] = v
					}
				}
			}
			return out
		}
		var sites []checkSite
		for _, vh := range c.GetRouteConfig().GetVirtualHosts() {
			base := perRoute(vh.GetTypedPerFilterConfig())
			for _, r := range vh.GetRoutes() {
				ext := map[string]string{}
				for k, v := range base {
					ext[k] = v
				}
				for k, v := range perRoute(r.GetTypedPerFilterConfig()) {
					ext[k] = v
				}
				sites = append(sites, checkSite{name: l.GetName() + "/" + vh.GetName() + "/" + r.GetMatch().GetPrefix(),
					port: port, http: true, labels: labels, extensions: ext})
			}
		}
		return sites
	}
	return nil
}

// exampleAddresses decodes a policy file with the engine's decoder and
// returns its workloads' addresses.
func exampleAddresses(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := resource.DecodeYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res {
		if w, ok := r.(*resource.Workload); ok {
			out = append(out, w.Addresses...)
		}
	}
	return out
}

// envoyCheck is the CheckRequest the site's filter sends for a plaintext
// connection from src to the listener (Envoy's check_request_utils.cc: the
// peers' socket addresses, the node labels, the route's extensions).
func envoyCheck(s checkSite, src string) *authv3.CheckRequest {
	sock := func(ip string, port uint32) *corev3.Address {
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
	}
	attrs := &authv3.AttributeContext{
		Source:            &authv3.AttributeContext_Peer{Address: sock(netip.MustParseAddr(src).String(), 40000)},
		Destination:       &authv3.AttributeContext_Peer{Address: sock("127.0.0.1", s.port), Labels: s.labels},
		ContextExtensions: s.extensions,
	}
	if s.http {
		attrs.Request = &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "1", Method: "GET", Path: "/", Host: "example", Scheme: "http", Protocol: "HTTP/1.1",
		}}
	}
	return &authv3.CheckRequest{Attributes: attrs}
}
