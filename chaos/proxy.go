package chaos

import (
	"net"
	"sync"
)

// Proxy carries TCP connections to a broker, wherever it listens now,
// and can drop them all or stop carrying bytes for a while.
type Proxy struct {
	listener net.Listener
	upstream func() string // the broker's address now

	mu    sync.Mutex // guards the fields below
	conns map[net.Conn]struct{}
	// held, while not nil, stops every copy until it is closed.
	held chan struct{}
}

// NewProxy listens on 127.0.0.1 and carries connections to upstream.
func NewProxy(upstream func() string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{listener: l, upstream: upstream,
		conns: map[net.Conn]struct{}{}}
	go p.accept()
	return p, nil
}

// Addr is where clients connect.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// accept carries each new connection until the proxy closes.
func (p *Proxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream())
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go p.carry(client, server)
		go p.carry(server, client)
	}
}

// carry copies from one side to the other until either closes, waiting
// while the proxy is held.
func (p *Proxy) carry(from, to net.Conn) {
	defer p.drop(from, to)
	buffer := make([]byte, 32<<10)
	for {
		n, err := from.Read(buffer)
		if n > 0 {
			p.wait()
			if _, err := to.Write(buffer[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait returns once the proxy is not held.
func (p *Proxy) wait() {
	p.mu.Lock()
	held := p.held
	p.mu.Unlock()
	if held != nil {
		<-held
	}
}

// drop closes both sides and forgets them.
func (p *Proxy) drop(a, b net.Conn) {
	a.Close()
	b.Close()
	p.mu.Lock()
	delete(p.conns, a)
	delete(p.conns, b)
	p.mu.Unlock()
}

// Cut closes every connection the proxy carries.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Hold stops carrying bytes, without closing anything.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Resume carries bytes again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() {
	p.listener.Close()
	p.Resume()
	p.Cut()
}
