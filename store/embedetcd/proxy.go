package embedetcd

import (
	"fmt"
	"net"
	"net/url"
	"sync"
)

// Proxy is a loopback TCP proxy in front of a member, for tests that need a
// client cut off while etcd runs on: Cut resets every connection and refuses
// new ones (a lost connection), Blackhole keeps connections open but passes
// nothing (a partition, or a hung server: the client gets no error, only
// silence). Restore goes back to forwarding; bytes held by a blackhole are then
// delivered, as TCP would after a partition heals.
type Proxy struct {
	target string
	l      net.Listener

	mu     sync.Mutex
	cut    bool
	gate   chan struct{} // closed while bytes may pass
	conns  map[*pair]struct{}
	closed bool
	wg     sync.WaitGroup
}

type pair struct {
	a, b net.Conn
	once sync.Once
	done chan struct{}
}

func (p *pair) close() {
	p.once.Do(func() {
		close(p.done)
		p.a.Close()
		p.b.Close()
	})
}

// NewProxy listens on a free loopback port and forwards to target, a client
// URL ("http://127.0.0.1:2379") or a host:port.
func NewProxy(target string) (*Proxy, error) {
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		target = u.Host
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{target: target, l: l, gate: open, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Endpoint is the proxy's client URL.
func (p *Proxy) Endpoint() string { return fmt.Sprintf("http://%s", p.l.Addr()) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		t, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pr := &pair{a: c, b: t, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close()
			continue
		}
		p.conns[pr] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(pr, pr.a, pr.b)
		go p.pipe(pr, pr.b, pr.a)
	}
}

func (p *Proxy) pipe(pr *pair, from, to net.Conn) {
	defer p.wg.Done()
	defer func() {
		pr.close()
		p.mu.Lock()
		delete(p.conns, pr)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if !p.wait(pr.done) {
				return
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait blocks while the proxy is blackholed; false when the pair closed.
func (p *Proxy) wait(done <-chan struct{}) bool {
	p.mu.Lock()
	g := p.gate
	p.mu.Unlock()
	select {
	case <-g:
		return true
	case <-done:
		return false
	}
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[*pair]struct{}{}
	p.mu.Unlock()
	for pr := range conns {
		pr.close()
	}
}

// Blackhole stops passing bytes; connections stay open and new ones are
// accepted, all silent until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
}

// Restore forwards again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[*pair]struct{}{}
	p.mu.Unlock()
	err := p.l.Close()
	for pr := range conns {
		pr.close()
	}
	p.wg.Wait()
	return err
}
