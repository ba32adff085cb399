package resource

// The per-kind decoders: Mesh, Scope and Policy with its targetRef, items and
// defaults/overrides blocks.

import (
	"fmt"
	"strconv"
)

func decodeMesh(o *obj) *Mesh {
	m := &Mesh{Name: o.name("name", true)}
	m.DefaultAction = o.action("defaultAction")
	m.UnenforcedAction = o.action("unenforcedAction")
	if s := o.str("profile"); s != "" {
		i := indexOf(profileNames, s)
		if i <= 0 {
			o.errs.Add(o.field("profile"), fmt.Sprintf("%q is not Kuma or KongMesh", s))
		} else {
			m.Profile = Profile(i)
		}
	}
	if s := o.str("tieBreak"); s != "" {
		i := indexOf(tieBreakNames, s)
		if i <= 0 {
			o.errs.Add(o.field("tieBreak"), fmt.Sprintf("%q is not Name, NewestCreated or NewestModified", s))
		} else {
			m.TieBreak = TieBreak(i)
		}
	}
	if s := o.str("itemOrder"); s != "" {
		i := indexOf(itemOrderNames, s)
		if i <= 0 {
			o.errs.Add(o.field("itemOrder"), fmt.Sprintf("%q is not FirstWins or LastWins", s))
		} else {
			m.ItemOrder = ItemOrder(i)
		}
	}
	if s := o.str("invalidResources"); s != "" {
		i := indexOf(invalidResourcesNames, s)
		if i < 0 {
			o.errs.Add(o.field("invalidResources"), fmt.Sprintf("%q is not Deny or Skip", s))
		} else {
			m.InvalidResources = InvalidResources(i)
		}
	}
	if types, ok := o.object("types"); ok {
		m.Types = make(map[string]TypeSettings, len(types))
		for t, v := range types {
			path := o.field("types") + "[" + strconv.Quote(t) + "]"
			if err := CheckName(t); err != nil {
				o.errs.Add(path, "type name: "+err.Error())
				continue
			}
			tm, ok := v.(map[string]any)
			if !ok {
				o.errs.Add(path, "must be an object")
				continue
			}
			to := newObj(o.errs, path, tm)
			var ts TypeSettings
			if s := to.str("combine"); s != "" {
				i := indexOf(combineNames, s)
				if i < 0 {
					o.errs.Add(to.field("combine"), fmt.Sprintf("%q is not FirstMatch or DenyOverrides", s))
				} else {
					ts.Combine = Combine(i)
				}
			}
			ts.DefaultAction = to.action("defaultAction")
			ts.UnenforcedAction = to.action("unenforcedAction")
			if s := to.str("select"); s != "" {
				i := indexOf(selectNames, s)
				if i <= 0 {
					o.errs.Add(to.field("select"), fmt.Sprintf("%q is not Aggregate or PerDestination", s))
				} else {
					ts.Select = Select(i)
				}
			}
			if s := to.str("tieBreak"); s != "" {
				i := indexOf(tieBreakNames, s)
				if i <= 0 {
					o.errs.Add(to.field("tieBreak"), fmt.Sprintf("%q is not Name, NewestCreated or NewestModified", s))
				} else {
					ts.TieBreak = TieBreak(i)
				}
			}
			to.finish()
			m.Types[t] = ts
		}
	}
	m.StrictTypes = o.boolean("strictTypes", false)
	m.Meta = o.meta()
	return m
}

func decodeScope(o *obj) *Scope {
	s := &Scope{Mesh: o.meshName(), Name: o.name("name", true), Enforced: true}
	s.Parent = o.name("parent", false)
	if s.Parent != "" && s.Parent == s.Name {
		o.errs.Add(o.field("parent"), "a scope cannot be its own parent")
	}
	s.Priority = o.int32("priority")
	s.Selectors = decodeSelectors(o, "selectors", true)
	s.CatchAll = o.action("catchAll")
	if l, ok := o.list("catchAllTypes"); ok {
		if len(l) == 0 {
			o.errs.Add(o.field("catchAllTypes"), "must name at least one type (leave it out for [TrafficPermission]; leave catchAll out for none)")
		}
		s.CatchAllTypes = make([]string, 0, len(l))
		for i, v := range l {
			t, ok := scalarText(v)
			path := fmt.Sprintf("%s[%d]", o.field("catchAllTypes"), i)
			if !ok {
				o.errs.Add(path, "must be a string")
				continue
			}
			if err := CheckName(t); err != nil {
				o.errs.Add(path, err.Error())
				continue
			}
			s.CatchAllTypes = append(s.CatchAllTypes, t)
		}
	}
	s.Enforced = o.boolean("enforced", true)
	s.Mode = o.mode()
	s.Meta = o.meta()
	return s
}

