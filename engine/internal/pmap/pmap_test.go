package pmap

import (
	"maps"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// checkEqual fails when m does not hold exactly the entries of want.
func checkEqual(t *testing.T, m Map[int, int], want map[int]int) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", m.Len(), len(want))
	}
	for k, v := range want {
		got, ok := m.Get(k)
		if !ok || got != v {
			t.Fatalf("Get(%d) = %d, %v; want %d", k, got, ok, v)
		}
	}
	n := 0
	m.Range(func(k, v int) bool {
		n++
		if want[k] != v {
			t.Fatalf("Range gave %d=%d, want %d", k, v, want[k])
		}
		return true
	})
	if n != len(want) {
		t.Fatalf("Range visited %d entries, want %d", n, len(want))
	}
}

func TestMapMatchesBuiltinMap(t *testing.T) {
	hashes := map[string]func(int) uint64{
		"good":      func(k int) uint64 { return uint64(k) * 0x9E3779B97F4A7C15 },
		"collision": func(k int) uint64 { return uint64(k % 7) }, // forces full-depth collisions
		"lowbits":   func(k int) uint64 { return uint64(k) << 40 },
	}
	for name, h := range hashes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(1, 2))
			m := New[int, int](h)
			want := map[int]int{}
			type version struct {
				m    Map[int, int]
				want map[int]int
			}
			var versions []version
			for step := 0; step < 3000; step++ {
				k := r.IntN(300)
				switch {
				case r.IntN(3) == 0:
					m = m.Delete(k)
					delete(want, k)
				case r.IntN(10) == 0:
					b := m.Builder()
					for i := 0; i < 20; i++ {
						k := r.IntN(300)
						if r.IntN(2) == 0 {
							b.Set(k, step)
							want[k] = step
						} else {
							b.Delete(k)
							delete(want, k)
						}
					}
					m = b.Map()
				default:
					m = m.Set(k, step)
					want[k] = step
				}
				if step%100 == 0 {
					cp := make(map[int]int, len(want))
					for k, v := range want {
						cp[k] = v
					}
					versions = append(versions, version{m, cp})
				}
			}
			checkEqual(t, m, want)
			checkShape(t, m)
			for _, v := range versions { // old versions are unchanged
				checkEqual(t, v.m, v.want)
				checkShape(t, v.m)
			}
		})
	}
}

// checkShape fails when a node's maps disagree with its arrays, a slot holds
// both an entry and a child, an entry sits in a slot its hash does not name, or
// a child below the root could fold back into its parent (one entry, no
// children) or is empty: the shape every update must leave.
func checkShape[K comparable, V any](t *testing.T, m Map[K, V]) {
	t.Helper()
	if m.root == nil {
		return
	}
	var walk func(n *node[K, V], shift uint, prefix uint64, root bool)
	walk = func(n *node[K, V], shift uint, prefix uint64, root bool) {
		if !root && (len(n.entries)+len(n.children) == 0 || len(n.entries) == 1 && len(n.children) == 0) {
			t.Fatalf("shift %d: a child with %d entries and %d children", shift, len(n.entries), len(n.children))
		}
		low := uint64(1)<<shift - 1
		if shift >= maxShift {
			if n.datamap|n.nodemap != 0 || len(n.children) != 0 {
				t.Fatalf("colliding node with maps %b %b, %d children", n.datamap, n.nodemap, len(n.children))
			}
			for _, e := range n.entries {
				if m.hash(e.key)&low != prefix {
					t.Fatalf("entry %v below the wrong prefix", e.key)
				}
			}
			return
		}
		if n.datamap&n.nodemap != 0 || bits.OnesCount32(n.datamap) != len(n.entries) || bits.OnesCount32(n.nodemap) != len(n.children) {
			t.Fatalf("shift %d: maps %b %b for %d entries, %d children", shift, n.datamap, n.nodemap, len(n.entries), len(n.children))
		}
		for s := uint64(0); s < fanout; s++ {
			bit := uint32(1) << s
			switch {
			case n.datamap&bit != 0:
				e := n.entries[slot(n.datamap, bit)]
				if h := m.hash(e.key); h&low != prefix || (h>>shift)&mask != s {
					t.Fatalf("entry %v in slot %d at shift %d", e.key, s, shift)
				}
			case n.nodemap&bit != 0:
				walk(n.children[slot(n.nodemap, bit)], shift+bitsPerLevel, prefix|s<<shift, false)
			}
		}
	}
	walk(m.root, 0, 0, true)
}

// FuzzMapMatchesBuiltinMap applies the operations the input spells (a set, a
// delete or a batch of them, each on one of few keys, with a hash that
// collides at chosen depths) to a Map and to a Go map, and holds every version
// taken along the way to the Go map of its time.
func FuzzMapMatchesBuiltinMap(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x10, 0x11, 0x90, 0x91, 0x12, 0x92, 0x40, 0x41, 0xc0, 0xc1})
	f.Add([]byte{1, 1, 1, 0x81, 0x81, 2, 0x82, 3, 0x43, 0x44, 0x45, 0x83})
	f.Fuzz(func(t *testing.T, ops []byte) {
		// Keys 0..63; the hash keeps the low bits apart at the root and makes
		// keys collide a level or more down (and at full depth for k%8 == 7).
		hash := func(k int) uint64 {
			if k%8 == 7 {
				return uint64(k % 3)
			}
			return uint64(k&3) | uint64(k>>2)<<(5*uint(k%4)+5)
		}
		m := New[int, int](hash)
		want := map[int]int{}
		type version struct {
			m    Map[int, int]
			want map[int]int
		}
		var versions []version
		var b *Builder[int, int]
		for i, op := range ops {
			k := int(op & 63)
			switch op >> 6 {
			case 0, 1: // set, in a batch or alone
				if b != nil {
					b.Set(k, i)
				} else {
					m = m.Set(k, i)
				}
				want[k] = i
			case 2: // delete, in a batch or alone
				if b != nil {
					b.Delete(k)
				} else {
					m = m.Delete(k)
				}
				delete(want, k)
			case 3: // open or close a batch
				if b == nil {
					b = m.Builder()
					continue
				}
				m, b = b.Map(), nil
			}
			if b == nil {
				versions = append(versions, version{m, maps.Clone(want)})
			}
		}
		if b != nil {
			m = b.Map()
		}
		checkEqual(t, m, want)
		checkShape(t, m)
		for _, v := range versions {
			checkEqual(t, v.m, v.want)
			checkShape(t, v.m)
		}
	})
}

func TestGetMissing(t *testing.T) {
	m := New[string, int](StringHash)
	if _, ok := m.Get("x"); ok {
		t.Fatal("empty map has x")
	}
	m = m.Set("x", 1).Delete("x")
	if _, ok := m.Get("x"); ok || m.Len() != 0 {
		t.Fatal("deleted key still there")
	}
}

func BenchmarkGet(b *testing.B) {
	m := New[string, int](StringHash)
	keys := make([]string, 100000)
	bl := m.Builder()
	for i := range keys {
		keys[i] = "service-" + string(rune('a'+i%26)) + string(rune(i))
		bl.Set(keys[i], i)
	}
	m = bl.Map()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Get(keys[i%len(keys)])
	}
}
