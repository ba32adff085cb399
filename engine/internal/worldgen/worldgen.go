// Package worldgen generates the small random worlds the differential tests
// hold the engine to: one mesh "m" with its settings, a few scopes, policies
// of a sources & destinations type (TrafficPermission) and of a targetRef
// type (MeshTrafficPermission), expressions of every operator, audit and
// PerDestination settings; an inventory of workloads with addresses,
// principals and port tags; endpoints in every form. A world is a function
// of its bytes (a fuzzer's input, or SeedBytes), so a failure is replayed by
// its seed. engine's and engine/analysis's tests share it; nothing else
// imports it.
package worldgen

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Choices feeds the generator: the fuzzer's bytes first, then a PRNG seeded
// from them, so a short input still describes a whole policy set and every
// mutation of it changes one.
type Choices struct {
	data []byte
	rng  *rand.Rand
}

// NewChoices returns the choices of data.
func NewChoices(data []byte) *Choices {
	h := fnv.New64a()
	h.Write(data)
	return &Choices{data: data, rng: rand.New(rand.NewPCG(h.Sum64(), 7))}
}

// N returns a choice among n (0 for n <= 1).
func (c *Choices) N(n int) int {
	if n <= 1 {
		return 0
	}
	if len(c.data) > 0 {
		b := c.data[0]
		c.data = c.data[1:]
		return int(b) % n
	}
	return c.rng.IntN(n)
}

// Chance is true with the odds of percent.
func (c *Choices) Chance(percent int) bool { return c.N(100) < percent }

// Keys and Values are the tags worlds are made of.
var (
	Keys   = []string{"app", "env", "tier", "kuma.io/service", "version", "ip"}
	Values = map[string][]string{
		"app": {"web", "api", "db"}, "env": {"prod", "dev", "stage"}, "tier": {"front", "back", "data"},
		"kuma.io/service": {"web", "backend", "redis"}, "version": {"v1", "v2", "v3"},
		"ip":        {"10.0.0.1", "10.0.1.5", "192.168.1.1"},
		"principal": {"spiffe://m/web", "spiffe://m/backend", "spiffe://m/redis"},
	}
)

// Tags returns a tag set over Keys, a principal at times.
func (c *Choices) Tags() resource.Tags {
	t := resource.Tags{}
	for _, k := range Keys {
		if c.Chance(55) {
			vals := Values[k]
			t[k] = vals[c.N(len(vals))]
		}
	}
	if c.Chance(30) {
		t["principal"] = Values["principal"][c.N(3)] // a peer known by its SPIFFE ID
	}
	return t
}

// Selector returns a selector: match entries, an expression at times.
func (c *Choices) Selector() resource.Selector {
	var s resource.Selector
	if n := c.N(3); n > 0 {
		s.Match = map[string]string{}
		for i := 0; i < n; i++ {
			k := Keys[c.N(len(Keys)-1)] // not ip
			v := "*"
			if c.Chance(70) {
				v = Values[k][c.N(3)]
			}
			s.Match[k] = v
		}
	}
	if c.Chance(30) {
		k := Keys[c.N(len(Keys))]
		e := resource.Expression{Key: k}
		switch c.N(6) {
		case 0:
			e.Operator = resource.OpIn
			e.Values = []string{Values[k][c.N(3)]}
			if c.Chance(50) {
				e.Values = append(e.Values, Values[k][c.N(3)])
			}
		case 1:
			e.Operator = resource.OpNotIn
			e.Values = []string{Values[k][c.N(3)]}
		case 2:
			e.Operator = resource.OpExists
		case 3:
			e.Operator = resource.OpDoesNotExist
		case 4:
			e.Operator = resource.OpPrefix
			e.Values = []string{Values[k][c.N(3)][:1]}
		case 5:
			e.Key, e.Operator = "ip", resource.OpCIDR
			e.Values = []string{[]string{"10.0.0.0/16", "10.0.1.0/24", "192.168.0.0/16"}[c.N(3)]}
		}
		s.Expressions = append(s.Expressions, e)
	}
	return s
}

