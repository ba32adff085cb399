// Package policygen generates realistic policy sets and flows, deterministically
// from a seed. The engine's benchmarks, the store's figures, the load tester and
// the peer comparison all measure on the same sets.
//
// The model: a mesh of services (kuma.io/service: svc-N), each running in
// several environments, regions and versions. Policies are mostly
// service-to-service permissions ("svc-12 may call svc-40 on TCP 8080"), some
// narrowed by env or version, a tenth with wildcards ("every prod service may
// call svc-7"), a few denies, a few port-restricted; with scopes, a share of the
// policies sit in per-team scopes. Flows pick a source and a destination instance;
// most follow a generated permission (real traffic is mostly allowed traffic),
// the rest are random pairs.
package policygen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Config describes a policy set. Zero values take the documented defaults.
type Config struct {
	Seed     uint64
	Policies int    // number of policies (default 1000)
	Mesh     string // default "default"
	Type     string // default "TrafficPermission"
	// Services in the mesh (default Policies/5, at least 50).
	Services int
	// Scopes: how many per-team scopes (default 0: every policy at the mesh root).
	Scopes int
	// WildcardPercent of policies use '*' values or set-based expressions (default 10).
	WildcardPercent int
	// DenyPercent of policies deny (default 5).
	DenyPercent int
	// Combine of the type (FirstMatch by default).
	Combine resource.Combine
	// Profile chooses the model (Sparse by default; see Dense).
	Profile Profile
	// Select of the type (docs/order.md): SelectUnset keeps the default
	// (most specific first); SelectPerDestination is Kuma's per-destination
	// choice.
	Select resource.Select
	// AuditPercent of the policies are in mode Audit (default 0): their rules
	// decide the shadow decision only (docs/audit.md). They are chosen with a
	// generator of their own, so the set is otherwise the one without them.
	AuditPercent int
}

// Profile is the shape of a generated set.
type Profile uint8

// Profiles.
const (
	// Sparse: mostly service-to-service permissions; a flow meets few
	// candidate rules (the package comment's model).
	Sparse Profile = iota
	// Dense: 200 services; selectors of 1–3 tags drawn from service, env,
	// region, zone and version, so many selectors name no service; ~9% of the
	// selectors hold a '*'; 25% DENY among service-to-service policies (10%
	// among the others); 30% of the policies have two source selectors; 20%
	// are port-restricted. About 65 policies match a flow at 10k policies and
	// about 600 at 100k: a decision meets many matching rules.
	Dense
)

func (c Config) withDefaults() Config {
	if c.Policies <= 0 {
		c.Policies = 1000
	}
	if c.Mesh == "" {
		c.Mesh = resource.DefaultMesh
	}
	if c.Type == "" {
		c.Type = resource.DefaultType
	}
	if c.Services <= 0 {
		c.Services = max(50, c.Policies/5)
		if c.Profile == Dense {
			c.Services = 200
		}
	}
	if c.WildcardPercent == 0 {
		c.WildcardPercent = 10
	}
	if c.DenyPercent == 0 {
		c.DenyPercent = 5
	}
	return c
}

var (
	envs     = []string{"prod", "staging", "dev"}
	regions  = []string{"us-east", "us-west", "eu-central", "ap-south"}
	zones    = []string{"zone-0", "zone-1", "zone-2", "zone-3", "zone-4", "zone-5"}
	versions = []string{"v1", "v2", "v3"}
	ports    = []string{"80", "443", "8080", "5432", "9000-9100"}
)

// Set is a generated policy set with what flows need to know about it.
type Set struct {
	Config    Config
	Resources []resource.Resource // the Mesh, the scopes, then the policies
	pairs     [][2]int            // (source service, destination service) of each S&D permission
}

// Policies returns only the policies of the set.
func (s *Set) Policies() []*resource.Policy {
	var out []*resource.Policy
	for _, r := range s.Resources {
		if p, ok := r.(*resource.Policy); ok {
			out = append(out, p)
		}
	}
	return out
}

