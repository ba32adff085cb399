package fanout

import (
	"bytes"
	"hash/maphash"
	"slices"

	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// A RULES message is sent in parts, so that what many groups share is held
// once (protobuf's encoding of a message is its fields' encodings one after
// the other, in any order; in field order here, so the bytes are the
// message's own encoding):
//
//	revision (1) | inbound, outbound (2, 3): the rules body | kind (4) |
//	sets (5), one part per set | workload, workload_addresses (7, 8)
//
// The rules body is interned by content: every group whose rules encode
// alike — workloads of one service watched by name, or 2,000 workloads under
// the same 201 policies — holds one copy. A set's part is the set's, shared
// by every group naming it. A group holds a few small parts of its own; a
// stream holds a pointer to its group's message.

// rulesBody is an interned rules body; refs counts the group states holding
// it (guarded by the hub's mu).
type rulesBody struct {
	b    []byte
	hash uint64
	refs int
}

// bodyTable interns rule bodies by content.
type bodyTable struct {
	seed maphash.Seed
	m    map[uint64][]*rulesBody
}

func newBodyTable() *bodyTable {
	return &bodyTable{seed: maphash.MakeSeed(), m: map[uint64][]*rulesBody{}}
}

// intern returns the body of b, shared with the states holding the same
// bytes, with a reference taken.
func (t *bodyTable) intern(b []byte) *rulesBody {
	h := maphash.Bytes(t.seed, b)
	for _, rb := range t.m[h] {
		if bytes.Equal(rb.b, b) {
			rb.refs++
			return rb
		}
	}
	rb := &rulesBody{b: b, hash: h, refs: 1}
	t.m[h] = append(t.m[h], rb)
	return rb
}

// release drops a reference; the last one removes the body (messages sent
// or queued keep its bytes alive as long as they need them).
func (t *bodyTable) release(rb *rulesBody) {
	if rb == nil {
		return
	}
	if rb.refs--; rb.refs > 0 {
		return
	}
	list := slices.DeleteFunc(t.m[rb.hash], func(o *rulesBody) bool { return o == rb })
	if len(list) == 0 {
		delete(t.m, rb.hash)
	} else {
		t.m[rb.hash] = list
	}
}

// encodeBody is the rules body of a response's inbound and outbound lists:
// deterministic (map keys sorted), so equal rules give equal bytes.
func encodeBody(in, out *verdictv1.SideRules) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(&verdictv1.WatchRulesResponse{Inbound: in, Outbound: out})
}

// rulesKindPart is the RULES kind's part, the same in every message.
var rulesKindPart = mustMarshal(&verdictv1.WatchRulesResponse{Kind: verdictv1.WatchRulesKind_WATCH_RULES_KIND_RULES})

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err) // a message of scalars: never
	}
	return b
}

// fullMessage is the group's RULES message at rev, made once per state and
// revision and shared by the streams that need it; with its redacted twin
// when it names the workload.
func (g *ruleGroup) fullMessage(rev int64) *Message {
	if g.full != nil && g.fullVersion == g.state.version && g.fullRev == rev {
		return g.full
	}
	st := &g.state
	parts := [][]byte{mustMarshal(&verdictv1.WatchRulesResponse{Revision: rev}), st.rules.b, rulesKindPart}
	if g.sets {
		for _, ps := range st.named {
			parts = append(parts, ps.part())
		}
	}
	parts = slices.Clip(parts)
	tail := &verdictv1.WatchRulesResponse{Workload: st.res.rep}
	if g.sets {
		tail.WorkloadAddresses = st.res.addrs
	}
	g.full = &Message{parts: append(parts, mustMarshal(tail))}
	if w := st.res.rep; w.GetWorkload() != "" {
		tail.Workload = &verdictv1.EndpointResolution{Form: w.GetForm(), ResolvedAs: w.GetResolvedAs(), Identity: w.GetIdentity()}
		g.full.redacted = &Message{parts: append(parts, mustMarshal(tail))}
	}
	g.fullVersion, g.fullRev = st.version, rev
	return g.full
}
