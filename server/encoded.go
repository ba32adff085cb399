package server

import (
	"sync"

	"google.golang.org/protobuf/proto"
)

// encodedMsg is a response shared by many streams (a WatchRules group's
// RULES or SET_DELTAS message, a WatchResources snapshot's part), encoded
// once, by the first stream that sends it, and sent as the same bytes by
// every stream: requestCodec.Marshal passes its bytes through. 2,000 streams
// watching one workload cost one protobuf encoding per change, not 2,000.
// Neither the message nor the bytes are modified once shared; the bytes live
// as long as the message that holds them is cached (one state per rules
// group, one revision's snapshot in the feed).
type encodedMsg struct {
	msg  proto.Message
	once sync.Once
	b    []byte
	err  error
}

func newEncoded(m proto.Message) *encodedMsg { return &encodedMsg{msg: m} }

// bytes is the message's encoding, made on the first call.
func (e *encodedMsg) bytes() ([]byte, error) {
	e.once.Do(func() { e.b, e.err = proto.Marshal(e.msg) })
	return e.b, e.err
}
