package engine_test

import (
	"fmt"
	"testing"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/engine/policygen"
	"github.com/verdictpdp/verdict/engine/resource"
)

// TestBuildIndexMatchesUpdate: a bulk build files every index as update does
// on an empty index (engine.CheckBulkIndexes), on generated sets of both
// profiles (several bitmap blocks per class on the largest) and on the
// reference's worlds (targetRef policies, attachments, expressions, scopes).
func TestBuildIndexMatchesUpdate(t *testing.T) {
	configs := []policygen.Config{
		{Seed: 1, Policies: 3000},
		{Seed: 2, Policies: 3000, Scopes: 20, AuditPercent: 10},
		{Seed: 3, Policies: 3000, Profile: policygen.Dense, Combine: resource.DenyOverrides},
		{Seed: 4, Policies: 12000, Profile: policygen.Dense},
		{Seed: 5, Policies: 2000, Select: resource.SelectPerDestination, WildcardPercent: 40},
	}
	for _, c := range configs {
		t.Run(fmt.Sprintf("seed=%d/policies=%d", c.Seed, c.Policies), func(t *testing.T) {
			t.Parallel()
			n, err := engine.CheckBulkIndexes(engine.Build(1, policygen.Generate(c).Resources))
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatal("no rules compared")
			}
		})
	}
	t.Run("worlds", func(t *testing.T) {
		t.Parallel()
		total := 0
		for i := 0; i < 300; i++ {
			world := genWorld(newChoices(seedBytes(i)))
			n, err := engine.CheckBulkIndexes(engine.Build(1, world))
			if err != nil {
				t.Fatalf("world %d: %v\n%s", i, err, describe(world))
			}
			total += n
		}
		if total == 0 {
			t.Fatal("no rules compared")
		}
	})
}
