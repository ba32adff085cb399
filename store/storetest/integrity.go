package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// scope is a scope of mesh default named name under parent ("" for none).
func scope(name, parent string) resource.Resource {
	return &resource.Scope{Mesh: "default", Name: name, Parent: parent, Enforced: true,
		Selectors: []resource.Selector{{Match: map[string]string{"team": name}}}}
}

// denyIn is an Absolute DENY of every flow, in scope.
func denyIn(name, scope string) resource.Resource {
	return &resource.Policy{Mesh: "default", Name: name, Type: resource.DefaultType, Scope: scope, Rank: resource.RankAbsolute,
		Action: resource.Deny, Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}}
}

func del(r resource.Resource) store.Op { return store.Op{Key: r.Key()} }

// sdPolicy is a sources/destinations policy of typ: action for every flow.
func sdPolicy(name, typ string, action resource.Action) resource.Resource {
	return &resource.Policy{Mesh: "default", Name: name, Type: typ, Action: action,
		Sources: []resource.Selector{{}}, Destinations: []resource.Selector{{}}}
}

// trPolicy is a targetRef policy of typ with one from item (action) or, with
// blocks, a defaults block.
func trPolicy(t testing.TB, name, typ string, action resource.Action, blocks bool) resource.Resource {
	body := fmt.Sprintf(`"from":[{"targetRef":{"kind":"Mesh"},"action":%q}]`, action.String())
	if blocks {
		body = `"defaults":{"rules":{"timeout":"5s"}}`
	}
	return Decode(t, fmt.Sprintf(`{"kind":"Policy","mesh":"default","type":%q,"name":%q,"targetRef":{"kind":"Mesh"},%s}`, typ, name, body))
}

