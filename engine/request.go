package engine

import (
	"fmt"
	"sort"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Validate checks a request's fields; the error is a *ValidationError naming them.
func (r *Request) Validate() error {
	var errs resource.FieldErrors
	if r.Mesh != "" {
		if err := resource.CheckName(r.Mesh); err != nil {
			errs.Add("mesh", err.Error())
		}
	}
	if r.Type != "" {
		if err := resource.CheckName(r.Type); err != nil {
			errs.Add("type", err.Error())
		}
	}
	checkSide(&errs, "source", r.Source, r.SourceEndpoint)
	checkSide(&errs, "destination", r.Destination, r.DestinationEndpoint)
	if r.Port > 65535 {
		errs.Add("port", fmt.Sprintf("%d is not a port (0 = not given, 1 to 65535)", r.Port))
	}
	if r.Protocol > resource.ICMP {
		errs.Add("protocol", "must be TCP, UDP, ICMP or empty")
	}
	return errs.Err()
}

// checkSide checks one end of a flow: its tag form, or its endpoint (exactly
// one form; a valid address, name, principal).
func checkSide(errs *resource.FieldErrors, field string, tags resource.Tags, ep *inventory.Endpoint) {
	if ep == nil {
		if err := resource.CheckTags(tags); err != nil {
			errs.Add(field+".tags", err.Error())
		}
		return
	}
	if tags != nil {
		errs.Add(field+".tags", "give the tags in the endpoint, not beside it")
	}
	ep.Check(errs, field)
}

// CheckApply validates a write against the snapshot as a dry run (docs/api.md
// and docs/suites.md): puts and deletes are applied to a copy at the next revision, and the
// write is refused if two of its puts share a key, or if afterwards any resource
// it writes, or any resource that was valid before, is invalid (mixed forms, a
// scope cycle, an unknown parent or scope). Field paths name the put
// ("resources[2]") or, for a resource the write would break, its key.
func (s *Snapshot) CheckApply(puts []resource.Resource, deletes []resource.Key) error {
	_, err := s.checkApply(puts, deletes)
	return err
}

// checkApply is CheckApply; it also returns the changes it checked, stamped
// as the store would stamp them at the next revision.
func (s *Snapshot) checkApply(puts []resource.Resource, deletes []resource.Key) ([]Change, error) {
	var errs resource.FieldErrors
	seen := make(map[string]int, len(puts)+len(deletes))
	changes := make([]Change, 0, len(puts)+len(deletes))
	rev := s.revision + 1
	for i, r := range puts {
		k := r.Key().String()
		if j, dup := seen[k]; dup {
			errs.Add(fmt.Sprintf("resources[%d]", i), fmt.Sprintf("%s is also written by resources[%d]: one call writes a key once", k, j))
			continue
		}
		seen[k] = i
		m := r.Metadata()
		if m.CreateRevision == 0 {
			m.CreateRevision = rev
			if old, ok := s.Get(r.Key()); ok {
				m.CreateRevision = old.Resource.Metadata().CreateRevision
			}
		}
		m.ModRevision = rev
		changes = append(changes, Put(r.WithMeta(m)))
	}
	for _, k := range deletes {
		if _, dup := seen[k.String()]; dup {
			errs.Add(k.String(), "is both written and deleted in one call")
			continue
		}
		seen[k.String()] = -1
		changes = append(changes, Delete(k))
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	before := map[string]bool{}
	for _, inv := range s.Invalid() {
		before[inv.Path] = true
	}
	after := s.apply(rev, changes, true) // validity only: no rule index is updated
	invalid := after.Invalid()
	sort.Slice(invalid, func(i, j int) bool { return invalid[i].Path < invalid[j].Path })
	for _, inv := range invalid {
		idx, written := seen[inv.Path]
		switch {
		case written && idx >= 0:
			errs.Add(fmt.Sprintf("resources[%d]", idx), inv.Err.Error())
		case !before[inv.Path]:
			errs.Add(RenderPath(inv.Path), "this write would make it invalid: "+inv.Err.Error())
		}
	}
	return changes, errs.Err()
}

// Entry is a stored resource as the snapshot holds it.
type Entry struct {
	Resource resource.Resource
	Err      error // why the resource is invalid; nil when valid
}

// Get returns the resource at k, valid or not.
func (s *Snapshot) Get(k resource.Key) (Entry, bool) {
	ms, ok := s.meshes.Get(k.Mesh)
	if !ok {
		return Entry{}, false
	}
	switch k.Kind {
	case resource.KindMesh:
		if ms.doc == nil {
			return Entry{}, false
		}
		return Entry{Resource: ms.doc}, true
	case resource.KindScope:
		sd, ok := ms.scopeDocs.Get(k.Name)
		if !ok {
			return Entry{}, false
		}
		var err error
		if why, bad := ms.scopes.invalid[k.Name]; bad {
			err = resource.Invalid("parent", why)
		}
		return Entry{Resource: sd, Err: err}, true
	case resource.KindPolicy:
		ts, ok := ms.types.Get(k.Type)
		if !ok {
			return Entry{}, false
		}
		cp, ok := ts.policies.Get(k.Name)
		if !ok {
			return Entry{}, false
		}
		var err error
		if cp.err != "" {
			err = resource.Invalid("", cp.err)
		}
		return Entry{Resource: cp.p, Err: err}, true
	case resource.KindWorkload:
		if ms.inv == nil {
			return Entry{}, false
		}
		e, ok := ms.inv.ByName.Get(k.Name)
		if !ok {
			return Entry{}, false
		}
		return entryOf(e), true
	}
	return Entry{}, false
}

// Invalid lists every stored resource verdict does not use, with the reason:
// broken values and resources in conflict with earlier ones.
func (s *Snapshot) Invalid() []InvalidResource {
	var out []InvalidResource
	s.broken.Range(func(_ string, b *InvalidResource) bool {
		out = append(out, *b)
		return true
	})
	s.meshes.Range(func(_ string, ms *meshState) bool {
		for name, why := range ms.scopes.invalid {
			sd, _ := ms.scopeDocs.Get(name)
			out = append(out, InvalidResource{Path: sd.Key().String(), Key: sd.Key(), Resource: sd,
				Err: resource.Invalid("parent", why), ModRevision: sd.Meta.ModRevision})
		}
		if ms.inv != nil && ms.inv.Invalid > 0 {
			ms.inv.ByName.Range(func(_ string, e *inventory.WorkloadEntry) bool {
				if e.Err != "" {
					out = append(out, InvalidResource{Path: e.Workload.Key().String(), Key: e.Workload.Key(), Resource: e.Workload,
						Err: entryOf(e).Err, ModRevision: e.Workload.Meta.ModRevision})
				}
				return true
			})
		}
		ms.types.Range(func(_ string, ts *typeState) bool {
			if ts.invalid == 0 {
				return true
			}
			ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
				if cp.err != "" {
					out = append(out, InvalidResource{Path: cp.p.Key().String(), Key: cp.p.Key(), Resource: cp.p,
						Err: resource.Invalid("", cp.err), ModRevision: cp.p.Meta.ModRevision})
				}
				return true
			})
			return true
		})
		return true
	})
	return out
}

