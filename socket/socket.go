// Package socket is the WebSocket under each PopSub connection: it
// accepts the upgrade, reads text frames, and writes the broker's
// deliveries in as few system calls as it can.
//
// # The contract
//
// popsub.go declares what a connection needs of its socket (the Socket
// contract in its section "The machine room"): Read returns the next
// text frame; Send writes a run of frames in order; Ping, Close and
// CloseNow do what they say. Conn keeps it over github.com/coder/websocket;
// a request may carry a socket kept another way (WithEndpoint), as the
// lab page's network keeps one in memory, in a browser, where nothing
// can be accepted.
//
// # Reading frames
//
// A frame is read into a pooled buffer, taken only once a frame has
// begun to arrive, so an idle connection holds none. It may take its
// first 64 KiB (LargeFrame) freely; a larger one first waits for one of
// the places in Options.LargeFrames, which the broker sizes, and holds
// it until the next Read: until the broker has handled it. The wait is
// TCP's push back on that one client. A place is held by one whole frame
// and needs nothing else to be given back, so the places cannot
// deadlock, as byte-by-byte grants would, each reader holding part of
// what it needs.
//
// # One write per batch
//
// The broker's writer takes every frame queued for a connection at once;
// sending them with one system call is what makes a delivery cheap,
// since a small write costs about ten microseconds here and the frame
// itself a fraction of one. The WebSocket library writes and flushes
// each frame on its own, behind a lock taken with a select, and that was
// a fifth of the CPU of a delivery at a steady rate. So Send frames the
// deliveries itself (appendFrame: a server's frame header is two to ten
// bytes) and writes them straight to the socket, and the library is left
// the frames it owns: pings, pongs and closes. Forking the library to add
// a batch write of its own was the alternative; the socket under it
// (net.Conn, taken through a hijacker) is the seam it already offers.
//
// # What each speed trick buys
//
// Measured with the benchmarks docs/performance.md names:
//
//	trick                               buys
//	a run of frames in one write        a fifth of a delivery's CPU
//	runs joined by newlines (joined)    one frame, not one per delivery
//	framing buffers pooled              a new writer grows no buffer
//	the library's writer sized to a     3.9 KiB less an idle connection
//	control frame, not 4 KiB
//	BeforeRead, before each read        a burst's deliveries in one write
package socket

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Sizes of what Read reads and Send writes.
const (
	// LargeFrame is the size past which a frame needs a place among
	// Options.LargeFrames.
	LargeFrame = 64 << 10
	// MaxJoined bounds a run of frames joined by newlines: a frame of a
	// whole 4 MiB outbox held that much per writer; smaller runs cost a
	// burst more CPU and cut off more of its readers (performance.md).
	MaxJoined = 512 << 10
	// writeChunk is what one write to the socket carries at most, each
	// with a deadline of its own.
	writeChunk = 64 << 10
	// controlFrameBytes is the largest frame the library writes: a
	// control frame's 125 bytes of payload behind a server's two-byte
	// header.
	controlFrameBytes = 2 + 125
)

// Options configure Accept.
type Options struct {
	// OriginPatterns lists foreign origins allowed to open a WebSocket.
	OriginPatterns []string
	// WriteTimeout is how long one write may wait for a peer that does
	// not read.
	WriteTimeout time.Duration
	// BeforeRead, if set, runs before each read from the socket: the
	// broker starts there the writers a burst of publishes filled.
	BeforeRead func()
	// LargeFrames holds a token per frame over LargeFrame being read or
	// handled, on every socket that shares it; its capacity is the
	// places. Stop, once closed, ends every wait for one.
	LargeFrames chan struct{}
	Stop        <-chan struct{}
}