func runIntegrity(t *testing.T, newHarness Factory) {
	t.Run("references must hold at commit", func(t *testing.T) {
		// Each case starts from scope A with child A:B, policy p in A:B, and
		// scope Empty; ok false: ErrIntegrity, nothing written.
		cases := []struct {
			name string
			ops  []store.Op
			ok   bool
		}{
			{"a policy in a scope that does not exist", []store.Op{Put(denyIn("q", "Nope"))}, false},
			{"a scope under a parent that does not exist", []store.Op{Put(scope("C", "Nope"))}, false},
			{"deleting a scope a policy names", []store.Op{del(scope("A:B", "A"))}, false},
			{"deleting a scope with a child scope", []store.Op{del(scope("A", ""))}, false},
			{"deleting a scope and a policy another one names", []store.Op{del(scope("A", "")), del(denyIn("p", "A:B"))}, false},
			{"a policy naming a scope the same write deletes", []store.Op{Put(denyIn("q", "Empty")), del(scope("Empty", ""))}, false},
			{"deleting an empty scope", []store.Op{del(scope("Empty", ""))}, true},
			{"deleting a scope with its policy", []store.Op{del(scope("A:B", "A")), del(denyIn("p", "A:B"))}, true},
			{"deleting a whole tree at once", []store.Op{del(scope("A", "")), del(scope("A:B", "A")), del(denyIn("p", "A:B"))}, true},
			{"moving the policy out, then deleting its scope", []store.Op{Put(denyIn("p", "A")), del(scope("A:B", "A"))}, true},
			{"a scope and a policy in it, in one write", []store.Op{Put(scope("C", "A")), Put(denyIn("q", "C"))}, true},
			{"a policy in an existing scope", []store.Op{Put(denyIn("q", "Empty"))}, true},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				st := newHarness(t).Store
				before := Apply(t, st, Put(scope("A", "")), Put(scope("A:B", "A")), Put(denyIn("p", "A:B")), Put(scope("Empty", "")))
				_, err := st.Apply(Context(t), tc.ops)
				switch {
				case tc.ok && err != nil:
					t.Fatalf("refused: %v", err)
				case !tc.ok && !errors.Is(err, store.ErrIntegrity):
					t.Fatalf("got %v, want ErrIntegrity", err)
				case !tc.ok:
					if rev := Apply(t, st); rev != before {
						t.Fatalf("refused, yet the store moved from revision %d to %d", before, rev)
					}
				}
			})
		}
	})

	t.Run("one form per type at commit", func(t *testing.T) {
		// Each case starts from an S&D policy sd of TrafficPermission and a
		// targetRef policy items (from items) of Custom; ok false:
		// ErrIntegrity, nothing written.
		tp := resource.DefaultType
		cases := []struct {
			name string
			ops  func(t *testing.T) []store.Op
			ok   bool
		}{
			{"a targetRef policy beside an S&D one", func(t *testing.T) []store.Op {
				return []store.Op{Put(trPolicy(t, "tr", tp, resource.Allow, false))}
			}, false},
			{"an S&D policy beside a targetRef one", func(t *testing.T) []store.Op {
				return []store.Op{Put(sdPolicy("sd2", "Custom", resource.Allow))}
			}, false},
			{"blocks beside items", func(t *testing.T) []store.Op {
				return []store.Op{Put(trPolicy(t, "blocks", "Custom", resource.Allow, true))}
			}, false},
			{"two forms in one write, in an empty type", func(t *testing.T) []store.Op {
				return []store.Op{Put(sdPolicy("a", "Fresh", resource.Deny)), Put(trPolicy(t, "b", "Fresh", resource.Allow, false))}
			}, false},
			{"another S&D policy", func(t *testing.T) []store.Op {
				return []store.Op{Put(sdPolicy("sd2", tp, resource.Deny))}
			}, true},
			{"another targetRef policy with items", func(t *testing.T) []store.Op {
				return []store.Op{Put(trPolicy(t, "items2", "Custom", resource.Deny, false))}
			}, true},
			{"the only S&D policy rewritten as targetRef", func(t *testing.T) []store.Op {
				return []store.Op{Put(trPolicy(t, "sd", tp, resource.Allow, false))}
			}, true},
			{"the S&D policy deleted and a targetRef one put", func(t *testing.T) []store.Op {
				return []store.Op{del(sdPolicy("sd", tp, resource.Allow)), Put(trPolicy(t, "tr", tp, resource.Allow, false))}
			}, true},
			{"a form in a type of its own", func(t *testing.T) []store.Op {
				return []store.Op{Put(trPolicy(t, "tr", "Fresh", resource.Allow, true))}
			}, true},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				st := newHarness(t).Store
				before := Apply(t, st, Put(sdPolicy("sd", tp, resource.Allow)), Put(trPolicy(t, "items", "Custom", resource.Allow, false)))
				_, err := st.Apply(Context(t), tc.ops(t))
				switch {
				case tc.ok && err != nil:
					t.Fatalf("refused: %v", err)
				case !tc.ok && !errors.Is(err, store.ErrIntegrity):
					t.Fatalf("got %v, want ErrIntegrity", err)
				case !tc.ok:
					if rev := Apply(t, st); rev != before {
						t.Fatalf("refused, yet the store moved from revision %d to %d", before, rev)
					}
				}
			})
		}
	})

	t.Run("a type emptied takes the other form", func(t *testing.T) {
		st := newHarness(t).Store
		tp := resource.DefaultType
		Apply(t, st, Put(sdPolicy("sd", tp, resource.Allow)))
		Apply(t, st, del(sdPolicy("sd", tp, resource.Allow)))
		Apply(t, st, Put(trPolicy(t, "tr", tp, resource.Allow, false)))
		if _, err := st.Apply(Context(t), []store.Op{Put(sdPolicy("sd", tp, resource.Allow))}); !errors.Is(err, store.ErrIntegrity) {
			t.Fatalf("an S&D policy after the type turned targetRef: %v, want ErrIntegrity", err)
		}
	})

	t.Run("an S&D DENY and a targetRef ALLOW of one type at once: exactly one is stored", func(t *testing.T) {
		// Issue 28 item 7: both succeeded in 39 of 40 rounds (the form was
		// checked against a snapshot only), and under invalidResources:
		// Skip the DENY was then skipped.
		h := newHarness(t)
		ctx := Context(t)
		const rounds = 40
		for i := range rounds {
			typ := fmt.Sprintf("Race%d", i)
			deny := sdPolicy("deny", typ, resource.Deny)
			allow := trPolicy(t, "allow", typ, resource.Allow, false)
			var wg sync.WaitGroup
			var denyErr, allowErr error
			start := make(chan struct{})
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				_, denyErr = h.Store.Apply(ctx, []store.Op{Put(deny)})
			}()
			go func() {
				defer wg.Done()
				<-start
				_, allowErr = h.Writer.Apply(ctx, []store.Op{Put(allow)})
			}()
			close(start)
			wg.Wait()
			for _, err := range []error{denyErr, allowErr} {
				if err != nil && !errors.Is(err, store.ErrIntegrity) {
					t.Fatalf("round %d: %v", i, err)
				}
			}
			if (denyErr == nil) == (allowErr == nil) {
				t.Fatalf("round %d: the DENY's error %v, the ALLOW's %v: want exactly one stored", i, denyErr, allowErr)
			}
			page, err := h.Store.List(ctx, store.ListOptions{Prefix: "default/policies/" + typ + "/"})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Items) != 1 {
				t.Fatalf("round %d: %d policies of %s stored, want 1", i, len(page.Items), typ)
			}
		}
	})

	t.Run("a scope deleted while a policy is applied in it: never both", func(t *testing.T) {
		// Issue 12 F4: both succeeded in 51 of 60 rounds; the DENY was
		// stored naming a scope that no longer existed.
		h := newHarness(t)
		ctx := Context(t)
		const rounds = 64
		both := 0
		for i := range rounds {
			s := scope(fmt.Sprintf("S%d", i), "")
			p := denyIn(fmt.Sprintf("deny-%d", i), s.Key().Name)
			Apply(t, h.Writer, Put(s))
			var wg sync.WaitGroup
			var delErr, putErr error
			start := make(chan struct{})
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				_, delErr = h.Store.Apply(ctx, []store.Op{del(s)})
			}()
			go func() {
				defer wg.Done()
				<-start
				_, putErr = h.Writer.Apply(ctx, []store.Op{Put(p)})
			}()
			close(start)
			wg.Wait()
			for _, err := range []error{delErr, putErr} {
				if err != nil && !errors.Is(err, store.ErrIntegrity) && !errors.Is(err, store.ErrConflict) {
					t.Fatalf("round %d: %v", i, err)
				}
			}
			if delErr == nil && putErr == nil {
				both++
				t.Errorf("round %d: the scope was deleted and the policy in it applied", i)
			}
			_, sErr := h.Store.Get(ctx, s.Key())
			_, pErr := h.Store.Get(ctx, p.Key())
			if pErr == nil && sErr != nil {
				t.Fatalf("round %d: the policy is stored, its scope is not (%v)", i, sErr)
			}
		}
		if both > 0 {
			t.Fatalf("both writes succeeded in %d of %d rounds", both, rounds)
		}
	})
}
