package engine

import "testing"

// TestCacheVerifiesEveryField: an entry found under a flow's hash answers only
// that exact flow; a colliding hash is a miss, never another flow's answer.
func TestCacheVerifiesEveryField(t *testing.T) {
	t.Parallel()
	base := flow{src: Tags{"app": "web"}, dst: Tags{"app": "db", "env": "prod"}, proto: TCP, port: 5432}
	const h = 0x1234_5678_9abc_def0
	c := &decisionCache{}
	d := Decision{Action: Deny, Policy: "deny-db"}
	c.store(h, "m", "T", &base, d) // first sight: the doorkeeper only
	if _, ok := c.lookup(h, "m", "T", &base); ok {
		t.Fatal("a flow seen once is cached")
	}
	c.store(h, "m", "T", &base, d)
	if got, ok := c.lookup(h, "m", "T", &base); !ok || got.Policy != "deny-db" {
		t.Fatalf("a flow seen twice is not cached: %+v %v", got, ok)
	}
	others := map[string]struct {
		mesh, typ string
		f         flow
	}{
		"mesh":            {"other", "T", base},
		"type":            {"m", "U", base},
		"protocol":        {"m", "T", flow{src: base.src, dst: base.dst, proto: UDP, port: 5432}},
		"port":            {"m", "T", flow{src: base.src, dst: base.dst, proto: TCP, port: 5433}},
		"source value":    {"m", "T", flow{src: Tags{"app": "api"}, dst: base.dst, proto: TCP, port: 5432}},
		"source extra":    {"m", "T", flow{src: Tags{"app": "web", "v": "1"}, dst: base.dst, proto: TCP, port: 5432}},
		"destination key": {"m", "T", flow{src: base.src, dst: Tags{"app": "db", "zone": "prod"}, proto: TCP, port: 5432}},
		"destination one": {"m", "T", flow{src: base.src, dst: Tags{"app": "db"}, proto: TCP, port: 5432}},
	}
	for name, o := range others {
		if got, ok := c.lookup(h, o.mesh, o.typ, &o.f); ok {
			t.Errorf("%s differs but the cache answered %+v", name, got)
		}
	}
}
