package inventory

import (
	"hash/maphash"

	"github.com/verdictpdp/verdict/engine/resource"
)

// cacheSeed seeds the process's tag hashes: the memo's keys and the interned
// tag sets' hashes.
var CacheSeed = maphash.MakeSeed()

func Mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// TagsHash hashes a tag set independently of map order.
func TagsHash(tags resource.Tags) uint64 {
	var sum uint64
	for k, v := range tags {
		sum += Mix64(maphash.String(CacheSeed, k) ^ maphash.String(CacheSeed, v)*0x9E3779B97F4A7C15)
	}
	return sum + uint64(len(tags))
}
