package resource

// Kuma universal-format documents, rewritten into verdict's form before they
// are decoded (docs/kuma.md). The rewrite remembers where each rewritten field
// came from, so that an error names the field the user wrote
// (spec.from[0].default.action), not the one verdict decoded (from[0].action).

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// pathMap maps field paths of a normalized document back to the document as
// written: the longest entry that is a prefix of a path (at a field boundary)
// replaces that prefix.
type pathMap []pathRewrite

type pathRewrite struct{ from, to string }

func (pm *pathMap) add(from, to string) {
	if from != to {
		*pm = append(*pm, pathRewrite{from, to})
	}
}

// rewrite returns the path as the user wrote it.
func (pm pathMap) rewrite(field string) string {
	best := -1
	for i, r := range pm {
		if !pathHasPrefix(field, r.from) {
			continue
		}
		if best < 0 || len(r.from) > len(pm[best].from) {
			best = i
		}
	}
	if best < 0 {
		return field
	}
	return pm[best].to + field[len(pm[best].from):]
}

func pathHasPrefix(field, prefix string) bool {
	if !strings.HasPrefix(field, prefix) {
		return false
	}
	rest := field[len(prefix):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

// outOfScopeTypes are Kuma resource types verdict refuses whole, with why.
var outOfScopeTypes = map[string]string{
	"MeshHTTPRoute":        "routes decide where a request goes (paths, headers, backends); verdict decides whether a flow is allowed and which configuration applies to it, and does not model HTTP requests",
	"MeshTCPRoute":         "routes decide which backend a connection goes to; verdict decides whether a flow is allowed and which configuration applies to it, and does not model backends",
	"MeshGateway":          "built-in gateways are listeners with their own hostnames and routes, not workloads with tags; verdict does not model them",
	"MeshGatewayRoute":     "built-in gateway routes route requests at a gateway listener; verdict does not model gateways or routing",
	"MeshGatewayInstance":  "a gateway instance deploys a built-in gateway; verdict does not model gateways",
	"MeshGatewayConfig":    "a gateway configuration deploys built-in gateways; verdict does not model gateways",
	"VirtualOutbound":      "a virtual outbound generates hostnames and ports for outbound listeners; it allows nothing and configures no flow",
	"MeshService":          "verdict identifies a service by its kuma.io/service tag, not by a MeshService resource (a targetRef kind MeshService with a name reads as that tag)",
	"MeshExternalService":  "verdict decides between workloads with tags; it does not model external services",
	"MeshMultiZoneService": "verdict does not model multi-zone services; it decides on the tags of the workloads at both ends",
}

// outOfScopeKinds are targetRef kinds verdict refuses, with why.
var outOfScopeKinds = map[string]string{
	"MeshGateway":          "verdict does not model built-in gateways",
	"MeshHTTPRoute":        "verdict does not model HTTP routes",
	"MeshExternalService":  "verdict does not model external services",
	"MeshMultiZoneService": "verdict does not model multi-zone services",
}

// outOfScopeRefFields are targetRef fields verdict refuses, with why.
var outOfScopeRefFields = map[string]string{
	"sectionName": "verdict does not model the sections (named ports) of a resource; restrict the policy with ports, or decide on the flow's port",
	"proxyTypes":  "verdict does not tell gateways from sidecars: a workload is its tags",
	"namespace":   "verdict has no Kubernetes namespaces: select workloads by their tags (k8s.kuma.io/namespace)",
}

// kumaDoc is one document being normalized.
type kumaDoc struct {
	out   map[string]any
	pfx   string // "spec." when the document had a spec, else ""
	paths pathMap
	errs  *FieldErrors // errors with the user's paths
	scope *FieldErrors // out-of-scope errors: when any, the document gets only these
	// hadDefault: the document had a top-level default (a single-item policy)
	hadDefault bool
}

// normalizeKuma rewrites a Kuma universal-format document into verdict's form:
// type without kind is a Policy; spec is unwrapped; labels are ignored; no
// top-level targetRef is kind Mesh; a top-level default (single-item policies)
// is the policy's conf; rules items are from items; a dataplane policy's
// selectors are its sources with destinations [{}]; an item's default is its
// action and conf; targetRef kind Dataplane with labels selects by tags. Errors
// found here go to errs with the user's paths; a document verdict does not
// model gets one error saying so, and nothing else (outOfScope true). The
// returned pathMap maps the decoder's paths back to the user's.
func normalizeKuma(m map[string]any, errs *FieldErrors) (out map[string]any, paths pathMap, outOfScope bool) {
	_, hasKind := m["kind"]
	_, hasType := m["type"]
	_, hasSpec := m["spec"]
	_, hasLabels := m["labels"]
	kind, _ := m["kind"].(string)
	if !hasSpec && !hasLabels && (hasKind || !hasType) && (kind != "Policy" || !needsRewrite(m)) {
		return m, nil, false
	}
	d := &kumaDoc{out: make(map[string]any, len(m)+4), errs: errs, scope: &FieldErrors{}}
	for k, v := range m {
		d.out[k] = v
	}
	if !hasKind && hasType {
		if t, _ := m["type"].(string); t != "" {
			if why, ok := outOfScopeTypes[t]; ok {
				errs.Add("type", fmt.Sprintf("%s is outside what verdict models: %s", t, why))
				return nil, nil, true
			}
		}
		d.out["kind"] = "Policy"
	}
	delete(d.out, "labels")
	if hasSpec {
		d.pfx = "spec."
		delete(d.out, "spec")
		spec, ok := m["spec"].(map[string]any)
		if !ok && m["spec"] != nil {
			errs.Add("spec", "must be an object")
		}
		for k, v := range spec {
			if _, dup := d.out[k]; dup {
				errs.Add("spec."+k, "is also given outside spec")
				continue
			}
			d.out[k] = v
			d.paths.add(k, "spec."+k)
		}
	}
	if d.out["kind"] != "Policy" {
		return d.out, d.paths, false
	}
	d.targetRefs()
	if len(d.scope.errs) > 0 {
		errs.errs = append(errs.errs, d.scope.errs...)
		return nil, nil, true
	}
	d.selectors()
	d.topDefault()
	d.rules()
	d.itemDefaults()
	d.meshTarget()
	return d.out, d.paths, false
}

// needsRewrite reports whether a document in verdict's own form (kind given)
// still uses one of Kuma's forms.
func needsRewrite(m map[string]any) bool {
	for _, k := range []string{"rules", "selectors", "default"} {
		if _, ok := m[k]; ok {
			return true
		}
	}
	if refNeedsRewrite(m["targetRef"]) {
		return true
	}
	for _, list := range []string{"from", "to"} {
		items, _ := m[list].([]any)
		for _, it := range items {
			im, ok := it.(map[string]any)
			if !ok {
				continue
			}
			if _, has := im["default"]; has || refNeedsRewrite(im["targetRef"]) {
				return true
			}
		}
	}
	return false
}

func refNeedsRewrite(v any) bool {
	tr, ok := v.(map[string]any)
	if !ok {
		return false
	}
	if _, ok := tr["labels"]; ok {
		return true
	}
	for k := range outOfScopeRefFields {
		if _, ok := tr[k]; ok {
			return true
		}
	}
	kind, _ := tr["kind"].(string)
	_, out := outOfScopeKinds[kind]
	return out
}

// targetRefs rewrites the top-level targetRef and every item's: kind Dataplane
// (or Proxy) with labels selects by those labels as tags; the fields and kinds
// verdict does not model are refused, one error each.
func (d *kumaDoc) targetRefs() {
	if tr, ok := d.out["targetRef"].(map[string]any); ok {
		d.out["targetRef"] = d.targetRef(tr, "targetRef")
	}
	for _, list := range []string{"from", "to"} {
		items, ok := d.out[list].([]any)
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
			tr, ok := im["targetRef"].(map[string]any)
			if !ok {
				continue
			}
			ni := copyMap(im)
			ni["targetRef"] = d.targetRef(tr, fmt.Sprintf("%s[%d].targetRef", list, i))
			newItems[i] = ni
		}
		d.out[list] = newItems
	}
}

func (d *kumaDoc) targetRef(tr map[string]any, path string) map[string]any {
	user := d.user(path)
	for _, f := range sortedFields(tr) {
		if why, ok := outOfScopeRefFields[f]; ok {
			d.scope.Add(user+"."+f, why)
		}
	}
	kind, _ := tr["kind"].(string)
	if why, ok := outOfScopeKinds[kind]; ok {
		d.scope.Add(user+".kind", fmt.Sprintf("%s is outside what verdict models: %s", kind, why))
	}
	labels, hasLabels := tr["labels"]
	if !hasLabels {
		return tr
	}
	switch kind {
	case "Dataplane", "Proxy":
		out := copyMap(tr)
		delete(out, "labels")
		if _, both := tr["tags"]; both {
			d.errs.Add(user+".labels", "is given with tags; use one")
			return out
		}
		out["tags"] = labels
		d.paths.add(path+".tags", user+".labels")
		return out
	case "MeshService", "Service":
		d.scope.Add(user+".labels", "labels on kind MeshService select MeshService resources, which verdict does not model; name the service instead (its kuma.io/service tag)")
	}
	return tr
}

// user returns the user's path of a field of the normalized document.
func (d *kumaDoc) user(path string) string { return d.paths.rewrite(path) }

// selectors reads a dataplane policy's selectors (seed 001) as its sources,
// with destinations [{}]: the policy applies to every flow from the proxies it
// selects. Kuma's empty selector list matches every proxy.
func (d *kumaDoc) selectors() {
	sel, ok := d.out["selectors"]
	if !ok {
		return
	}
	delete(d.out, "selectors")
	_, hasSources := d.out["sources"]
	_, hasDestinations := d.out["destinations"]
	if hasSources || hasDestinations {
		d.errs.Add(d.pfx+"selectors", "a dataplane policy's selectors are its sources: give selectors or sources/destinations, not both")
		return
	}
	if l, ok := sel.([]any); ok && len(l) == 0 {
		sel = []any{map[string]any{}}
	}
	d.out["sources"] = sel
	d.out["destinations"] = []any{map[string]any{}}
	d.paths.add("sources", d.pfx+"selectors")
}

// topDefault reads a single-item policy's top-level default (MeshTrace,
// MeshMetric, MeshProxyPatch, MeshPassthrough) as a merge defaults block: the
// configuration of the workloads its targetRef selects, which Resolve
// answers. Merge, as Kuma merges the defaults of the policies that select a
// proxy: a more specific policy's keys win, a less specific one fills in the
// keys it left out.
func (d *kumaDoc) topDefault() {
	def, ok := d.out["default"]
	if !ok {
		return
	}
	delete(d.out, "default")
	d.hadDefault = true
	for _, k := range []string{"conf", "defaults", "overrides"} {
		if _, both := d.out[k]; both {
			d.errs.Add(d.pfx+"default", fmt.Sprintf("is given with %s; use one", k))
			return
		}
	}
	if _, ok := def.(map[string]any); !ok {
		d.errs.Add(d.pfx+"default", "must be an object")
		return
	}
	d.out["defaults"] = map[string]any{"strategy": "merge", "rules": def}
	d.paths.add("defaults.rules", d.pfx+"default")
	d.paths.add("defaults", d.pfx+"default")
}

// rules reads Kuma's inbound rules (Kuma >= 2.10) as from items. A rule
// without matches applies to every peer (one item, kind Mesh); a rule with
// matches gives one item per match, its peer the selector the match compiles
// to. MeshTrafficPermission's rules carry their matches in default.deny,
// default.allow and default.allowWithShadowDeny: one item per match, denies
// first, then the shadow denies (an enforced ALLOW and an audit DENY, so a
// flow that also matches an allow is still a would-be deny), then the allows.
func (d *kumaDoc) rules() {
	v, ok := d.out["rules"]
	if !ok {
		return
	}
	delete(d.out, "rules")
	rpath := d.pfx + "rules"
	if v == nil {
		return
	}
	list, ok := v.([]any)
	if !ok {
		d.errs.Add(rpath, "must be a list")
		return
	}
	if items, _ := d.out["from"].([]any); len(items) > 0 {
		d.errs.Add(rpath, "rules and from cannot be given together (Kuma refuses it too)")
		return
	}
	if len(list) > MaxItems {
		d.errs.Add(rpath, fmt.Sprintf("has %d rules, over the limit of %d", len(list), MaxItems))
		return
	}
	typ, _ := d.out["type"].(string)
	var items []any
	for i, r := range list {
		path := fmt.Sprintf("%s[%d]", rpath, i)
		rm, ok := r.(map[string]any)
		if !ok {
			d.errs.Add(path, "must be an object")
			continue
		}
		for _, k := range sortedFields(rm) {
			if k != "default" && k != "matches" {
				d.errs.Add(path+"."+k, unknownField(k, fieldSchema{"default": nil, "matches": nil}))
			}
		}
		def, _ := rm["default"].(map[string]any)
		if rm["default"] != nil && def == nil {
			d.errs.Add(path+".default", "must be an object")
			continue
		}
		if typ == "MeshTrafficPermission" {
			if _, has := rm["matches"]; has {
				d.errs.Add(path+".matches", "unknown field (MeshTrafficPermission rules match in default.allow and default.deny)")
			}
			items = d.permissionRule(items, path, def)
			continue
		}
		matches, hasMatches := rm["matches"]
		if !hasMatches || matches == nil {
			items = d.ruleItem(items, path, map[string]any{"kind": "Mesh"}, path, def)
			continue
		}
		ml, ok := matches.([]any)
		if !ok || len(ml) == 0 {
			d.errs.Add(path+".matches", "must be a list of at least one match (leave it out to match every peer)")
			continue
		}
		for j, mv := range ml {
			mpath := fmt.Sprintf("%s.matches[%d]", path, j)
			if tr, ok := d.match(mpath, mv); ok {
				items = d.ruleItem(items, path, tr, mpath, def)
			}
		}
	}
	if len(items) > MaxItems {
		d.errs.Add(rpath, fmt.Sprintf("give %d items, over the limit of %d", len(items), MaxItems))
		return
	}
	d.out["from"] = items
	if typ == "MeshTrafficPermission" && len(items) > 0 {
		// Kuma applies the denies of every policy's rules before any allow.
		d.out["denyFirst"] = true
		d.paths.add("denyFirst", rpath)
	}
}

// ruleItem appends the from item of one rule (and match): its peer is tr, its
// default the item's action and conf.
func (d *kumaDoc) ruleItem(items []any, rulePath string, tr map[string]any, matchPath string, def map[string]any) []any {
	k := len(items)
	item := map[string]any{"targetRef": tr}
	conf := make(Object, len(def))
	for key, v := range def {
		if key == "action" {
			item["action"] = v
			continue
		}
		conf[key] = v
	}
	if len(conf) > 0 {
		item["conf"] = conf
	}
	base := fmt.Sprintf("from[%d]", k)
	d.paths.add(base, rulePath)
	d.paths.add(base+".targetRef", matchPath)
	d.paths.add(base+".action", rulePath+".default.action")
	d.paths.add(base+".conf", rulePath+".default")
	return append(items, item)
}

// permissionRule appends the items of one MeshTrafficPermission rule.
func (d *kumaDoc) permissionRule(items []any, path string, def map[string]any) []any {
	found := false
	for _, k := range sortedFields(def) {
		switch k {
		case "deny", "allow", "allowWithShadowDeny":
		default:
			d.errs.Add(path+".default."+k, unknownField(k, fieldSchema{"deny": nil, "allow": nil, "allowWithShadowDeny": nil})+
				" (a rule's default holds allow, deny and allowWithShadowDeny)")
		}
	}
	for _, list := range []struct{ key, action string }{{"deny", "Deny"}, {"allowWithShadowDeny", "AllowWithShadowDeny"}, {"allow", "Allow"}} {
		v, ok := def[list.key]
		if !ok || v == nil {
			continue
		}
		lpath := path + ".default." + list.key
		ml, ok := v.([]any)
		if !ok {
			d.errs.Add(lpath, "must be a list of matches")
			continue
		}
		for j, mv := range ml {
			found = true
			mpath := fmt.Sprintf("%s[%d]", lpath, j)
			tr, ok := d.match(mpath, mv)
			if !ok {
				continue
			}
			k := len(items)
			base := fmt.Sprintf("from[%d]", k)
			d.paths.add(base, mpath)
			d.paths.add(base+".targetRef", mpath)
			d.paths.add(base+".action", lpath)
			items = append(items, map[string]any{"targetRef": tr, "action": list.action})
		}
	}
	if !found {
		d.errs.Add(path, "at least one of 'allow', 'allowWithShadowDeny', 'deny' has to be defined")
	}
	return items
}

// match compiles one Kuma match to the targetRef of an item's peer: the peer's
// SPIFFE ID is its principal (docs/kuma.md), Exact → a tag match, Prefix → a
// Prefix expression.
func (d *kumaDoc) match(path string, v any) (map[string]any, bool) {
	mm, ok := v.(map[string]any)
	if !ok {
		d.errs.Add(path, "must be an object")
		return nil, false
	}
	ok = true
	for _, k := range sortedFields(mm) {
		switch k {
		case "spiffeID":
		case "sni":
			d.errs.Add(path+".sni", "verdict does not see the TLS SNI of a connection; match on the peer's spiffeID")
			ok = false
		default:
			d.errs.Add(path+"."+k, "unknown field")
			ok = false
		}
	}
	sm, isMap := mm["spiffeID"].(map[string]any)
	if !isMap {
		if ok {
			d.errs.Add(path+".spiffeID", "is required: {type: Exact | Prefix, value}")
		}
		return nil, false
	}
	so := newObj(d.errs, path+".spiffeID", sm)
	typ := so.str("type")
	value := so.str("value")
	so.finish()
	if value == "" {
		d.errs.Add(path+".spiffeID.value", "is required")
		return nil, false
	}
	switch typ {
	case "Exact":
		return map[string]any{"kind": "MeshSubset", "tags": map[string]any{PrincipalTag: value}}, ok
	case "Prefix":
		return map[string]any{"kind": "MeshSubset", "expressions": []any{
			map[string]any{"key": PrincipalTag, "operator": "Prefix", "values": []any{value}},
		}}, ok
	case "":
		d.errs.Add(path+".spiffeID.type", "is required: Exact or Prefix")
	default:
		d.errs.Add(path+".spiffeID.type", fmt.Sprintf("%q is not Exact or Prefix", typ))
	}
	return nil, false
}

// itemDefaults reads each from/to item's default as its action and conf.
func (d *kumaDoc) itemDefaults() {
	for _, list := range []string{"from", "to"} {
		items, ok := d.out[list].([]any)
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
			user := d.user(path)
			if _, a := im["action"]; a {
				d.errs.Add(user+".default", "is given with action; use one")
			}
			if _, c := im["conf"]; c {
				d.errs.Add(user+".default", "is given with conf; use one")
			}
			ni := make(map[string]any, len(im)+1)
			for k, v := range im {
				if k != "default" {
					ni[k] = v
				}
			}
			dm, ok := def.(map[string]any)
			if !ok && def != nil {
				d.errs.Add(user+".default", "must be an object")
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
			d.paths.add(path+".action", user+".default.action")
			d.paths.add(path+".conf", user+".default")
			newItems[i] = ni
		}
		d.out[list] = newItems
	}
}

// meshTarget gives a targetRef-form policy without a top-level targetRef the
// kind Mesh (Kuma: "semantically equivalent to kind: Mesh").
func (d *kumaDoc) meshTarget() {
	if _, ok := d.out["targetRef"]; ok {
		return
	}
	if _, ok := d.out["sources"]; ok {
		return
	}
	if _, ok := d.out["destinations"]; ok {
		return
	}
	_, from := d.out["from"]
	_, to := d.out["to"]
	if from || to || d.hadDefault {
		d.out["targetRef"] = map[string]any{"kind": "Mesh"}
	}
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// rewriteErrors rewrites the fields of errors found in a normalized document
// to the user's paths.
func rewriteErrors(errs []FieldError, pm pathMap) {
	if len(pm) == 0 {
		return
	}
	sort.SliceStable(pm, func(i, j int) bool { return len(pm[i].from) > len(pm[j].from) })
	for i := range errs {
		errs[i].Field = pm.rewrite(errs[i].Field)
	}
}

// sortedFields returns the keys of m in order.
func sortedFields(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}
