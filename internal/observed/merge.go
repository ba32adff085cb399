package observed

import (
	"fmt"
	"slices"
	"strings"

	"github.com/verdictpdp/verdict/engine/analysis"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Merge concatenates the sources' flows, each flow once: a flow seen
// by several sources (its mesh, type, ends as replayed, protocol and port)
// is one flow with their counts summed. A single source's flows are
// already distinct (a table's, or a file's records: each counted).
func Merge(sources [][]analysis.ObservedFlow) []analysis.ObservedFlow {
	n, nonEmpty := 0, 0
	for _, s := range sources {
		n += len(s)
		if len(s) > 0 {
			nonEmpty++
		}
	}
	if nonEmpty <= 1 {
		for _, s := range sources {
			if len(s) > 0 {
				return s
			}
		}
		return nil
	}
	type key struct {
		mesh, typ, src, dst string
		proto               resource.Protocol
		port                uint32
	}
	idx := make(map[key]int, n)
	out := make([]analysis.ObservedFlow, 0, n)
	var sb strings.Builder
	for _, s := range sources {
		for _, f := range s {
			k := key{mesh: f.Mesh, typ: f.Type, src: replayKey(&sb, &f.Source), dst: replayKey(&sb, &f.Destination),
				proto: f.Protocol, port: f.Port}
			if k.mesh == "" {
				k.mesh = resource.DefaultMesh
			}
			if k.typ == "" {
				k.typ = resource.DefaultType
			}
			if i, ok := idx[k]; ok {
				out[i].Count += f.Count
				continue
			}
			idx[k] = len(out)
			out = append(out, f)
		}
	}
	return out
}

// replayKey is an end as text: its form and reference, or its tags sorted.
func replayKey(sb *strings.Builder, e *inventory.Endpoint) string {
	switch {
	case e.Workload != "":
		return "w\x00" + e.Workload
	case e.Address != "":
		return "a\x00" + e.Address
	case e.Principal != "":
		return "p\x00" + e.Principal
	case e.Identity != 0:
		return fmt.Sprintf("i\x00%d", e.Identity)
	}
	keys := make([]string, 0, len(e.Tags))
	for k := range e.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	sb.Reset()
	sb.WriteString("t")
	for _, k := range keys {
		sb.WriteByte(0)
		sb.WriteString(k)
		sb.WriteByte(0)
		sb.WriteString(e.Tags[k])
	}
	return sb.String()
}
