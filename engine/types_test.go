package engine_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestUnknownTypeIsNotFound: a type a mesh does not know is an error naming
// the nearest known types for Decide, Resolve and RulesFor, never an answer
// (issue 18: "TraficPermission" answered ALLOW UNENFORCED).
func TestUnknownTypeIsNotFound(t *testing.T) {
	t.Parallel()
	world := []resource.Resource{
		&resource.Mesh{Name: "shop", Types: map[string]resource.TypeSettings{"Declared": {}}},
		&resource.Scope{Mesh: "shop", Name: "apps", Selectors: []resource.Selector{{Match: map[string]string{"app": "*"}}},
			CatchAll: resource.Deny, CatchAllTypes: []string{"CatchAllOnly"}, Enforced: true},
		&resource.Policy{Mesh: "shop", Name: "p", Type: "Used", Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}, Action: resource.Allow},
		&resource.Policy{Mesh: "other", Name: "q", Type: "UsedElsewhere", Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}, Action: resource.Allow},
	}
	snap := engine.Build(1, world)
	tests := []struct {
		typ     string
		known   bool
		nearest []string
	}{
		{"TrafficPermission", true, nil},
		{"", true, nil}, // the default type
		{"MeshTrafficPermission", true, nil},
		{"MeshOPA", true, nil},
		{"Declared", true, nil},
		{"CatchAllOnly", true, nil},
		{"Used", true, nil},
		{"TraficPermission", false, []string{"TrafficPermission"}},
		{"TrafficPermision", false, []string{"TrafficPermission"}},
		{"trafficpermission", false, []string{"TrafficPermission"}},
		{"MeshTraficPermission", false, []string{"MeshTrafficPermission"}},
		{"Declred", false, []string{"Declared"}},
		{"UsedElsewhere", false, nil}, // known in mesh "other" only
		{"Zzzzzzzzzzzzzz", false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.typ, func(t *testing.T) {
			t.Parallel()
			check := func(what string, err error) {
				t.Helper()
				if tt.known {
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					return
				}
				var ute *engine.UnknownTypeError
				if !errors.Is(err, engine.ErrTypeNotFound) || !errors.As(err, &ute) {
					t.Fatalf("%s: err = %v, want ErrTypeNotFound", what, err)
				}
				if !reflect.DeepEqual(ute.Nearest, tt.nearest) {
					t.Fatalf("%s: nearest = %v, want %v", what, ute.Nearest, tt.nearest)
				}
				if len(tt.nearest) > 0 && !strings.Contains(err.Error(), "did you mean "+tt.nearest[0]+"?") {
					t.Fatalf("%s: %q does not suggest %s", what, err, tt.nearest[0])
				}
			}
			src, dst := resource.Tags{"app": "web"}, resource.Tags{"app": "db"}
			for _, explain := range []bool{false, true} {
				for try := 0; try < 2; try++ { // the second answer may come from the cache
					_, err := snap.Decide(&engine.Request{Mesh: "shop", Type: tt.typ, Source: src, Destination: dst, Explain: explain})
					check("Decide", err)
				}
			}
			_, err := snap.Resolve(&engine.ResolveRequest{Mesh: "shop", Type: tt.typ, Source: src, Destination: dst})
			if tt.known && err != nil && errors.Is(err, resource.ErrInvalid) {
				err = nil // a known type may need more of the request; not this test's concern
			}
			check("Resolve", err)
			_, err = snap.RulesFor("shop", tt.typ, src)
			check("RulesFor", err)
		})
	}
}

// TestTypeKnownFollowsChanges: a type used only by a policy stops being known
// when the policy goes, and a Mesh declaring it makes it known again.
func TestTypeKnownFollowsChanges(t *testing.T) {
	t.Parallel()
	p := &resource.Policy{Mesh: "m", Name: "p", Type: "Custom", Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}, Action: resource.Allow}
	s1 := engine.Build(1, []resource.Resource{&resource.Mesh{Name: "m"}, p})
	req := &engine.Request{Mesh: "m", Type: "Custom", Source: resource.Tags{"a": "b"}, Destination: resource.Tags{"a": "c"}}
	if _, err := s1.Decide(req); err != nil {
		t.Fatalf("used type: %v", err)
	}
	s2 := s1.Apply(2, []engine.Change{engine.Delete(p.Key())})
	if _, err := s2.Decide(req); !errors.Is(err, engine.ErrTypeNotFound) {
		t.Fatalf("after the delete: err = %v, want ErrTypeNotFound", err)
	}
	s3 := s2.Apply(3, []engine.Change{engine.Put(&resource.Mesh{Name: "m", Types: map[string]resource.TypeSettings{"Custom": {}}})})
	if _, err := s3.Decide(req); err != nil {
		t.Fatalf("declared: %v", err)
	}
}

