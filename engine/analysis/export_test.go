package analysis

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// KeepMasks makes every bulk evaluation keep a class's masks from its first
// decision (on), or only from its second (off).
func KeepMasks(on bool) { keepAlways.Store(on) }

// SplitInterning makes every base of two workloads or more be interned by
// two Bulks, a half each (on), or only a large one (off).
func SplitInterning(on bool) { splitAlways.Store(on) }

// LintWithProofs is Lint, also returning a flow for each rule it found not
// shadowed (one it decides) or not redundant (one whose answer its removal
// changes).
func LintWithProofs(s *engine.Snapshot, req LintRequest) (*LintAnswer, []LintProof, error) {
	var proofs []LintProof
	req.proofs = &proofs
	ans, err := Lint(s, &req)
	return ans, proofs, err
}

// LintClasses returns the value classes lint splits a partition's keys
// into, a value of each ("" for the key absent), and a protocol and port of
// each port class.
func LintClasses(s *engine.Snapshot, mesh, typ string) (map[string][]string, []PortClass) {
	p, err := s.Partition(mesh, typ)
	if err != nil {
		return nil, nil
	}
	sp := newSpace(p, true)
	keys := map[string][]string{}
	for _, ks := range sp.keys {
		keys[ks.key] = ks.reps
	}
	var ports []PortClass
	for _, r := range sp.ports.reps {
		ports = append(ports, PortClass{r.proto, r.port})
	}
	return keys, ports
}

// PortClass is a protocol and port.
type PortClass struct {
	Protocol resource.Protocol
	Port     uint32
}

// SharesClasses reports whether two snapshots' bases of a partition share
// their classes: the later one carried them from the earlier.
func SharesClasses(a, b *engine.Snapshot, mesh, typ string) bool {
	pa, err := a.Partition(mesh, typ)
	if err != nil {
		return false
	}
	pb, err := b.Partition(mesh, typ)
	if err != nil {
		return false
	}
	ba, bb := baseOf(pa), baseOf(pb)
	return len(ba.tags) > 0 && len(bb.tags) > 0 && &ba.tags[0] == &bb.tags[0]
}
