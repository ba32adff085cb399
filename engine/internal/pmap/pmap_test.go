package pmap

import (
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
			for _, v := range versions { // old versions are unchanged
				checkEqual(t, v.m, v.want)
			}
		})
	}
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
