package fanout

import (
	"sync"

	"google.golang.org/protobuf/proto"
)

// Message is a response shared by many streams, encoded once and sent as
// the same bytes by every stream: the server's codec sends its Parts as they
// are. 2,000 streams watching one workload cost one encoding per change, not
// 2,000. It is either a proto message, encoded by the first stream that sends
// it, or parts encoded apart: a message's encoding is the concatenation of its
// fields' encodings, so a part may be shared by many messages too — the rules
// of every workload whose rules are equal, an address set named by many
// workloads' rules. Neither the message nor its parts are modified once
// shared.
type Message struct {
	msg   proto.Message // encoded on the first Parts; nil for parts made apart
	once  sync.Once
	parts [][]byte
	err   error
	// redacted is the message for a caller who may not read what this one
	// holds of the inventory (a workload's name); nil: this one.
	redacted *Message
}

// NewMessage makes a shared message of m, encoded on its first send. m must
// not be modified afterwards.
func NewMessage(m proto.Message) *Message { return &Message{msg: m} }

// Parts returns the message's encoding, in parts to be sent one after the
// other; the caller must not modify them.
func (m *Message) Parts() ([][]byte, error) {
	if m.msg == nil {
		return m.parts, nil
	}
	m.once.Do(func() {
		b, err := proto.Marshal(m.msg)
		m.parts, m.err = [][]byte{b}, err
	})
	return m.parts, m.err
}

// Redacted is the message a caller may read who is not authorized to read
// workload names (docs/api.md, "Access"): itself when it holds none.
func (m *Message) Redacted() *Message {
	if m.redacted != nil {
		return m.redacted
	}
	return m
}