// Conn is one client's WebSocket, accepted by Accept.
type Conn struct {
	ws     *websocket.Conn
	shared *sharedSocket
	opts   Options
	// closed is closed by Close or CloseNow: a Read waiting for a place
	// gives up.
	closed    chan struct{}
	closeOnce sync.Once

	// buffer holds the frame Read returned last; the reader's alone.
	buffer *bytes.Buffer
	// large is set while that frame holds a place. Whoever clears it,
	// the next Read or a close, gives the place back.
	large atomic.Bool
}

// Endpoint is the contract a socket keeps: popsub.go's Socket, met by a
// Conn or by a socket a request carries.
type Endpoint interface {
	Read() ([]byte, error)
	SetReadLimit(n int64)
	Send(frames [][]byte, joined bool) error
	Ping(ctx context.Context) error
	Close(code websocket.StatusCode, reason string) error
	CloseNow() error
}

// endpointKey is the request context's key for a socket kept another way.
type endpointKey struct{}

// WithEndpoint returns r carrying a socket kept another way: Accept
// returns open(opts) in place of upgrading r.
func WithEndpoint(r *http.Request, open func(Options) Endpoint) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), endpointKey{}, open))
}

// Accept upgrades a request to a WebSocket. It checks the Origin header:
// a page from another site, running in a user's browser, may not open a
// socket unless opts allows its origin. A request from WithEndpoint gets
// the socket it carries.
func Accept(w http.ResponseWriter, r *http.Request, opts Options) (Endpoint,
	error) {
	open, ok := r.Context().Value(endpointKey{}).(func(Options) Endpoint)
	if ok {
		return open(opts), nil
	}
	hijack := &hijacker{ResponseWriter: w, opts: opts}
	ws, err := websocket.Accept(hijack, r,
		&websocket.AcceptOptions{OriginPatterns: opts.OriginPatterns})
	if err != nil {
		return nil, err
	}
	return &Conn{ws: ws, shared: hijack.socket, opts: opts,
		closed: make(chan struct{})}, nil
}

// SetReadLimit caps the frames Read returns; a larger one closes the
// socket with 1009 before it is buffered.
func (c *Conn) SetReadLimit(n int64) { c.ws.SetReadLimit(n) }

// Read returns the next text frame, valid until the next Read, which
// gives back its buffer and its place. Any error (a close, a reset, a
// frame over the limit) ends the socket, and the library has sent
// whatever close applies; a binary frame is closed with 1003.
func (c *Conn) Read() ([]byte, error) {
	c.givePlaceBack()
	if c.buffer != nil && c.buffer.Cap() <= LargeFrame {
		readBufferPool.Put(c.buffer)
	}
	c.buffer = nil
	typ, reader, err := c.ws.Reader(context.Background())
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		c.ws.Close(websocket.StatusUnsupportedData, "text frames only")
		return nil, errors.New("binary frame")
	}
	buffer := readBufferPool.Get().(*bytes.Buffer)
	buffer.Reset()
	c.buffer = buffer
	_, err = buffer.ReadFrom(io.LimitReader(reader, LargeFrame+1))
	if err == nil && buffer.Len() > LargeFrame {
		if !c.takePlace() {
			return nil, net.ErrClosed
		}
		_, err = buffer.ReadFrom(reader)
	}
	if err != nil {
		return nil, err
	}
	return buffer.Bytes(), nil
}

// takePlace waits for a place among LargeFrames, unless the socket is
// closed or Stop is first; it reports whether it got one.
func (c *Conn) takePlace() bool {
	select {
	case c.opts.LargeFrames <- struct{}{}:
		c.large.Store(true)
		// A close that came meanwhile found no place to give back.
		select {
		case <-c.closed:
			c.givePlaceBack()
			return false
		default:
			return true
		}
	case <-c.closed:
	case <-c.opts.Stop:
	}
	return false
}

// givePlaceBack gives back the last frame's place, if it holds one,
// once: the next Read and a close may both try. A buffer that grew past
// LargeFrame goes to the garbage collector, not back to the pool.
func (c *Conn) givePlaceBack() {
	// A load first: most frames are small, and a load costs less than a
	// swap on every read.
	if c.large.Load() && c.large.CompareAndSwap(true, false) {
		<-c.opts.LargeFrames
	}
}