// mode reads a mode field: Enforce (the default) or Audit.
func (o *obj) mode() Mode {
	s := o.str("mode")
	switch s {
	case "", "Enforce":
		return ModeEnforce
	case "Audit":
		return ModeAudit
	}
	o.errs.Add(o.field("mode"), fmt.Sprintf("%q is not Enforce or Audit", s))
	return ModeEnforce
}

func decodeTargetRef(o *obj) TargetRef {
	var t TargetRef
	kind := o.str("kind")
	known := true
	switch kind {
	case "Mesh":
		t.Kind = TargetMesh
	case "MeshSubset":
		t.Kind = TargetMeshSubset
	case "Service", "MeshService":
		t.Kind = TargetService
	case "ServiceSubset", "MeshServiceSubset":
		t.Kind = TargetServiceSubset
	case "Proxy", "Dataplane":
		t.Kind = TargetProxy
	case "":
		known = false
		o.errs.Add(o.field("kind"), "is required: Mesh, MeshSubset, Service, ServiceSubset or Proxy (Kuma: MeshService, MeshServiceSubset, Dataplane)")
	default:
		known = false
		o.errs.Add(o.field("kind"), fmt.Sprintf("%q is not Mesh, MeshSubset, Service, ServiceSubset or Proxy (Kuma: MeshService, MeshServiceSubset, Dataplane)", kind))
	}
	t.Name = o.str("name")
	t.Tags = o.stringMap("tags", false)
	if _, ok := o.m["expressions"]; ok {
		sel := decodeSelector(newObj(o.errs, o.path, map[string]any{"expressions": o.m["expressions"]}))
		o.used["expressions"] = struct{}{}
		t.Expressions = sel.Expressions
	}
	o.finish()
	if !known {
		// One error for a typo'd kind: what else the targetRef holds is
		// judged against the kind the user meant, which is unknown.
		return t
	}
	switch t.Kind {
	case TargetMesh, TargetMeshSubset:
		if t.Name != "" {
			o.errs.Add(o.field("name"), fmt.Sprintf("must be empty for kind %s", t.Kind))
		}
	case TargetProxy:
		// Kuma >= 2.10: a Dataplane by name, by labels (read as tags), or every one.
		if t.Name != "" && len(t.Tags) > 0 {
			o.errs.Add(o.field("tags"), "kind Proxy selects by name or by tags (Kuma: labels), not both")
		} else if t.Name != "" {
			if err := CheckTagValue(t.Name, false); err != nil {
				o.errs.addErr(o.field("name"), err)
			}
		}
	default:
		if t.Name == "" {
			o.errs.Add(o.field("name"), fmt.Sprintf("is required for kind %s", t.Kind))
		} else if err := CheckTagValue(t.Name, false); err != nil {
			o.errs.addErr(o.field("name"), err)
		}
	}
	switch t.Kind {
	case TargetMesh, TargetService:
		if len(t.Tags) > 0 {
			o.errs.Add(o.field("tags"), fmt.Sprintf("must be empty for kind %s", t.Kind))
		}
	}
	if len(t.Expressions) > 0 && t.Kind != TargetMeshSubset {
		o.errs.Add(o.field("expressions"), fmt.Sprintf("must be empty for kind %s (expressions belong to MeshSubset)", t.Kind))
	}
	return t
}

func decodeItems(o *obj, key string) []Item {
	l, ok := o.list(key)
	if !ok {
		return nil
	}
	if len(l) > MaxItems {
		o.errs.Add(o.field(key), fmt.Sprintf("has %d items, over the limit of %d", len(l), MaxItems))
		return nil
	}
	out := make([]Item, 0, len(l))
	for i, v := range l {
		path := fmt.Sprintf("%s[%d]", o.field(key), i)
		m, ok := v.(map[string]any)
		if !ok {
			o.errs.Add(path, "must be an object")
			continue
		}
		io := newObj(o.errs, path, m)
		var it Item
		if tr, ok := io.sub("targetRef"); ok {
			it.TargetRef = decodeTargetRef(tr)
		} else {
			o.errs.Add(io.field("targetRef"), "is required")
		}
		it.Action, it.ShadowDeny = io.itemAction("action") // Kuma's AllowWithShadowDeny: an enforced ALLOW and an audit DENY
		it.Conf = io.conf("conf")
		io.finish()
		out = append(out, it)
	}
	return out
}

