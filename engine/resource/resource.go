package resource

import (
	"fmt"
	"strings"
	"time"
)

// Action is what a rule, a catch-all or a mesh default does with a flow.
type Action uint8

// Actions. ActionUnset means "not given" in a document; every place that reads an
// action resolves it to ALLOW or DENY with the documented default.
const (
	ActionUnset Action = iota
	Allow
	Deny
)

func (a Action) String() string {
	switch a {
	case Allow:
		return "ALLOW"
	case Deny:
		return "DENY"
	}
	return ""
}

// Or returns a, or def when a is unset.
func (a Action) Or(def Action) Action {
	if a == ActionUnset {
		return def
	}
	return a
}

// Mode says whether a policy's or a scope's rules are enforced or only
// audited (docs/audit.md): audit rules decide the shadow decision alone.
type Mode uint8

// Modes. The zero value enforces.
const (
	ModeEnforce Mode = iota
	ModeAudit
)

var modeNames = []string{"Enforce", "Audit"}

func (m Mode) String() string { return modeNames[m] }

// Rank places a policy in the Absolute or the Default phase of the order.
type Rank uint8

// Ranks.
const (
	RankDefault Rank = iota
	RankAbsolute
)

func (r Rank) String() string {
	if r == RankAbsolute {
		return "Absolute"
	}
	return "Default"
}

// TieBreak orders equally specific rules of a mesh (docs/order.md, key 5).
type TieBreak uint8

// Tie-breaks. TieBreakUnset is "not given": the mesh's profile chooses, else Name.
const (
	TieBreakUnset TieBreak = iota
	TieBreakName
	TieBreakNewestCreated
	TieBreakNewestModified
)

var tieBreakNames = []string{"", "Name", "NewestCreated", "NewestModified"}

func (t TieBreak) String() string { return tieBreakNames[t] }

// ItemOrder orders the from/to items of one targetRef policy (docs/order.md, key 6).
type ItemOrder uint8

// Item orders. ItemOrderUnset is "not given": the mesh's profile chooses, else
// FirstWins.
const (
	ItemOrderUnset ItemOrder = iota
	FirstWins
	LastWins
)

var itemOrderNames = []string{"", "FirstWins", "LastWins"}

// Profile sets a mesh's defaults to those of a product (docs/resources.md): a
// field set on the Mesh beats the profile, which beats verdict's defaults.
type Profile uint8

// Profiles.
const (
	ProfileNone Profile = iota
	ProfileKuma
	ProfileKongMesh
)

var profileNames = []string{"", "Kuma", "KongMesh"}

func (p Profile) String() string { return profileNames[p] }

// Select is how the policies of one type are chosen for a flow (docs/order.md).
type Select uint8

// Selections. SelectUnset is "not given": the mesh's profile chooses, else
// Aggregate. Aggregate is the order of docs/order.md; PerDestination chooses
// one policy per inbound by its destination selector first, as Kong Mesh (and
// Kuma's legacy code) does.
const (
	SelectUnset Select = iota
	SelectAggregate
	SelectPerDestination
)

var selectNames = []string{"", "Aggregate", "PerDestination"}

func (s Select) String() string { return selectNames[s] }

func (o ItemOrder) String() string { return itemOrderNames[o] }

// Combine is how the rules of one policy type decide a side (docs/order.md).
type Combine uint8

// Combining algorithms.
const (
	FirstMatch Combine = iota
	DenyOverrides
)

var combineNames = []string{"FirstMatch", "DenyOverrides"}

func (c Combine) String() string { return combineNames[c] }

// Protocol of a flow or of a port entry. ProtocolAny on a flow means "not given";
// on a port entry it means "every protocol".
type Protocol uint8

// Protocols.
const (
	ProtocolAny Protocol = iota
	TCP
	UDP
	ICMP
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case ICMP:
		return "ICMP"
	}
	return ""
}

// ParseProtocol reads a flow's protocol: "", "TCP", "UDP" or "ICMP" (any case).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "":
		return ProtocolAny, nil
	case "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "ICMP":
		return ICMP, nil
	}
	return ProtocolAny, fmt.Errorf("protocol %q is not TCP, UDP, ICMP or empty", s)
}

