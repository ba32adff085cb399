package resource

// Tags are a workload's tags.
type Tags = map[string]string

// ServiceTag and NameTag are the Kuma tags targetRef kinds compile to.
const (
	ServiceTag = "kuma.io/service"
	NameTag    = "kuma.io/name"
)

// TargetSelector is the selector a targetRef compiles to (docs/resources.md).
func TargetSelector(t TargetRef) *Selector {
	match := map[string]string{}
	switch t.Kind {
	case TargetMeshSubset:
		for k, v := range t.Tags {
			match[k] = v
		}
	case TargetService:
		match[ServiceTag] = t.Name
	case TargetServiceSubset:
		for k, v := range t.Tags {
			match[k] = v
		}
		match[ServiceTag] = t.Name
	case TargetProxy:
		if t.Name != "" {
			match[NameTag] = t.Name
		}
		for k, v := range t.Tags {
			match[k] = v
		}
	}
	return &Selector{Match: match, Expressions: t.Expressions}
}