// Resources calls f for every decoded resource (valid or in conflict), mesh by
// mesh, until f returns false. Broken values are listed by Invalid.
func (s *Snapshot) Resources(f func(Entry) bool) {
	s.meshes.Range(func(_ string, ms *meshState) bool {
		if ms.doc != nil && !f(Entry{Resource: ms.doc}) {
			return false
		}
		cont := true
		ms.scopeDocs.Range(func(name string, sd *resource.Scope) bool {
			var err error
			if why, bad := ms.scopes.invalid[name]; bad {
				err = resource.Invalid("parent", why)
			}
			cont = f(Entry{Resource: sd, Err: err})
			return cont
		})
		if !cont {
			return false
		}
		ms.types.Range(func(_ string, ts *typeState) bool {
			ts.policies.Range(func(_ string, cp *compiledPolicy) bool {
				var err error
				if cp.err != "" {
					err = resource.Invalid("", cp.err)
				}
				cont = f(Entry{Resource: cp.p, Err: err})
				return cont
			})
			return cont
		})
		if cont && ms.inv != nil {
			ms.inv.ByName.Range(func(_ string, e *inventory.WorkloadEntry) bool {
				cont = f(entryOf(e))
				return cont
			})
		}
		return cont
	})
}

// entryOf is the workload as Snapshot.Get shows it.
func entryOf(e *inventory.WorkloadEntry) Entry {
	var err error
	if e.Err != "" {
		err = resource.Invalid("", e.Err)
	}
	return Entry{Resource: e.Workload, Err: err}
}
