package memo

import (
	"testing"
	"unsafe"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestPairEntryIsOneLine: a hit reads one cache line, and counting a use
// (Seen) writes the line the hit read.
func TestPairEntryIsOneLine(t *testing.T) {
	if n := unsafe.Sizeof(PairEntry[decision]{}); n != 64 {
		t.Fatalf("PairEntry is %d bytes, want 64", n)
	}
}

// TestPairPortsNeverAlias: an entry holds its port and protocol in 32 bits;
// a flow whose port or protocol does not fit is never stored and never
// answered by another flow's entry.
func TestPairPortsNeverAlias(t *testing.T) {
	t.Parallel()
	reg := inventory.NewRegistry(0, 0)
	web, _ := reg.Register("m", resource.Tags{"app": "web"})
	db, _ := reg.Register("m", resource.Tags{"app": "db"})
	m := &Pairs[decision]{}
	gen := m.Gen(Gen{Inv: 1, Reg: 1})
	tcp := uint64(resource.TCP) << 32
	m.Insert(web, db, tcp|80, PairAnswer(1), &Entry[decision]{}, gen, 0)
	// Every protocol that would pack to TCP/80's 32 bits if packing dropped
	// its high bits; a few of them share its slots.
	for k := uint64(1); k < 1<<16; k++ {
		pp := (uint64(resource.TCP)|k<<16)<<32 | 80
		if pe := m.Probe(web.Identity(), db.Identity(), pp, gen); pe != nil {
			t.Fatalf("pp %#x: answered by TCP/80's entry", pp)
		}
		if pe := m.Find(web, db, pp, gen); pe != nil {
			t.Fatalf("pp %#x: found TCP/80's entry", pp)
		}
	}
	m.Insert(web, db, tcp|80|1<<31, PairAnswer(2), &Entry[decision]{}, gen, 1)
	pe := m.Probe(web.Identity(), db.Identity(), tcp|80, gen)
	if pe == nil || pe.Answer() != 1 {
		t.Fatalf("port 80: entry %+v, want its own", pe)
	}
	if got, want := pe.PortProtocol(), uint32(resource.TCP)<<16|80; got != want {
		t.Fatalf("PortProtocol %#x, want %#x", got, want)
	}
}

// TestSeenAndTake: the first use since a Take says so; Take returns every
// use since the last and starts again.
func TestSeenAndTake(t *testing.T) {
	t.Parallel()
	pe := &PairEntry[decision]{}
	for round := range 3 {
		for i := range 5 + round {
			if first := pe.Seen(); first != (i == 0) {
				t.Fatalf("round %d use %d: first %v", round, i, first)
			}
		}
		if n := pe.Take(); n != uint32(5+round) {
			t.Fatalf("round %d: took %d, want %d", round, n, 5+round)
		}
	}
	if n := pe.Take(); n != 0 {
		t.Fatalf("took %d after a take, want 0", n)
	}
}