// readBufferPool holds the buffers frames are read into, shared by every
// connection: an idle connection holds none, and a busy one takes one
// only while a frame is being read and handled.
var readBufferPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Ping pings the peer and waits for its pong or for ctx to end.
func (c *Conn) Ping(ctx context.Context) error { return c.ws.Ping(ctx) }

// Close sends a close frame, waits briefly for the peer's, and closes the
// socket.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	c.end()
	return c.ws.Close(code, reason)
}

// CloseNow closes the socket without a close frame.
func (c *Conn) CloseNow() error {
	c.end()
	return c.ws.CloseNow()
}

// end gives up any wait for a place, and gives back the place the last
// frame holds, if any: a reader that stops reading after a panic must
// not keep it. The buffer stays with the reader, which may still read
// it.
func (c *Conn) end() {
	c.closeOnce.Do(func() { close(c.closed) })
	c.givePlaceBack()
}

// Send writes frames in order: each its own WebSocket frame or, joined,
// runs of them joined by newlines in one frame, under MaxJoined unless
// one frame is more. It writes in one system call per writeChunk, or per
// joined run.
func (c *Conn) Send(frames [][]byte, joined bool) error {
	framed := writeBufferPool.Get().(*[]byte)
	defer writeBufferPool.Put(framed)
	buffer := (*framed)[:0]
	defer func() { *framed = buffer }()
	for len(frames) > 0 {
		n, size := 1, len(frames[0])+1 // the run, and a newline to come
		for joined && n < len(frames) && size+len(frames[n]) < MaxJoined {
			size, n = size+len(frames[n])+1, n+1
		}
		buffer, frames = appendFrame(buffer, frames[:n]), frames[n:]
		if len(buffer) >= writeChunk || joined && len(frames) > 0 {
			if err := c.shared.sendFrames(buffer); err != nil {
				return err
			}
			buffer = buffer[:0]
		}
	}
	if len(buffer) == 0 {
		return nil
	}
	return c.shared.sendFrames(buffer)
}

// writeBufferPool holds the buffers Send frames its runs in, shared by
// every connection: a broker's writer exits whenever its outbox empties,
// and growing a new buffer for each run cost more CPU than the run's
// writes did.
var writeBufferPool = sync.Pool{New: func() any { return new([]byte) }}

// sharedSocket is a connection's socket, under the WebSocket library. Both
// the library and Send write to it, a whole frame or run of frames at a
// time, so their frames never interleave. Each write has a deadline of
// WriteTimeout, so a peer that does not read cannot hold a writer, or a
// close, for ever.
type sharedSocket struct {
	net.Conn
	// opts are Accept's; immutable.
	opts Options

	// lock guards closed and orders writes to the socket. It is a
	// channel of one, not a mutex, because it is held across a write
	// that may wait for its deadline: a goroutine waiting on a channel
	// lets testing/synctest's fake time pass, so the simulation can
	// stall a socket (the library's own write lock is a channel too).
	lock chan struct{}
	// closed is set once the library wrote a close frame: no data frame
	// may follow it (RFC 6455, section 5.5.1).
	closed bool
}

// Write sends a frame the library wrote. Every frame the library writes
// here is small (a control frame), so its buffered writer hands it over
// in one Write, and p starts with the frame's first byte.
func (h *sharedSocket) Write(p []byte) (int, error) {
	h.lock <- struct{}{}
	defer func() { <-h.lock }()
	h.closed = h.closed || len(p) > 0 && p[0] == 0x88 // a final close
	h.Conn.SetWriteDeadline(time.Now().Add(h.opts.WriteTimeout))
	return h.Conn.Write(p)
}