func TestTypeWarnings(t *testing.T) {
	t.Parallel()
	pol := func(typ string) *resource.Policy {
		return &resource.Policy{Mesh: "m", Name: "p", Type: typ, Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}, Action: resource.Allow}
	}
	lax := &resource.Mesh{Name: "m", Types: map[string]resource.TypeSettings{"Custom": {}}}
	strict := &resource.Mesh{Name: "m", StrictTypes: true, Types: map[string]resource.TypeSettings{"Custom": {}}}
	tests := []struct {
		name    string
		stored  []resource.Resource
		puts    []resource.Resource
		warning string // substring of the one warning; "" for none
		err     string // substring of the error; "" for none
	}{
		{"built in", []resource.Resource{lax}, []resource.Resource{pol("TrafficPermission")}, "", ""},
		{"declared", []resource.Resource{lax}, []resource.Resource{pol("Custom")}, "", ""},
		{"typo warns", []resource.Resource{lax}, []resource.Resource{pol("TrafficPermision")},
			`resources[0] (m/policies/TrafficPermision/p): type "TrafficPermision" is neither built in nor declared in mesh "m"'s types; did you mean TrafficPermission?`, ""},
		{"typo of a declared type", []resource.Resource{lax}, []resource.Resource{pol("Custm")}, "did you mean Custom?", ""},
		{"no mesh document warns", nil, []resource.Resource{pol("Whatever")}, `type "Whatever" is neither built in`, ""},
		{"strict refuses", []resource.Resource{strict}, []resource.Resource{pol("TrafficPermision")}, "", "resources[0].type: "},
		{"strict allows declared", []resource.Resource{strict}, []resource.Resource{pol("Custom")}, "", ""},
		{"strict mesh in the same write", []resource.Resource{lax}, []resource.Resource{strict, pol("Undeclared")}, "", "resources[1].type"},
		{"lax mesh in the same write", []resource.Resource{strict}, []resource.Resource{lax, pol("Undeclared")}, "Undeclared", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			warnings, err := engine.Build(1, tt.stored).TypeWarnings(tt.puts)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("err = %v", err)
			case tt.err != "" && (err == nil || !errors.Is(err, resource.ErrInvalid) || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("err = %v, want ErrInvalid with %q", err, tt.err)
			}
			if tt.warning == "" {
				if len(warnings) > 0 {
					t.Fatalf("warnings = %q, want none", warnings)
				}
				return
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], tt.warning) {
				t.Fatalf("warnings = %q, want one with %q", warnings, tt.warning)
			}
		})
	}
}

func TestNearestNames(t *testing.T) {
	t.Parallel()
	names := []string{"TrafficPermission", "TrafficLog", "TrafficRoute", "MeshTrafficPermission", "Retry", "Timeout"}
	tests := []struct {
		in   string
		want []string
	}{
		{"TraficPermission", []string{"TrafficPermission"}},
		{"TrafficLig", []string{"TrafficLog"}},
		{"Traffic", []string{"TrafficLog"}},
		{"TrafficPremission", []string{"TrafficPermission"}}, // a transposition counts one
		{"TraffcLog", []string{"TrafficLog"}},
		{"Retyr", []string{"Retry"}},
		{"TrafficPermission", []string{"MeshTrafficPermission"}}, // itself is not a suggestion
		{"Unrelated", nil},
		{"", nil},
	}
	for _, tt := range tests {
		if got := resource.NearestNames(tt.in, names, 3); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("NearestNames(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// TestBuiltinTypes: the list holds the Kuma and Kong Mesh types the docs name.
func TestBuiltinTypes(t *testing.T) {
	t.Parallel()
	for _, typ := range []string{"TrafficPermission", "MeshTrafficPermission", "MeshHTTPRoute", "TrafficLog", "MeshOPA", "AuthPolicy"} {
		if !engine.IsBuiltinType(typ) {
			t.Errorf("%s is not built in", typ)
		}
	}
	if engine.IsBuiltinType("TraficPermission") {
		t.Error("a typo is built in")
	}
	l := engine.BuiltinTypes()
	for i := 1; i < len(l); i++ {
		if l[i-1] >= l[i] {
			t.Fatalf("BuiltinTypes not sorted and unique at %d: %q, %q", i, l[i-1], l[i])
		}
	}
}
