package observed

// flowIndex finds a shard's flows by fingerprint: open addressing with
// linear probing over slots of 16 bytes, four to a cache line, so a probe
// that finds its flow at home reads one line (a Go map reads its group's
// control word and then the slot, often two).
type flowIndex struct {
	slots []indexSlot // a power of two long; nil while empty
	n     int         // slots in use
}

type indexSlot struct {
	fp flowFP
	// entry is the flow's entry plus one: 0 marks an empty slot.
	entry int32
}

// maxLoadNum/maxLoadDen is the share of slots in use beyond which the
// index doubles.
const maxLoadNum, maxLoadDen = 3, 4

// home is fp's first slot in an index of mask+1 slots.
func home(fp flowFP, mask int) int { return int(uint64(fp) & uint64(mask)) }

func matches(s *indexSlot, fp flowFP) bool {
	return s.entry != 0 && s.fp == fp
}

// get returns the entry of fp.
func (x *flowIndex) get(fp flowFP) (int32, bool) {
	if x.n == 0 {
		return 0, false
	}
	mask := len(x.slots) - 1
	for i := home(fp, mask); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.entry == 0 {
			return 0, false
		}
		if matches(s, fp) {
			return s.entry - 1, true
		}
	}
}

// put adds fp, which the index does not hold, naming entry.
func (x *flowIndex) put(fp flowFP, entry int32) {
	if (x.n+1)*maxLoadDen > len(x.slots)*maxLoadNum {
		x.grow()
	}
	x.place(indexSlot{fp: fp, entry: entry + 1})
	x.n++
}

func (x *flowIndex) place(s indexSlot) {
	mask := len(x.slots) - 1
	i := home(s.fp, mask)
	for x.slots[i].entry != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = s
}

func (x *flowIndex) grow() {
	old := x.slots
	x.slots = make([]indexSlot, max(16, 2*len(old)))
	for _, s := range old {
		if s.entry != 0 {
			x.place(s)
		}
	}
}

// remove takes fp out (it must be held), shifting back the slots after it
// that would no longer be found past the hole (no tombstones: a probe stops
// at the first empty slot).
func (x *flowIndex) remove(fp flowFP) {
	mask := len(x.slots) - 1
	i := home(fp, mask)
	for !matches(&x.slots[i], fp) {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.slots[j].entry != 0; j = (j + 1) & mask {
		// The slot at j moves into the hole at i unless its home lies
		// cyclically in (i, j]: it is then found before reaching i.
		if (j-home(x.slots[j].fp, mask))&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.n--
}