// Generate builds a policy set.
func Generate(cfg Config) *Set {
	cfg = cfg.withDefaults()
	r := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	s := &Set{Config: cfg}
	mesh := &resource.Mesh{Name: cfg.Mesh}
	if cfg.Combine != resource.FirstMatch || cfg.Select != resource.SelectUnset {
		mesh.Types = map[string]resource.TypeSettings{cfg.Type: {Combine: cfg.Combine, Select: cfg.Select}}
	}
	s.Resources = append(s.Resources, mesh)
	for i := 0; i < cfg.Scopes; i++ {
		s.Resources = append(s.Resources, &resource.Scope{
			Mesh: cfg.Mesh, Name: fmt.Sprintf("team-%d", i), Priority: int32(i % 4), Enforced: true,
			Selectors: []resource.Selector{{Match: map[string]string{"team": fmt.Sprintf("team-%d", i)}}},
		})
	}
	if cfg.Profile == Dense {
		s.generateDense(r)
	} else {
		s.generateSparse(r)
	}
	if cfg.AuditPercent > 0 {
		ar := rand.New(rand.NewPCG(cfg.Seed, 0xa0d17))
		for _, p := range s.Policies() {
			if ar.IntN(100) < cfg.AuditPercent {
				p.Mode = resource.ModeAudit
			}
		}
	}
	return s
}

// generateSparse adds the sparse profile's policies (the package comment's model).
func (s *Set) generateSparse(r *rand.Rand) {
	cfg := s.Config
	for i := 0; i < cfg.Policies; i++ {
		src, dst := r.IntN(cfg.Services), r.IntN(cfg.Services)
		p := &resource.Policy{Mesh: cfg.Mesh, Type: cfg.Type, Name: fmt.Sprintf("p-%06d-svc-%d-to-svc-%d", i, src, dst),
			Priority: int32(r.IntN(4)), Action: resource.Allow}
		srcSel := resource.Selector{Match: map[string]string{resource.ServiceTag: svc(src)}}
		dstSel := resource.Selector{Match: map[string]string{resource.ServiceTag: svc(dst)}}
		switch x := r.IntN(100); {
		case x < cfg.WildcardPercent/2:
			// every service of one environment may call dst
			srcSel = resource.Selector{Match: map[string]string{resource.ServiceTag: "*", "env": envs[r.IntN(len(envs))]}}
		case x < cfg.WildcardPercent:
			// set-based: a few named callers
			srcSel = resource.Selector{Expressions: []resource.Expression{{Key: resource.ServiceTag, Operator: resource.OpIn,
				Values: []string{svc(src), svc(r.IntN(cfg.Services)), svc(r.IntN(cfg.Services))}}}}
		default:
			s.pairs = append(s.pairs, [2]int{src, dst})
		}
		if r.IntN(100) < 20 {
			srcSel.Match = withTag(srcSel.Match, "env", envs[r.IntN(len(envs))])
		}
		if r.IntN(100) < 10 {
			dstSel.Match["version"] = versions[r.IntN(len(versions))]
		}
		p.Sources, p.Destinations = []resource.Selector{srcSel}, []resource.Selector{dstSel}
		if r.IntN(100) < cfg.DenyPercent {
			p.Action = resource.Deny
		}
		if r.IntN(100) < 30 {
			p.Ports = []resource.PortEntry{{Protocol: resource.TCP, Ports: ports[r.IntN(len(ports))]}}
		}
		if r.IntN(100) < 15 {
			p.Conf = resource.Object{"log": map[string]any{"sample": json.Number(fmt.Sprint(r.IntN(100)))}}
		}
		if cfg.Scopes > 0 && r.IntN(100) < 30 {
			p.Scope = fmt.Sprintf("team-%d", teamOf(dst, cfg.Scopes))
		}
		s.Resources = append(s.Resources, p)
	}
}

func svc(i int) string { return fmt.Sprintf("svc-%d", i) }

func teamOf(service, scopes int) int { return service % scopes }

func withTag(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}

// workload returns the tags of one instance of a service.
func (s *Set) workload(r *rand.Rand, service int) resource.Tags {
	t := resource.Tags{
		resource.ServiceTag: svc(service),
		"env":               envs[r.IntN(len(envs))],
		"region":            regions[r.IntN(len(regions))],
		"version":           versions[r.IntN(len(versions))],
		"zone":              zones[r.IntN(len(zones))],
		resource.NameTag:    fmt.Sprintf("%s-%d", svc(service), r.IntN(20)),
	}
	if s.Config.Scopes > 0 {
		t["team"] = fmt.Sprintf("team-%d", teamOf(service, s.Config.Scopes))
	}
	return t
}

