package engine_test

import (
	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/internal/worldgen"
	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// The random worlds of engine/internal/worldgen (shared with
// engine/analysis's tests) under the names these tests use.

type choices struct{ *worldgen.Choices }

func newChoices(data []byte) *choices { return &choices{worldgen.NewChoices(data)} }

func (c *choices) n(n int) int                   { return c.N(n) }
func (c *choices) chance(percent int) bool       { return c.Chance(percent) }
func (c *choices) tags() resource.Tags           { return c.Tags() }
func (c *choices) selector() resource.Selector   { return c.Selector() }
func (c *choices) action() resource.Action       { return c.Action() }
func (c *choices) targetRef() resource.TargetRef { return c.TargetRef() }

func genWorld(c *choices) []resource.Resource { return worldgen.World(c.Choices) }
func describe(rs []resource.Resource) string  { return worldgen.Describe(rs) }
func seedBytes(i int) []byte                  { return worldgen.SeedBytes(i) }
func genRequest(c *choices) engine.Request    { return worldgen.Request(c.Choices) }

var genTimes = worldgen.Times

// modelWorkload is a workload as the model sees it.
type modelWorkload struct {
	w     *resource.Workload
	valid bool
}

func genInventory(c *choices) []modelWorkload {
	inv := worldgen.Inventory(c.Choices)
	out := make([]modelWorkload, len(inv))
	for i, m := range inv {
		out[i] = modelWorkload{w: m.W, valid: m.Valid}
	}
	return out
}

func genEndpoint(c *choices, inv []modelWorkload) inventory.Endpoint {
	wg := make([]worldgen.Workload, len(inv))
	for i, m := range inv {
		wg[i] = worldgen.Workload{W: m.w, Valid: m.valid}
	}
	return worldgen.Endpoint(c.Choices, wg)
}
