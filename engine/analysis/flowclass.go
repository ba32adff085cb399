package analysis

import (
	"fmt"
	"slices"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// FlowClass is a protocol and a range of ports that every policy of a type
// treats alike (docs/analysis.md): Port, a port of the range, is decided for
// all of them. Lo and Hi are the range (0 and 0: no port given); ICMP
// ignores ports and has one class.
type FlowClass struct {
	Protocol resource.Protocol
	Port     uint32
	Lo, Hi   uint32
}

// String is "TCP 8000-8099", "TCP 5432", "ICMP", "no protocol".
func (c FlowClass) String() string {
	switch {
	case c.Protocol == resource.ProtocolAny && c.Port == 0:
		return "no protocol"
	case c.Port == 0:
		return c.Protocol.String()
	}
	p := c.Protocol.String()
	if c.Protocol == resource.ProtocolAny {
		p = "any protocol"
	}
	if c.Lo == c.Hi {
		return fmt.Sprintf("%s %d", p, c.Lo)
	}
	return fmt.Sprintf("%s %d-%d", p, c.Lo, c.Hi)
}

// Covers reports whether a flow's protocol and port fall in the class.
func (c FlowClass) Covers(proto resource.Protocol, port uint32) bool {
	if proto != c.Protocol {
		return false
	}
	if proto == resource.ICMP {
		return true
	}
	if c.Port == 0 {
		return port == 0
	}
	return port >= c.Lo && port <= c.Hi
}

// FlowClasses returns the classes of flows that the policies of mesh and typ
// tell apart, over the snapshots given (Impact asks before and after a
// change): TCP and UDP on each range of ports between the bounds the
// policies name and the ports the mesh's workloads give tags to (plus the
// ports outside every bound), ICMP, and no protocol with no port. Every flow
// with a protocol of TCP, UDP or ICMP and a port, or with neither, is in
// exactly one class and is decided as the class's Port.
func FlowClasses(mesh, typ string, snaps ...*engine.Snapshot) []FlowClass {
	if mesh == "" {
		mesh = resource.DefaultMesh
	}
	if typ == "" {
		typ = resource.DefaultType
	}
	cuts := map[uint32]bool{}
	cut := func(lo, hi uint32) {
		cuts[lo] = true
		if hi < 65535 {
			cuts[hi+1] = true
		}
	}
	for _, s := range snaps {
		if p, err := s.Partition(mesh, typ); err == nil {
			for pv := range p.Policies() {
				for _, e := range pv.Doc.Ports {
					ranges := e.Ranges
					if ranges == nil && e.Ports != "" {
						ranges, _ = resource.ParsePortRanges(e.Ports)
					}
					for _, r := range ranges {
						cut(uint32(r.Lo), uint32(r.Hi))
					}
				}
			}
		}
		if inv := s.Inventory(mesh); inv != nil {
			inv.ByName.Range(func(_ string, e *inventory.WorkloadEntry) bool {
				for _, p := range e.Workload.Ports {
					if p.Port > 0 && p.Port <= 65535 {
						cut(p.Port, p.Port)
					}
				}
				return true
			})
		}
	}
	cuts[1] = true
	points := make([]uint32, 0, len(cuts))
	for p := range cuts {
		points = append(points, p)
	}
	slices.Sort(points)
	var out []FlowClass
	for _, proto := range []resource.Protocol{resource.TCP, resource.UDP} {
		for i, lo := range points {
			hi := uint32(65535)
			if i+1 < len(points) {
				hi = points[i+1] - 1
			}
			out = append(out, FlowClass{Protocol: proto, Port: lo, Lo: lo, Hi: hi})
		}
	}
	return append(out, FlowClass{Protocol: resource.ICMP}, FlowClass{Protocol: resource.ProtocolAny})
}

// ClassOf returns the class among classes that a flow's protocol and port
// fall in; false when none does.
func ClassOf(classes []FlowClass, proto resource.Protocol, port uint32) (FlowClass, bool) {
	for _, c := range classes {
		if c.Covers(proto, port) {
			return c, true
		}
	}
	return FlowClass{}, false
}