// Workloads returns n workloads of the set's mesh: instances of its
// services, round robin, each tagged as workload's instances are (the
// service, env, region, version, zone, a name). They are drawn from a
// generator of their own: the set is the same with or without them.
func (s *Set) Workloads(n int) []*resource.Workload {
	r := rand.New(rand.NewPCG(s.Config.Seed, 0x3041))
	out := make([]*resource.Workload, n)
	for i := range out {
		out[i] = &resource.Workload{Mesh: s.Config.Mesh, Name: fmt.Sprintf("w-%06d", i), Tags: s.workload(r, i%s.Config.Services)}
	}
	return out
}

// Flows returns n requests against the set: 80% follow a generated permission,
// 20% are random service pairs; protocols and ports vary.
func (s *Set) Flows(seed uint64, n int) []engine.Request {
	r := rand.New(rand.NewPCG(seed, 0xf10))
	out := make([]engine.Request, n)
	for i := range out {
		var src, dst int
		if len(s.pairs) > 0 && r.IntN(100) < 80 {
			p := s.pairs[r.IntN(len(s.pairs))]
			src, dst = p[0], p[1]
		} else {
			src, dst = r.IntN(s.Config.Services), r.IntN(s.Config.Services)
		}
		req := engine.Request{Mesh: s.Config.Mesh, Type: s.Config.Type,
			Source: s.workload(r, src), Destination: s.workload(r, dst)}
		if r.IntN(100) < 70 {
			req.Protocol = resource.TCP
			req.Port = []uint32{80, 443, 8080, 5432, 9050}[r.IntN(5)]
		}
		out[i] = req
	}
	return out
}

// The dense profile's selector keys besides the service, with their values.
var denseKeys = []struct {
	key    string
	values []string
}{{"env", envs}, {"region", regions}, {"zone", zones}, {"version", versions}}

// Shares of the dense profile, in percent.
const (
	denseServiceEnd = 60 // an end's selector names a service
	denseWildcard   = 9  // a selector holds a '*'
	denseTwoSources = 30
	denseS2SDeny    = 25 // DENY among service-to-service policies
	denseOtherDeny  = 10
	densePorts      = 20
)

// denseSelector returns a selector of 1–3 tags; with service >= 0 the first is
// the service.
func denseSelector(r *rand.Rand, service int) resource.Selector {
	m := map[string]string{}
	n := 1 + r.IntN(3)
	if service >= 0 {
		m[resource.ServiceTag] = svc(service)
		n--
	}
	for _, i := range r.Perm(len(denseKeys))[:n] {
		k := denseKeys[i]
		m[k.key] = k.values[r.IntN(len(k.values))]
	}
	if r.IntN(100) < denseWildcard {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		m[keys[r.IntN(len(keys))]] = "*"
	}
	return resource.Selector{Match: m}
}

func (s *Set) generateDense(r *rand.Rand) {
	cfg := s.Config
	end := func() int {
		if r.IntN(100) < denseServiceEnd {
			return r.IntN(cfg.Services)
		}
		return -1
	}
	for i := 0; i < cfg.Policies; i++ {
		src, dst := end(), end()
		p := &resource.Policy{Mesh: cfg.Mesh, Type: cfg.Type, Name: fmt.Sprintf("d-%06d", i),
			Priority: int32(r.IntN(4)), Action: resource.Allow}
		p.Sources = []resource.Selector{denseSelector(r, src)}
		if r.IntN(100) < denseTwoSources {
			p.Sources = append(p.Sources, denseSelector(r, end()))
		}
		p.Destinations = []resource.Selector{denseSelector(r, dst)}
		deny := denseOtherDeny
		if src >= 0 && dst >= 0 {
			s.pairs = append(s.pairs, [2]int{src, dst})
			deny = denseS2SDeny
		}
		if r.IntN(100) < deny {
			p.Action = resource.Deny
		}
		if r.IntN(100) < densePorts {
			p.Ports = []resource.PortEntry{{Protocol: resource.TCP, Ports: ports[r.IntN(len(ports))]}}
		}
		if r.IntN(100) < 15 {
			p.Conf = resource.Object{"log": map[string]any{"sample": json.Number(fmt.Sprint(r.IntN(100)))}}
		}
		s.Resources = append(s.Resources, p)
	}
}