// TargetKind is the level of a targetRef; a greater level is more specific.
type TargetKind uint8

// targetRef kinds, least specific first.
const (
	TargetMesh TargetKind = iota
	TargetMeshSubset
	TargetService
	TargetServiceSubset
	TargetProxy
)

var targetKindNames = []string{"Mesh", "MeshSubset", "Service", "ServiceSubset", "Proxy"}

func (k TargetKind) String() string { return targetKindNames[k] }

// Strategy of a defaults or overrides block (docs/resolve.md).
type Strategy uint8

// Strategies.
const (
	Atomic Strategy = iota
	Merge
)

func (s Strategy) String() string {
	if s == Merge {
		return "merge"
	}
	return "atomic"
}

// Operator of a selector expression (docs/selectors.md).
type Operator uint8

// Operators.
const (
	OpIn Operator = iota
	OpNotIn
	OpExists
	OpDoesNotExist
	OpPrefix
	OpCIDR
)

var operatorNames = []string{"In", "NotIn", "Exists", "DoesNotExist", "Prefix", "CIDR"}

func (o Operator) String() string { return operatorNames[o] }

// Object is an opaque JSON object: a policy's conf, a block's rules, a merged
// configuration. Values are string, json.Number, bool, nil, []any and Object
// (map[string]any). Objects held by a snapshot are shared and must not be modified.
type Object = map[string]any

// DefaultMesh is the mesh of a resource that names none.
const DefaultMesh = "default"

// DefaultType is the policy type of a policy that names none.
const DefaultType = "TrafficPermission"

// Meta is what the store knows of a resource beyond its document. The times are
// part of the document (the server stamps them on write; test suites may set them);
// the revisions and the value hash are the store's and never part of the document.
type Meta struct {
	CreationTime     time.Time
	ModificationTime time.Time
	CreateRevision   int64
	ModRevision      int64
	// ValueHash is the SHA-256 of the stored bytes the resource was decoded from
	// (Snapshot.Digest); zero when it did not come from a store.
	ValueHash [32]byte
}

// Resource is a Mesh, a Scope, a Policy or a Workload. Resources are immutable
// once decoded.
type Resource interface {
	// Key identifies the resource; it is unique in a store.
	Key() Key
	// Metadata returns the resource's times and revisions.
	Metadata() Meta
	// WithMeta returns a copy of the resource with m as its metadata.
	WithMeta(m Meta) Resource
}

// Mesh holds the settings of a policy domain. A mesh without a Mesh document has
// the defaults shown in docs/resources.md.
type Mesh struct {
	Name             string
	DefaultAction    Action // unset = DENY
	UnenforcedAction Action // unset = ALLOW
	TieBreak         TieBreak
	ItemOrder        ItemOrder
	Profile          Profile
	Types            map[string]TypeSettings
	// InvalidResources: what the mesh does with stored resources that do not
	// validate (invalid.go); the zero value fails closed.
	InvalidResources InvalidResources
	StrictTypes      bool // refuse policies of types neither built in nor in Types (types.go)
	Meta             Meta
}

// TypeSettings overrides a mesh's settings for one policy type.
type TypeSettings struct {
	Combine          Combine
	DefaultAction    Action
	UnenforcedAction Action
	Select           Select
	TieBreak         TieBreak // unset: the mesh's (docs/order.md, key 5)
}

// Scope is a named set of workloads, nested under a parent (Secure Workload scopes).
type Scope struct {
	Mesh          string
	Name          string
	Parent        string
	Priority      int32
	Selectors     []Selector
	CatchAll      Action
	CatchAllTypes []string // nil means [TrafficPermission]
	Enforced      bool
	// Mode Audit covers the scope's child scopes, its catch-all and its
	// policies: none of them takes part in the enforced decision.
	Mode Mode
	Meta Meta
}

// Selector selects workloads by their tags (docs/selectors.md).
type Selector struct {
	Match       map[string]string
	Expressions []Expression
}

// Expression is one set-based requirement of a selector.
type Expression struct {
	Key      string
	Operator Operator
	Values   []string
}

