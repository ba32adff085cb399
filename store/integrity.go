package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/verdictpdp/verdict/engine/resource"
)

// ErrIntegrity: the write would break at commit what must hold between
// resources — a policy naming a scope, or a scope naming a parent, that does
// not exist; a scope deleted while a policy or a child scope still names it
// (as Calico refuses to delete a tier that is not empty); or policies of one
// mesh and type in two forms (docs/storage.md, "One form per type"). Checked
// inside the transaction, so that two writers racing cannot together create
// what neither could alone. The error names the keys; nothing was written.
var ErrIntegrity = errors.New("referential integrity")

// Integrity is what a write needs to hold at commit so that no reference
// dangles: writes through the API cannot create dangling references
// (docs/storage.md). Both stores check it atomically with the write: store/memory
// under its lock, store/etcd with compares in the transaction (see Apply there).
type Integrity struct {
	// MustExist are the scopes that puts name (a policy's scope, a scope's
	// parent) and that the write does not put itself, sorted by key.
	MustExist []resource.Key
	// DeletedScopes are the scopes the write deletes: at commit no stored
	// policy may name one and no stored scope may have one as its parent,
	// except the resources the write itself puts or deletes.
	DeletedScopes []resource.Key
	// Forms are the forms the write's policies use, one per mesh and type,
	// sorted by mesh and type: at commit no other stored policy of that mesh
	// and type may use another (Form.Conflicts).
	Forms []Form
	// written holds the paths of every op's key.
	written map[string]bool
}

// CheckIntegrity returns what ops (with keys, from CheckOps) need at commit. A
// write that contradicts itself — a put naming a scope that another of its ops
// deletes — is ErrIntegrity at once.
func CheckIntegrity(ops []Op, keys []resource.Key) (Integrity, error) {
	in := Integrity{written: make(map[string]bool, len(ops))}
	deleted := map[resource.Key]int{}
	put := map[resource.Key]bool{}
	for i, op := range ops {
		in.written[keys[i].String()] = true
		if op.Resource == nil {
			deleted[keys[i]] = i
			if keys[i].Kind == resource.KindScope {
				in.DeletedScopes = append(in.DeletedScopes, keys[i])
			}
		} else {
			put[keys[i]] = true
		}
	}
	forms, err := writeForms(ops, keys)
	if err != nil {
		return Integrity{}, err
	}
	in.Forms = forms
	need := map[resource.Key]bool{}
	for i, op := range ops {
		sk, ok := scopeNamed(op.Resource)
		if !ok {
			continue
		}
		if j, del := deleted[sk]; del {
			return Integrity{}, fmt.Errorf("%w: ops[%d] (%s) names scope %s, which ops[%d] deletes", ErrIntegrity, i, keys[i].String(), sk.Name, j)
		}
		if !put[sk] {
			need[sk] = true
		}
	}
	for k := range need {
		in.MustExist = append(in.MustExist, k)
	}
	sort.Slice(in.MustExist, func(i, j int) bool { return in.MustExist[i].String() < in.MustExist[j].String() })
	sort.Slice(in.DeletedScopes, func(i, j int) bool { return in.DeletedScopes[i].String() < in.DeletedScopes[j].String() })
	return in, nil
}

// scopeNamed returns the scope a resource depends on: a policy's scope, a
// scope's parent.
func scopeNamed(r resource.Resource) (resource.Key, bool) {
	switch t := r.(type) {
	case *resource.Policy:
		if t.Scope != "" {
			return resource.Key{Kind: resource.KindScope, Mesh: t.Key().Mesh, Name: t.Scope}, true
		}
	case *resource.Scope:
		if t.Parent != "" {
			return resource.Key{Kind: resource.KindScope, Mesh: t.Key().Mesh, Name: t.Parent}, true
		}
	}
	return resource.Key{}, false
}

// DependentRanges are the path prefixes (without the store's prefix) under
// which a dependent of a deleted scope can be stored: per mesh, its policies
// and its scopes.
func (in Integrity) DependentRanges() []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range in.DeletedScopes {
		if !seen[k.Mesh] {
			seen[k.Mesh] = true
			out = append(out, k.Mesh+"/policies/", k.Mesh+"/scopes/")
		}
	}
	return out
}

// Dependent reports which deleted scope a stored value at path (without
// prefix) names, if any: a policy naming it as its scope, a scope naming it as
// its parent. Resources the write puts or deletes do not count (their new
// values are checked as puts); a value that does not decode names nothing (it
// is a broken value, which fails closed on its own).
func (in Integrity) Dependent(path string, value []byte) (resource.Key, bool) {
	if len(in.DeletedScopes) == 0 || in.written[path] {
		return resource.Key{}, false
	}
	k, err := resource.ParseKey(path)
	if err != nil || k.Kind != resource.KindPolicy && k.Kind != resource.KindScope {
		return resource.Key{}, false
	}
	var doc struct {
		Scope  string `json:"scope"`
		Parent string `json:"parent"`
	}
	if json.Unmarshal(value, &doc) != nil {
		return resource.Key{}, false
	}
	name := doc.Scope
	if k.Kind == resource.KindScope {
		name = doc.Parent
	}
	for _, d := range in.DeletedScopes {
		if name != "" && d.Mesh == k.Mesh && d.Name == name {
			return d, true
		}
	}
	return resource.Key{}, false
}

// Missing is the error of scopes named by the write that do not exist.
func Missing(keys []resource.Key) error {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.String()
	}
	return fmt.Errorf("%w: %s does not exist (deleted meanwhile?); a policy's scope and a scope's parent must exist", ErrIntegrity, strings.Join(names, ", "))
}

