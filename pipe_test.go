package popsub

import (
	"cmp"
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// This file serves the broker over net.Pipe instead of TCP, so a test
// can run inside a testing/synctest bubble: the broker's timers (token
// expiry, keepalive, login delays) then run in fake time, instantly,
// while the frames still cross a real WebSocket.

// pipeListener hands out the server ends of in-memory pipes.
type pipeListener struct {
	conns chan net.Conn // server ends, waiting for Accept
	done  chan struct{} // closed by Close
	once  sync.Once     // makes Close idempotent
	// wrap, if set, wraps each server end: the simulation's faults.
	wrap func(net.Conn) net.Conn
}

// Accept returns the next server end.
func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept.
func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is a placeholder: pipes have no address.
func (l *pipeListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}
}

// dial makes a pipe and returns its client end. The server end reports
// the address dialled as its peer's: a test dials ws://203.0.113.9/ws to
// connect "from" 203.0.113.9.
func (l *pipeListener) dial(_ context.Context, _, address string) (net.Conn,
	error) {
	server, client := net.Pipe()
	var end net.Conn = addressed{server, address}
	if l.wrap != nil {
		end = l.wrap(end)
	}
	select {
	case l.conns <- end:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// addressed is a pipe's server end with the peer address it was dialled
// with.
type addressed struct {
	net.Conn
	remote string
}

// RemoteAddr is the address the client dialled.
func (a addressed) RemoteAddr() net.Addr { return pipeAddress(a.remote) }

// pipeAddress is a pipe's pretend network address.
type pipeAddress string

// Network names the pretend network.
func (pipeAddress) Network() string { return "pipe" }

// String is the address, host:port.
func (a pipeAddress) String() string { return string(a) }

// pipeServer is a broker served over pipes, for use inside a bubble.
type pipeServer struct {
	t        *testing.T
	broker   *Broker
	listener *pipeListener
	http     *http.Server
	client   *http.Client
	clients  []*client
}

// startPipeBroker serves a broker over pipes, with a memory store unless
// opts has a store. Call it inside synctest.Test, and stop it before the
// bubble ends.
func startPipeBroker(t *testing.T, opts Options) *pipeServer {
	t.Helper()
	return startPipeBrokerWrapped(t, opts, nil)
}

// startPipeBrokerWrapped is startPipeBroker with each server end of a
// pipe wrapped by wrap, if not nil.
func startPipeBrokerWrapped(t *testing.T, opts Options,
	wrap func(net.Conn) net.Conn) *pipeServer {
	t.Helper()
	opts.Secret, opts.Store = testSecret, cmp.Or[Store](opts.Store,
		newMemoryStore())
	if opts.Logger == nil {
		opts.Logger = quietLogger
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{}),
		wrap: wrap}
	ps := &pipeServer{t: t, broker: b, listener: l,
		http: &http.Server{Handler: b},
		client: &http.Client{Transport: &http.Transport{
			DialContext: l.dial}}}
	go ps.http.Serve(l)
	return ps
}

// dial connects over a pipe without authenticating.
func (ps *pipeServer) dial(name string) *client {
	ps.t.Helper()
	return ps.dialFrom(name, "pipe")
}

// dialFrom connects over a pipe, from host as the broker sees it.
func (ps *pipeServer) dialFrom(name, host string) *client {
	ps.t.Helper()
	ws, _, err := websocket.Dial(context.Background(), "ws://"+host+"/ws",
		&websocket.DialOptions{HTTPClient: ps.client})
	if err != nil {
		ps.t.Fatalf("%s: dial: %v", name, err)
	}
	c := &client{t: ps.t, name: name, ws: ws}
	ps.clients = append(ps.clients, c)
	return c
}

// stop closes the clients, the broker and the server, so that no
// goroutine outlives the bubble.
func (ps *pipeServer) stop() {
	for _, c := range ps.clients {
		c.ws.CloseNow()
	}
	ps.broker.Shutdown(context.Background())
	ps.http.Close()
	ps.listener.Close()
	ps.client.CloseIdleConnections()
}

// authenticate sends an auth frame with tok and expects authenticated.
func (c *client) authenticate(tok string) {
	c.t.Helper()
	c.send(map[string]any{"type": "auth", "token": tok})
	c.expect("authenticated")
}

// tokenUntil signs a token for sub that expires at exp.
func tokenUntil(t *testing.T, sub string, exp time.Time) string {
	t.Helper()
	var claims Claims
	claims.Subject = sub
	claims.ExpiresAt = jwtTime(exp)
	tok, err := claims.Sign(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