func decodeBlock(o *obj, key string) *Block {
	bo, ok := o.sub(key)
	if !ok {
		return nil
	}
	b := &Block{}
	switch s := bo.str("strategy"); s {
	case "", "atomic":
	case "merge":
		b.Strategy = Merge
	default:
		o.errs.Add(bo.field("strategy"), fmt.Sprintf("%q is not atomic or merge", s))
	}
	b.When = bo.str("when")
	if b.When != "" {
		p, err := CompileWhen(b.When)
		if err != nil {
			o.errs.Add(bo.field("when"), err.Error())
		}
		b.Program = p
	}
	b.Rules = bo.conf("rules")
	if b.Rules == nil {
		o.errs.Add(bo.field("rules"), "is required: an object of named rules")
	}
	bo.finish()
	return b
}

func decodePolicy(o *obj) *Policy {
	p := &Policy{Mesh: o.meshName(), Name: o.name("name", true)}
	_, typeGiven := o.m["type"]
	p.Type = o.name("type", false)
	if p.Type == "" {
		if typeGiven {
			o.errs.Add(o.field("type"), "must not be empty")
		}
		p.Type = DefaultType
	}
	p.Scope = o.name("scope", false)
	switch r := o.str("rank"); r {
	case "", "Default":
	case "Absolute":
		p.Rank = RankAbsolute
	default:
		o.errs.Add(o.field("rank"), fmt.Sprintf("%q is not Default or Absolute", r))
	}
	p.Priority = o.int32("priority")
	_, hasSources := o.m["sources"]
	_, hasDestinations := o.m["destinations"]
	if hasSources || hasDestinations {
		p.Sources = decodeSelectors(o, "sources", true)
		p.Destinations = decodeSelectors(o, "destinations", true)
	}
	p.Ports = decodePorts(o)
	p.Action = o.action("action")
	p.Conf = o.conf("conf")
	if tr, ok := o.sub("targetRef"); ok {
		t := decodeTargetRef(tr)
		p.TargetRef = &t
	}
	p.From = decodeItems(o, "from")
	p.To = decodeItems(o, "to")
	p.Defaults = decodeBlock(o, "defaults")
	p.Overrides = decodeBlock(o, "overrides")
	if l, ok := o.list("unset"); ok {
		for i, v := range l {
			s, ok := scalarText(v)
			path := fmt.Sprintf("%s[%d]", o.field("unset"), i)
			if !ok || s == "" {
				o.errs.Add(path, "must be a rule name")
				continue
			}
			p.Unset = append(p.Unset, s)
		}
	}
	p.Mode = o.mode()
	p.DenyFirst = o.boolean("denyFirst", false)
	p.Meta = o.meta()
	checkPolicyForm(o, p, hasSources || hasDestinations)
	checkKumaItems(o, p)
	return p
}

// checkPolicyForm validates what a policy's fields mean together.
func checkPolicyForm(o *obj, p *Policy, sd bool) {
	tr := p.TargetRef != nil
	switch {
	case sd && tr:
		o.errs.Add(o.field("targetRef"), "a policy uses sources/destinations or targetRef, not both")
	case !sd && !tr:
		o.errs.Add("", "a policy needs sources and destinations, or a targetRef")
	}
	if sd {
		if len(p.From) > 0 || len(p.To) > 0 {
			o.errs.Add(o.field("from"), "from/to items need a targetRef policy, not sources/destinations")
		}
	}
	if tr {
		if p.Scope != "" {
			o.errs.Add(o.field("scope"), "a targetRef policy names no scope: its targetRef is its attachment")
		}
		if p.Action != ActionUnset {
			o.errs.Add(o.field("action"), "a targetRef policy sets the action on each from/to item")
		}
		if len(p.Ports) > 0 && !p.HasItems() {
			o.errs.Add(o.field("ports"), "ports restrict rules; a targetRef policy without from/to items has none")
		}
	}
	if p.DenyFirst && len(p.From) == 0 {
		o.errs.Add(o.field("denyFirst"), "orders from items: a policy without from items has none to order")
	}
	if p.HasItems() && p.HasBlocks() {
		o.errs.Add(o.field("defaults"), "from/to items and defaults/overrides blocks cannot be mixed")
	}
	if p.HasItems() && p.Conf != nil {
		o.errs.Add(o.field("conf"), "a policy with from/to items carries its conf on each item")
	}
	if p.Conf != nil && p.HasBlocks() {
		o.errs.Add(o.field("conf"), "conf is an atomic defaults block; use conf or defaults/overrides, not both")
	}
}
