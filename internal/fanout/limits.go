package fanout

import "fmt"

// Default caps of the WatchRules streams a hub serves (Limits). A stream
// holds a few KiB of its own (its group's message is shared; rules that
// differ per workload add their encoding, ~75 bytes a rule): the total cap
// bounds what a flood of streams can hold, the others what one connection or
// one caller can take of it.
const (
	DefaultMaxStreams          = 10_000
	DefaultMaxStreamsPerCaller = 4_000
	DefaultMaxStreamsPerConn   = 1_000
)

// Limits caps the WatchRules streams a hub serves at once: in total, per
// caller and per connection. Zero values take the defaults.
type Limits struct {
	Total, PerCaller, PerConnection int
}

func (l Limits) withDefaults() Limits {
	if l.Total <= 0 {
		l.Total = DefaultMaxStreams
	}
	if l.PerCaller <= 0 {
		l.PerCaller = DefaultMaxStreamsPerCaller
	}
	if l.PerConnection <= 0 {
		l.PerConnection = DefaultMaxStreamsPerConn
	}
	return l
}

// Caller is who opens a stream, as the server tells callers apart: the
// connection it comes on (any comparable value, one per connection) and the
// caller's identity (a verified client certificate's, else its address
// without the port).
type Caller struct {
	Conn any
	ID   string
}

// streamCounts are the streams open, against the hub's Limits (guarded by
// the hub's mu).
type streamCounts struct {
	limits Limits
	total  int
	caller map[string]int
	conn   map[any]int
}

func newStreamCounts(l Limits) *streamCounts {
	return &streamCounts{limits: l.withDefaults(), caller: map[string]int{}, conn: map[any]int{}}
}

// admit counts a new stream of c, or refuses it with ErrTooManyStreams
// naming the cap it would pass.
func (s *streamCounts) admit(c Caller) error {
	switch {
	case s.total >= s.limits.Total:
		return fmt.Errorf("%w: %d open on this server, its limit", ErrTooManyStreams, s.total)
	case s.caller[c.ID] >= s.limits.PerCaller:
		return fmt.Errorf("%w: %d open by caller %s, the limit per caller", ErrTooManyStreams, s.caller[c.ID], c.ID)
	case s.conn[c.Conn] >= s.limits.PerConnection:
		return fmt.Errorf("%w: %d open on this connection, the limit per connection", ErrTooManyStreams, s.conn[c.Conn])
	}
	s.total++
	s.caller[c.ID]++
	s.conn[c.Conn]++
	return nil
}

// release uncounts a stream admit counted.
func (s *streamCounts) release(c Caller) {
	s.total--
	if s.caller[c.ID]--; s.caller[c.ID] <= 0 {
		delete(s.caller, c.ID)
	}
	if s.conn[c.Conn]--; s.conn[c.Conn] <= 0 {
		delete(s.conn, c.Conn)
	}
}