// PortEntry restricts a policy to a protocol and, optionally, port ranges.
type PortEntry struct {
	Protocol Protocol // ProtocolAny: every protocol
	Ports    string   // as written: "80,443,8000-8100"; empty: every port
	Ranges   []PortRange
}

type PortRange struct{ Lo, Hi uint16 }

// TargetRef attaches a policy to workloads, or names the peer of an item (seed 002).
// Kind Proxy selects one proxy by Name, proxies by Tags (Kuma's Dataplane
// labels), or with neither every proxy. Expressions (MeshSubset only) hold
// what tags cannot: Kuma's spiffeID Prefix matches.
type TargetRef struct {
	Kind        TargetKind
	Name        string
	Tags        map[string]string
	Expressions []Expression
}

// Level is the targetRef's specificity (docs/order.md, key 4): seed 002's
// Proxy > ServiceSubset > Service > MeshSubset > Mesh, with Kuma's Dataplane
// by labels (or every Dataplane) above Mesh and below MeshSubset, as Kuma
// orders its kinds.
func (t TargetRef) Level() int16 {
	if t.Kind == TargetProxy && t.Name == "" {
		return 1
	}
	return 2 * int16(t.Kind)
}

// Item is one from or to entry of a targetRef policy.
type Item struct {
	TargetRef TargetRef
	Action    Action // unset = ALLOW
	// ShadowDeny (Kuma's AllowWithShadowDeny; Action is ALLOW): the item is
	// also an audit DENY, ordered just before its enforced ALLOW.
	ShadowDeny bool
	Conf       Object
}

// ItemActionText is the item's action as its document writes it:
// "AllowWithShadowDeny" for a shadow-deny item, else the action ("" unset).
func (it *Item) ItemActionText() string {
	if it.ShadowDeny {
		return "AllowWithShadowDeny"
	}
	return it.Action.String()
}

// Block is a defaults or overrides block (seed 003).
type Block struct {
	Strategy Strategy
	When     string
	Rules    Object
	Program  *WhenProgram // When compiled and type-checked
}

// Policy is a rule set of one type in one mesh, in source & destination form
// (Sources, Destinations) or targetRef form (TargetRef with From, To, Defaults,
// Overrides or Conf).
type Policy struct {
	Mesh         string
	Name         string
	Type         string
	Scope        string
	Rank         Rank
	Priority     int32
	Sources      []Selector
	Destinations []Selector
	Ports        []PortEntry
	Action       Action // unset = ALLOW
	Conf         Object
	TargetRef    *TargetRef
	From         []Item
	To           []Item
	Defaults     *Block
	Overrides    *Block
	Unset        []string
	Mode         Mode // Audit: the rules decide the shadow decision only
	// DenyFirst (Kuma's MeshTrafficPermission rules): the policy's DENY items
	// come before every item that is not such a DENY, of every policy of its
	// mesh and type (docs/order.md, key 2).
	DenyFirst bool
	Meta      Meta
}

// IsTargetRef reports whether the policy is in targetRef form.
func (p *Policy) IsTargetRef() bool { return p.TargetRef != nil }

// HasItems reports whether the policy has from or to items.
func (p *Policy) HasItems() bool { return len(p.From) > 0 || len(p.To) > 0 }

// HasBlocks reports whether the policy has a defaults or an overrides block.
func (p *Policy) HasBlocks() bool { return p.Defaults != nil || p.Overrides != nil }

// Key implements Resource.
func (m *Mesh) Key() Key { return Key{Kind: KindMesh, Mesh: m.Name} }

// Key implements Resource.
func (s *Scope) Key() Key { return Key{Kind: KindScope, Mesh: s.Mesh, Name: s.Name} }

// Key implements Resource.
func (p *Policy) Key() Key { return Key{Kind: KindPolicy, Mesh: p.Mesh, Type: p.Type, Name: p.Name} }

// Metadata implements Resource.
func (m *Mesh) Metadata() Meta { return m.Meta }

// Metadata implements Resource.
func (s *Scope) Metadata() Meta { return s.Meta }