// Read reads the socket, first running BeforeRead. The library reads its
// socket only once it has handled every frame it read before, so this is
// the end of one read's worth of publishes.
func (h *sharedSocket) Read(p []byte) (int, error) {
	if h.opts.BeforeRead != nil {
		h.opts.BeforeRead()
	}
	return h.Conn.Read(p)
}

// sendFrames sends frames Send framed, unless the library has closed the
// socket's write side. A run longer than writeChunk goes out a chunk at
// a time, each with a deadline of its own, so that WriteTimeout means
// what it says: the peer took nothing (less than a chunk) for that long.
// One deadline for a run of 512 KiB cut off a reader that was reading,
// only slower than the run was long.
func (h *sharedSocket) sendFrames(framed []byte) error {
	h.lock <- struct{}{}
	defer func() { <-h.lock }()
	if h.closed {
		return net.ErrClosed
	}
	for len(framed) > 0 {
		chunk := framed[:min(len(framed), writeChunk)]
		h.Conn.SetWriteDeadline(time.Now().Add(h.opts.WriteTimeout))
		if _, err := h.Conn.Write(chunk); err != nil {
			return err
		}
		framed = framed[len(chunk):]
	}
	return nil
}

// appendFrame appends one WebSocket text frame holding frames, joined by
// newlines: the header (RFC 6455, section 5.2) as a server sends it,
// final and unmasked, then the payload.
func appendFrame(buffer []byte, frames [][]byte) []byte {
	size := len(frames) - 1
	for _, frame := range frames {
		size += len(frame)
	}
	switch {
	case size < 126:
		buffer = append(buffer, 0x81, byte(size))
	case size < 1<<16:
		buffer = append(buffer, 0x81, 126, byte(size>>8), byte(size))
	default:
		buffer = binary.BigEndian.AppendUint64(append(buffer, 0x81, 127),
			uint64(size))
	}
	for i, frame := range frames {
		if i > 0 {
			buffer = append(buffer, '\n')
		}
		buffer = append(buffer, frame...)
	}
	return buffer
}

// hijacker is the ResponseWriter that websocket.Accept sees: it wraps
// the socket the library hijacks in a sharedSocket, and points the
// library's buffered writer at it.
type hijacker struct {
	http.ResponseWriter
	// opts are Accept's, for the sharedSocket.
	opts Options
	// socket is the sharedSocket, once Accept has hijacked the connection.
	socket *sharedSocket
}

// Hijack takes the connection from the HTTP server and wraps it.
func (h *hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.socket = &sharedSocket{Conn: conn, opts: h.opts,
		lock: make(chan struct{}, 1)}
	// The library writes only control frames through its writer (Send
	// writes to the socket itself), none over 127 bytes: a buffer that
	// size, not the server's 4 KiB, is all every idle connection holds.
	rw.Writer = bufio.NewWriterSize(h.socket, controlFrameBytes)
	return h.socket, rw, nil
}

// Wakeups are the writers a reader's work owes a start: the idle
// outboxes its publishes filled since it last read its socket. A writer
// started at once, for each frame a publish queues, wrote each delivery
// of a burst alone, a system call each; started when the reader is
// about to read again (Options.BeforeRead), or to wait, it finds a whole
// read's worth of publishes queued for its subscriber, and nothing waits
// for a timer. nats-server's read loop does the same (flushClients). mu
// is a leaf: a close's handshake reads the socket from another goroutine.
type Wakeups struct {
	mu      sync.Mutex
	writers []func() // owed a start, in the order they were filled
}

// Owe owes write a start, or, on a nil w, starts it at once.
func (w *Wakeups) Owe(write func()) {
	if w == nil {
		go write()
		return
	}
	w.mu.Lock()
	w.writers = append(w.writers, write)
	w.mu.Unlock()
}

// Start starts every writer owed, each on a goroutine of its own. A nil
// w owes none.
func (w *Wakeups) Start() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, write := range w.writers {
		go write()
	}
	w.writers = slices.Delete(w.writers, 0, len(w.writers)) // cleared
}
