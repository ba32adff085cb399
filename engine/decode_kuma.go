package engine

// Kuma universal-format documents, rewritten into verdict's form before they
// are decoded (docs/kuma.md).

import (
	"fmt"
)

// normalizeKuma rewrites a Kuma universal-format document into verdict's form.
func normalizeKuma(m map[string]any, errs *errList) map[string]any {
	_, hasKind := m["kind"]
	_, hasType := m["type"]
	_, hasSpec := m["spec"]
	_, hasLabels := m["labels"]
	if !hasSpec && !hasLabels && (hasKind || !hasType) && !itemsHaveDefault(m) {
		return m
	}
	out := make(map[string]any, len(m)+4)
	for k, v := range m {
		out[k] = v
	}
	if !hasKind && hasType {
		out["kind"] = "Policy"
	}
	delete(out, "labels")
	if hasSpec {
		delete(out, "spec")
		spec, ok := m["spec"].(map[string]any)
		if !ok && m["spec"] != nil {
			errs.add("spec", "must be an object")
		}
		for k, v := range spec {
			if _, dup := out[k]; dup {
				errs.add("spec."+k, "is also given outside spec")
				continue
			}
			out[k] = v
		}
	}
	for _, list := range []string{"from", "to"} {
		items, ok := out[list].([]any)
		if !ok {
			continue
		}
		newItems := make([]any, len(items))
		for i, it := range items {
			newItems[i] = it
			im, ok := it.(map[string]any)
			if !ok {
				continue
			}
			def, has := im["default"]
			if !has {
				continue
			}
			path := fmt.Sprintf("%s[%d]", list, i)
			if _, a := im["action"]; a {
				errs.add(path+".default", "is given with action; use one")
			}
			if _, c := im["conf"]; c {
				errs.add(path+".default", "is given with conf; use one")
			}
			ni := make(map[string]any, len(im)+1)
			for k, v := range im {
				if k != "default" {
					ni[k] = v
				}
			}
			dm, ok := def.(map[string]any)
			if !ok && def != nil {
				errs.add(path+".default", "must be an object")
			}
			conf := make(Object, len(dm))
			for k, v := range dm {
				if k == "action" {
					ni["action"] = v
					continue
				}
				conf[k] = v
			}
			if len(conf) > 0 {
				ni["conf"] = conf
			}
			newItems[i] = ni
		}
		out[list] = newItems
	}
	return out
}

func itemsHaveDefault(m map[string]any) bool {
	for _, list := range []string{"from", "to"} {
		items, _ := m[list].([]any)
		for _, it := range items {
			if im, ok := it.(map[string]any); ok {
				if _, has := im["default"]; has {
					return true
				}
			}
		}
	}
	return false
}