// InUse is the error of deleted scopes that stored resources still name
// (dependents: path as stored → the scope it names).
func InUse(dependents map[string]resource.Key) error {
	paths := make([]string, 0, len(dependents))
	for p := range dependents {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	const show = 5
	var parts []string
	for _, p := range paths[:min(len(paths), show)] {
		parts = append(parts, fmt.Sprintf("%s names %s", RenderPath(p), dependents[p].String()))
	}
	if len(paths) > show {
		parts = append(parts, fmt.Sprintf("and %d more", len(paths)-show))
	}
	return fmt.Errorf("%w: a scope with policies or child scopes cannot be deleted: %s", ErrIntegrity, strings.Join(parts, "; "))
}

// Form is how the policies of one mesh and type are written: all in targetRef
// form or all in sources/destinations form, and those with from/to items or
// defaults/overrides blocks all with the same kind (docs/storage.md). The
// engine makes the later-written offender of a mix invalid (which fails
// closed, or with invalidResources: Skip leaves a DENY out); the store refuses
// a write that would make one.
type Form struct {
	Mesh, Type string
	// Targeting is FormTargetRef or FormSourcesDestinations.
	Targeting string
	// Content is FormItems, FormBlocks, or "" when no policy of the write has
	// either (then any content goes with it).
	Content string
}

// Values of Form.Targeting and Form.Content.
const (
	FormTargetRef           = "targetRef"
	FormSourcesDestinations = "sources/destinations"
	FormItems               = "from/to items"
	FormBlocks              = "defaults/overrides blocks"
)

// FormOf returns the form of one policy. It reads what the engine reads when
// it resolves a mix (engine: IsTargetRef, hasItems, hasBlocks).
func FormOf(p *resource.Policy) Form {
	f := Form{Mesh: p.Mesh, Type: p.Type, Targeting: FormSourcesDestinations}
	if p.IsTargetRef() {
		f.Targeting = FormTargetRef
	}
	switch {
	case len(p.From) > 0 || len(p.To) > 0:
		f.Content = FormItems
	case p.Defaults != nil || p.Overrides != nil:
		f.Content = FormBlocks
	}
	return f
}

// StoredForm returns the form of a stored policy value; ok is false when the
// value is not a policy that decodes (a broken value fails closed on its own
// and claims no form).
func StoredForm(value []byte) (Form, bool) {
	r, err := resource.DecodeJSON(value)
	if err != nil {
		return Form{}, false
	}
	p, ok := r.(*resource.Policy)
	if !ok {
		return Form{}, false
	}
	return FormOf(p), true
}

// Conflicts returns how other, a form of another policy of f's mesh and type,
// mixes with f: "" when the two go together.
func (f Form) Conflicts(other Form) string {
	if other.Targeting != f.Targeting {
		return fmt.Sprintf("uses %s, the write %s", other.Targeting, f.Targeting)
	}
	if other.Content != "" && f.Content != "" && other.Content != f.Content {
		return fmt.Sprintf("has %s, the write %s", other.Content, f.Content)
	}
	return ""
}

// Range is the path prefix (without the store's prefix) of f's mesh and type.
func (f Form) Range() string { return f.Mesh + "/policies/" + f.Type + "/" }

// writeForms returns the form of each mesh and type the ops put policies in;
// two puts of one write in two forms are ErrIntegrity at once.
func writeForms(ops []Op, keys []resource.Key) ([]Form, error) {
	var forms []Form
	at := map[[2]string]int{} // mesh, type → index in forms
	first := map[[2]string]int{}
	for i, op := range ops {
		p, ok := op.Resource.(*resource.Policy)
		if !ok {
			continue
		}
		f := FormOf(p)
		mt := [2]string{f.Mesh, f.Type}
		j, seen := at[mt]
		if !seen {
			at[mt], first[mt] = len(forms), i
			forms = append(forms, f)
			continue
		}
		if why := forms[j].Conflicts(f); why != "" {
			return nil, fmt.Errorf("%w: ops[%d] (%s) and ops[%d] (%s) mix forms in type %s: a type's policies use one form",
				ErrIntegrity, first[mt], keys[first[mt]].String(), i, keys[i].String(), f.Type)
		}
		if forms[j].Content == "" {
			forms[j].Content = f.Content
		}
	}
	sort.Slice(forms, func(i, j int) bool {
		if forms[i].Mesh != forms[j].Mesh {
			return forms[i].Mesh < forms[j].Mesh
		}
		return forms[i].Type < forms[j].Type
	})
	return forms, nil
}

// FormConflict reports whether a stored value at path (without prefix) is a
// policy of one of the write's forms' mesh and type that mixes with it, and
// how. Resources the write puts or deletes do not count.
func (in Integrity) FormConflict(path string, value []byte) (string, bool) {
	if len(in.Forms) == 0 || in.written[path] {
		return "", false
	}
	for _, f := range in.Forms {
		if !strings.HasPrefix(path, f.Range()) {
			continue
		}
		stored, ok := StoredForm(value)
		if !ok {
			return "", false
		}
		if why := f.Conflicts(stored); why != "" {
			return why, true
		}
		return "", false
	}
	return "", false
}

// MixedForms is the error of stored policies whose forms mix with the
// write's (conflicts: path → how).
func MixedForms(conflicts map[string]string) error {
	paths := make([]string, 0, len(conflicts))
	for p := range conflicts {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	const show = 5
	var parts []string
	for _, p := range paths[:min(len(paths), show)] {
		parts = append(parts, fmt.Sprintf("%s %s", RenderPath(p), conflicts[p]))
	}
	if len(paths) > show {
		parts = append(parts, fmt.Sprintf("and %d more", len(paths)-show))
	}
	return fmt.Errorf("%w: a type's policies use one form (written meanwhile?): %s", ErrIntegrity, strings.Join(parts, "; "))
}