// Action returns an action, unset at times.
func (c *Choices) Action() resource.Action {
	return []resource.Action{resource.ActionUnset, resource.Allow, resource.Deny, resource.Deny}[c.N(4)]
}

// TargetRef returns a targetRef of every kind and Kuma form.
func (c *Choices) TargetRef() resource.TargetRef {
	switch c.N(8) {
	case 5:
		// Kuma's Dataplane by labels
		return resource.TargetRef{Kind: resource.TargetProxy, Tags: map[string]string{"env": Values["env"][c.N(3)]}}
	case 6:
		return resource.TargetRef{Kind: resource.TargetProxy} // every Dataplane
	case 7:
		// a spiffeID match: Exact or Prefix on the principal
		if c.Chance(50) {
			return resource.TargetRef{Kind: resource.TargetMeshSubset, Tags: map[string]string{"principal": Values["principal"][c.N(3)]}}
		}
		return resource.TargetRef{Kind: resource.TargetMeshSubset, Expressions: []resource.Expression{
			{Key: "principal", Operator: resource.OpPrefix, Values: []string{Values["principal"][c.N(3)][:len("spiffe://m/")+c.N(2)]}}}}
	case 0:
		return resource.TargetRef{Kind: resource.TargetMesh}
	case 1:
		return resource.TargetRef{Kind: resource.TargetMeshSubset, Tags: map[string]string{"env": Values["env"][c.N(3)]}}
	case 2:
		return resource.TargetRef{Kind: resource.TargetService, Name: Values["kuma.io/service"][c.N(3)]}
	case 3:
		return resource.TargetRef{Kind: resource.TargetServiceSubset, Name: Values["kuma.io/service"][c.N(3)],
			Tags: map[string]string{"version": Values["version"][c.N(3)]}}
	}
	return resource.TargetRef{Kind: resource.TargetProxy, Name: Values["app"][c.N(3)]}
}

// Times are the creation and modification times policies get.
var Times = []time.Time{{}, time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)}