// Metadata implements Resource.
func (p *Policy) Metadata() Meta { return p.Meta }

// WithMeta implements Resource.
func (m *Mesh) WithMeta(meta Meta) Resource { c := *m; c.Meta = meta; return &c }

// WithMeta implements Resource.
func (s *Scope) WithMeta(meta Meta) Resource { c := *s; c.Meta = meta; return &c }

// WithMeta implements Resource.
func (p *Policy) WithMeta(meta Meta) Resource { c := *p; c.Meta = meta; return &c }

// Kind is the kind of a resource.
type Kind uint8

// Kinds.
const (
	KindMesh Kind = iota + 1
	KindScope
	KindPolicy
	KindWorkload
)

func (k Kind) String() string {
	switch k {
	case KindMesh:
		return "Mesh"
	case KindScope:
		return "Scope"
	case KindPolicy:
		return "Policy"
	case KindWorkload:
		return "Workload"
	}
	return ""
}

// ParseKind reads "Mesh", "Scope", "Policy" or "Workload".
func ParseKind(s string) (Kind, bool) {
	switch s {
	case "Mesh":
		return KindMesh, true
	case "Scope":
		return KindScope, true
	case "Policy":
		return KindPolicy, true
	case "Workload":
		return KindWorkload, true
	}
	return 0, false
}

// Key identifies a resource: a mesh, a scope of a mesh, or a policy of a mesh and type.
type Key struct {
	Kind Kind
	Mesh string
	Type string // policies only
	Name string // scopes, policies and workloads
}

// String is the key without prefix: "default/mesh", "default/scopes/Apps",
// "default/policies/TrafficPermission/web-to-api", "default/workloads/web-1".
func (k Key) String() string {
	switch k.Kind {
	case KindMesh:
		return k.Mesh + "/mesh"
	case KindScope:
		return k.Mesh + "/scopes/" + k.Name
	case KindPolicy:
		return k.Mesh + "/policies/" + k.Type + "/" + k.Name
	case KindWorkload:
		return k.Mesh + "/workloads/" + k.Name
	}
	return ""
}

// ParseKey reads a key as String writes it ("default/scopes/Apps"). It
// accepts exactly those three forms, with valid names. Where keys are stored
// (the etcd prefix) is the store's business, not the engine's.
func ParseKey(rest string) (Key, error) {
	parts := strings.Split(rest, "/")
	var k Key
	switch {
	case len(parts) == 2 && parts[1] == "mesh":
		k = Key{Kind: KindMesh, Mesh: parts[0]}
	case len(parts) == 3 && parts[1] == "scopes":
		k = Key{Kind: KindScope, Mesh: parts[0], Name: parts[2]}
	case len(parts) == 4 && parts[1] == "policies":
		k = Key{Kind: KindPolicy, Mesh: parts[0], Type: parts[2], Name: parts[3]}
	case len(parts) == 3 && parts[1] == "workloads":
		k = Key{Kind: KindWorkload, Mesh: parts[0], Name: parts[2]}
	default:
		return Key{}, fmt.Errorf("key %q is not <mesh>/mesh, <mesh>/scopes/<name>, <mesh>/policies/<type>/<name> or <mesh>/workloads/<name>", rest)
	}
	names := []string{k.Mesh}
	switch k.Kind {
	case KindScope, KindWorkload:
		names = append(names, k.Name)
	case KindPolicy:
		names = append(names, k.Type, k.Name)
	}
	for _, s := range names {
		if err := CheckName(s); err != nil {
			return Key{}, fmt.Errorf("key %q: %v", rest, err)
		}
	}
	return k, nil
}

// InvalidResources is what a mesh does with stored resources that do not
// validate (the Mesh's invalidResources).
type InvalidResources uint8

// InvalidResources values.
const (
	// InvalidDeny: fail closed (the default).
	InvalidDeny InvalidResources = iota
	// InvalidSkip: leave the invalid resources out and decide with the rest.
	InvalidSkip
)

var invalidResourcesNames = []string{"Deny", "Skip"}

func (v InvalidResources) String() string { return invalidResourcesNames[v] }
