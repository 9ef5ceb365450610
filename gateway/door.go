package gateway

import (
	"bytes"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// # The door
//
// Every client comes in through one HTTP server: WebSocket upgrades,
// POSTs, streams, the playground's pages. A stranger must not be able to
// hold memory or sockets there any longer than on the WebSocket path,
// where an unauthenticated connection has 8 KiB and five seconds. So the
// server the command runs (NewServer) bounds each stage of a request
// before anyone knows who sent it:
//
//	stage                 bound
//	headers               16 KiB and 5 s (MaxHeaderBytes, HeaderTimeout)
//	a body                10 s (BodyTimeout), and the bodies' budget
//	a keep-alive socket   30 s idle between requests (IdleTimeout)
//	sockets of any kind   at most --max-connections at once (Limit)
//
// A WebSocket upgrade leaves these behind when it is hijacked (net/http
// clears the deadlines), and the broker's own auth timeout takes over.
// net/http's ReadTimeout is not used: it would also end every Server-Sent
// Events stream, whose request is never done being read.

// The door's bounds, each a zero DoorOptions field's meaning.
const (
	// DefaultHeaderTimeout is how long a client has to send its headers.
	DefaultHeaderTimeout = 5 * time.Second
	// DefaultIdleTimeout is how long a keep-alive socket may wait for
	// its next request.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultMaxHeaderBytes bounds a request's headers: room for a 4 KiB
	// token and what a browser sends beside it, as the WebSocket path
	// allows 8 KiB before auth. net/http allows 4 KiB more.
	DefaultMaxHeaderBytes = 16 << 10
)

// DoorOptions configure NewServer; a zero field means its default.
type DoorOptions struct {
	// HeaderTimeout bounds the reading of a request's headers.
	HeaderTimeout time.Duration
	// IdleTimeout is how long a keep-alive socket may stay idle.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; more is answered 431.
	MaxHeaderBytes int64
	// BodyTimeout bounds the reading of any request's body, as the
	// gateway's Options.BodyTimeout bounds a publish's. Zero:
	// DefaultBodyTimeout.
	BodyTimeout time.Duration
	// Logger receives the server's errors; nil means slog.Default().
	Logger *slog.Logger
	// OnHandshakeError, if set, counts each failed TLS handshake, for
	// /metrics.
	OnHandshakeError func()
}

// NewServer returns the HTTP server for handler with the door's bounds.
// Failed TLS handshakes (a port scan, a client that connects and hangs
// up) are counted and logged at most once a second, with how many.
func NewServer(handler http.Handler, opts DoorOptions) *http.Server {
	opts.BodyTimeout = cmpOr(opts.BodyTimeout, DefaultBodyTimeout)
	opts.HeaderTimeout = cmpOr(opts.HeaderTimeout, DefaultHeaderTimeout)
	opts.IdleTimeout = cmpOr(opts.IdleTimeout, DefaultIdleTimeout)
	opts.MaxHeaderBytes = cmpOr(opts.MaxHeaderBytes, DefaultMaxHeaderBytes)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	errors := &serverLog{logger: opts.Logger, count: opts.OnHandshakeError}
	return &http.Server{Handler: bodyDeadline(handler, opts.BodyTimeout),
		ReadHeaderTimeout: opts.HeaderTimeout, IdleTimeout: opts.IdleTimeout,
		MaxHeaderBytes: int(opts.MaxHeaderBytes),
		ErrorLog:       log.New(errors, "", 0)}
}

// bodyDeadline gives every request that has a body a deadline to read
// it by: net/http reads what a handler left unread before the socket's
// next request, and would otherwise wait for a slow body for ever.
func bodyDeadline(handler http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 && r.Header.Get("Upgrade") == "" {
			http.NewResponseController(w).SetReadDeadline(
				time.Now().Add(timeout))
		}
		handler.ServeHTTP(w, r)
	})
}

// serverLog is net/http's error log: handshake errors are counted and
// summed up once a second; anything else is logged as it comes.
type serverLog struct {
	logger *slog.Logger
	count  func() // for /metrics; may be nil

	mu      sync.Mutex
	unsaid  int       // handshake errors since the last line
	said    time.Time // when the last line about them was written
	example string    // the newest one, for the line
}

// handshakeError is how net/http begins its line for a failed handshake.
var handshakeError = []byte("http: TLS handshake error")

// Write takes one line of net/http's log.
func (l *serverLog) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	if !bytes.HasPrefix(p, handshakeError) {
		l.logger.Warn("http server", "err", line)
		return len(p), nil
	}
	if l.count != nil {
		l.count()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unsaid++
	l.example = line
	if time.Since(l.said) >= time.Second {
		l.logger.Warn("TLS handshakes failed", "count", l.unsaid,
			"newest", l.example)
		l.unsaid, l.said = 0, time.Now()
	}
	return len(p), nil
}

// Limit returns a listener that holds at most n sockets open at once,
// of every kind (WebSocket, HTTP, streams, idle keep-alives); n ≤ 0
// means no cap. A socket past the cap is answered 503 with Retry-After
// and closed, on a goroutine of its own with a short deadline, so that
// Accept never waits for a peer. Wrap the TCP listener, under any TLS:
// a TLS client past the cap then sees its handshake fail.
func Limit(l net.Listener, n int) net.Listener {
	if n <= 0 {
		return l
	}
	return &limitListener{Listener: l, max: int64(n)}
}

// limitListener is the listener Limit returns.
type limitListener struct {
	net.Listener
	max  int64        // sockets at once
	open atomic.Int64 // sockets accepted and not yet closed
}

// full is what a socket past the cap hears.
const full = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n" +
	"Content-Type: text/plain\r\nConnection: close\r\n" +
	"Content-Length: 21\r\n\r\ntoo many connections\n"

// Accept returns the next socket within the cap, turning away those
// past it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &countedConn{Conn: conn, open: &l.open}, nil
		}
		l.open.Add(-1)
		go turnAway(conn)
	}
}

// turnAway answers a socket past the cap and closes it. Over TLS the
// write completes the handshake first; a peer that does not take part
// is dropped at the deadline.
func turnAway(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(time.Second))
	io.WriteString(conn, full)
	conn.Close()
}

// countedConn gives its place under the cap back when it closes, once.
type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

// Close closes the socket and frees its place.
func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}