// World generates one mesh's resources: settings, a few scopes, S&D policies
// of TrafficPermission and targetRef policies of MeshTrafficPermission.
func World(c *Choices) []resource.Resource {
	var out []resource.Resource
	mesh := &resource.Mesh{Name: "m", TieBreak: resource.TieBreak(c.N(4)), ItemOrder: resource.ItemOrder(c.N(3)),
		DefaultAction: c.Action(), UnenforcedAction: c.Action(), Profile: resource.Profile(c.N(3))}
	if c.Chance(30) {
		mesh.Types = map[string]resource.TypeSettings{"TrafficPermission": {Combine: resource.DenyOverrides}}
	}
	if c.Chance(40) {
		if mesh.Types == nil {
			mesh.Types = map[string]resource.TypeSettings{}
		}
		tp := mesh.Types["TrafficPermission"]
		tp.Select = resource.Select(c.N(3))
		mesh.Types["TrafficPermission"] = tp
		if c.Chance(30) {
			// PerDestination on a targetRef type too
			mesh.Types["MeshTrafficPermission"] = resource.TypeSettings{Select: resource.SelectPerDestination, UnenforcedAction: c.Action()}
		}
	}
	if c.Chance(20) {
		if mesh.Types == nil {
			mesh.Types = map[string]resource.TypeSettings{}
		}
		ts := mesh.Types["MeshTrafficPermission"]
		ts.TieBreak = resource.TieBreak(c.N(4))
		mesh.Types["MeshTrafficPermission"] = ts
	}
	if c.Chance(50) {
		// "Other" has no policy: declared, it is known and answered; else NOT_FOUND
		if mesh.Types == nil {
			mesh.Types = map[string]resource.TypeSettings{}
		}
		mesh.Types["Other"] = resource.TypeSettings{}
	}
	if c.Chance(80) {
		out = append(out, mesh)
	}
	var scopes []string
	for i, n := 0, c.N(5); i < n; i++ {
		s := &resource.Scope{Mesh: "m", Name: fmt.Sprintf("s%d", i), Priority: int32(c.N(4)), Enforced: !c.Chance(15)}
		if len(scopes) > 0 && c.Chance(40) {
			s.Parent = scopes[c.N(len(scopes))]
		}
		for j, m := 0, 1+c.N(2); j < m; j++ {
			s.Selectors = append(s.Selectors, c.Selector())
		}
		if c.Chance(50) {
			s.CatchAll = []resource.Action{resource.Allow, resource.Deny}[c.N(2)]
			if c.Chance(30) {
				s.CatchAllTypes = []string{"MeshTrafficPermission"}
			}
		}
		scopes = append(scopes, s.Name)
		out = append(out, s)
	}
	for i, n := 0, c.N(9); i < n; i++ {
		p := &resource.Policy{Mesh: "m", Name: fmt.Sprintf("p%d", i), Type: "TrafficPermission",
			Priority: int32(c.N(3)), Action: c.Action()}
		if c.Chance(25) {
			p.Rank = resource.RankAbsolute
		}
		if len(scopes) > 0 && c.Chance(50) {
			p.Scope = scopes[c.N(len(scopes))]
		}
		for j, m := 0, 1+c.N(2); j < m; j++ {
			p.Sources = append(p.Sources, c.Selector())
		}
		for j, m := 0, 1+c.N(2); j < m; j++ {
			p.Destinations = append(p.Destinations, c.Selector())
		}
		if c.Chance(25) {
			p.Ports = []resource.PortEntry{{Protocol: []resource.Protocol{resource.ProtocolAny, resource.TCP, resource.UDP, resource.ICMP}[c.N(4)],
				Ports: []string{"", "80", "22,8000-8100"}[c.N(3)]}}
		}
		if c.Chance(40) {
			p.Conf = resource.Object{"log": json.Number(fmt.Sprint(i))}
		}
		p.Meta.CreationTime = Times[c.N(3)]
		p.Meta.ModificationTime = Times[c.N(3)]
		out = append(out, p)
	}
	for i, n := 0, c.N(6); i < n; i++ {
		p := &resource.Policy{Mesh: "m", Name: fmt.Sprintf("t%d", i), Type: "MeshTrafficPermission", Priority: int32(c.N(2))}
		tr := c.TargetRef()
		p.TargetRef = &tr
		if c.Chance(15) {
			p.Rank = resource.RankAbsolute
		}
		// A MeshTrafficPermission item has an action and no conf (Kuma's schema).
		for j, m := 0, c.N(3); j < m; j++ {
			p.From = append(p.From, resource.Item{TargetRef: c.TargetRef(), Action: c.Action().Or(resource.Allow)})
		}
		for j, m := 0, c.N(3); j < m; j++ {
			p.To = append(p.To, resource.Item{TargetRef: c.TargetRef(), Action: c.Action().Or(resource.Allow)})
		}
		p.DenyFirst = len(p.From) > 0 && c.Chance(30) // Kuma's rules: the denies first
		p.Meta.CreationTime = Times[c.N(3)]
		out = append(out, p)
	}
	return out
}

// Request returns a request of the tag form: a type of World's (or one
// with no policy), tags, a protocol and a port.
func Request(c *Choices) engine.Request {
	return engine.Request{
		Mesh:        "m",
		Type:        []string{"TrafficPermission", "MeshTrafficPermission", "Other"}[c.N(3)],
		Source:      c.Tags(),
		Destination: c.Tags(),
		Protocol:    []resource.Protocol{resource.ProtocolAny, resource.TCP, resource.UDP, resource.ICMP}[c.N(4)],
		Port:        []uint32{0, 22, 80, 8080}[c.N(4)],
	}
}

// Describe lists resources as their documents, one a line (a failure
// message).
func Describe(rs []resource.Resource) string {
	s := ""
	for _, r := range rs {
		b, _ := resource.EncodeJSON(r)
		s += "\n  " + string(b)
	}
	return s
}

