package decisionlog

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Reasons a record is dropped.
const (
	// ReasonQueueFull: the queue was full when the decision was offered.
	ReasonQueueFull = "queue_full"
)

// MaxDropMeshes bounds the meshes the drop counts name: the meshes beyond
// the first that dropped records count as "other", so that no number of
// meshes grows the metrics or the summaries without bound.
const MaxDropMeshes = 64

// OtherMesh names the meshes beyond MaxDropMeshes in the drop counts.
const OtherMesh = "other"

type dropKey struct{ mesh, reason string }

// dropCounts counts dropped records per mesh and reason. The counters sit
// in an immutable map replaced whole (under mu) when a key is added: a drop
// is a map read and an atomic add.
type dropCounts struct {
	cells atomic.Pointer[map[dropKey]*atomic.Int64]
	mu    sync.Mutex
	all   atomic.Int64
}

func (d *dropCounts) init() { d.cells.Store(&map[dropKey]*atomic.Int64{}) }

func (d *dropCounts) add(mesh, reason string) {
	d.all.Add(1)
	d.cell(mesh, reason).Add(1)
}

func (d *dropCounts) cell(mesh, reason string) *atomic.Int64 {
	k := dropKey{mesh, reason}
	if c, ok := (*d.cells.Load())[k]; ok {
		return c
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.cells.Load()
	if c, ok := old[k]; ok {
		return c
	}
	meshes := map[string]bool{}
	for k := range old {
		meshes[k.mesh] = true
	}
	if !meshes[mesh] && len(meshes) >= MaxDropMeshes {
		k.mesh = OtherMesh
		if c, ok := old[k]; ok {
			return c
		}
	}
	m := maps.Clone(old)
	c := new(atomic.Int64)
	m[k] = c
	d.cells.Store(&m)
	return c
}

func (d *dropCounts) total() int64 { return d.all.Load() }

func (d *dropCounts) each(f func(mesh, reason string, n int64)) {
	for k, c := range *d.cells.Load() {
		f(k.mesh, k.reason, c.Load())
	}
}

// summary is the record of the drops since the ones reported (which it
// updates), at now; nil when there were none.
func (d *dropCounts) summary(now time.Time, reported map[dropKey]int64) *Record {
	var out []*verdictv1.RecordsDropped
	for k, c := range *d.cells.Load() {
		n := c.Load()
		if n > reported[k] {
			out = append(out, &verdictv1.RecordsDropped{Mesh: k.mesh, Reason: k.reason, Count: n - reported[k]})
			reported[k] = n
		}
	}
	if len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b *verdictv1.RecordsDropped) int {
		return cmp.Or(cmp.Compare(a.Mesh, b.Mesh), cmp.Compare(a.Reason, b.Reason))
	})
	return &Record{Time: timestamppb.New(now), Dropped: out}
}