// SeedBytes returns 64 pseudo-random bytes for test world i (zero bytes would
// generate empty worlds: every choice would take its first option).
func SeedBytes(i int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], uint64(i))
	b := make([]byte, 64)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// InvAddresses and InvPrincipals are what workloads hold.
var (
	InvAddresses  = []string{"10.0.0.1", "10.0.1.5", "192.168.1.1", "2001:db8::1", "10.0.0.7", "10.0.0.8"}
	InvPrincipals = []string{"spiffe://m/web", "spiffe://m/backend", "urn:x"}
	// AskAddresses and AskPrincipals add what no workload holds: other
	// spellings, external addresses, Kuma SPIFFE IDs of this mesh and another.
	AskAddresses  = append([]string{"::ffff:10.0.0.1", "2001:DB8::1", "10.0.0.99", "192.168.9.9"}, InvAddresses...)
	AskPrincipals = append([]string{"spiffe://m/redis", "spiffe://other/web", "spiffe://m/a/b"}, InvPrincipals...)
)

// Workload is a workload as the model sees it.
type Workload struct {
	W     *resource.Workload
	Valid bool // the first claimant of each of its addresses: the engine holds it valid
}

// Inventory generates the workloads of mesh "m", some of them invalid for
// an address an earlier one claims.
func Inventory(c *Choices) []Workload {
	n := c.N(7)
	out := make([]Workload, n)
	for i := range out {
		tags := c.Tags()
		delete(tags, resource.IPTag)
		delete(tags, resource.PrincipalTag)
		w := &resource.Workload{Mesh: "m", Name: fmt.Sprintf("w%d", i), Tags: tags,
			Meta: resource.Meta{CreateRevision: int64(i + 1), ModRevision: int64(i + 1)}}
		for _, a := range InvAddresses {
			if c.Chance(20) {
				w.Addresses = append(w.Addresses, a)
			}
		}
		if c.Chance(70) {
			w.Principal = InvPrincipals[c.N(len(InvPrincipals))]
		}
		for k := c.N(3); k > 0; k-- {
			p := resource.WorkloadPort{Port: []uint32{22, 80, 8080}[c.N(3)]}
			if c.Chance(80) {
				p.Tags = c.Tags()
				delete(p.Tags, resource.IPTag)
				delete(p.Tags, resource.PrincipalTag)
			}
			w.Ports = append(w.Ports, p)
		}
		out[i] = Workload{W: w}
	}
	// An address belongs to its first (earliest-written) claimant; a workload
	// is valid when it is the first claimant of each of its addresses.
	first := map[string]int{}
	for i, m := range out {
		for _, a := range m.W.Addresses {
			if _, ok := first[a]; !ok {
				first[a] = i
			}
		}
	}
	for i := range out {
		out[i].Valid = true
		for _, a := range out[i].W.Addresses {
			if first[a] != i {
				out[i].Valid = false
			}
		}
	}
	return out
}

// Endpoint returns an endpoint of any form: a workload of inv (or one not
// there), an address, a principal, an identity (some unknown) or tags.
func Endpoint(c *Choices, inv []Workload) inventory.Endpoint {
	pick := func() *resource.Workload {
		if len(inv) == 0 {
			return &resource.Workload{Name: "none"}
		}
		return inv[c.N(len(inv))].W
	}
	switch c.N(5) {
	case 0:
		return inventory.Endpoint{Workload: pick().Name}
	case 1:
		return inventory.Endpoint{Address: AskAddresses[c.N(len(AskAddresses))]}
	case 2:
		return inventory.Endpoint{Principal: AskPrincipals[c.N(len(AskPrincipals))]}
	case 3:
		if c.Chance(10) {
			return inventory.Endpoint{Identity: 12345}
		}
		return inventory.Endpoint{Identity: resource.Identity("m", pick().Tags)}
	}
	return inventory.Endpoint{Tags: c.Tags()}
}
