package socket

// # Reading
//
// The reader is where an idle connection's memory goes, so this file is
// written for it. github.com/coder/websocket's reader keeps, for every
// connection, the HTTP server's 4 KiB read buffer, 2 KiB of its own
// state, and a reader goroutine parked eight calls deep, on a stack of
// 8 KiB. Here the reader waits for the socket to become readable
// (wait), with no chunk taken and only a few calls on its stack, so that
// the garbage collector halves the stack to 4 KiB (as far as a stack
// shrinks: the runtime counts an 800-byte guard as in use); only then
// does it take a chunk from chunkPool and read. The chunk goes back the
// moment its last byte is taken, so a busy reader holds one, an idle one
// none. And a reader given Idle whose client says nothing for IdleAfter,
// between messages, leaves no stack at all: it parks the socket in
// package poller, Read returns nil, and the goroutine ends; the poller
// starts another when the client speaks, and the first wait after that
// reads at once (woken).
//
// Frames are parsed as RFC 6455 says a server must: every frame masked,
// no reserved bits (no extension is offered), control frames short and
// whole, a length's top bit clear, a fragmented message continued by
// continuation frames only, and text valid UTF-8. A ping is answered
// here, and any frame noted for Ping, so a pong does not wake the
// broker. A close is answered with its own code and ends Read; one
// whose code may not be sent (0, 1004 to 1006, 1015, 5000, …) or whose
// payload is one byte is answered with 1002, and one whose reason is not
// UTF-8 with 1007 (sections 5.5.1, 7.1.5 and 7.4). Anything else wrong
// closes the socket with the code the RFC names: 1002 for a broken
// frame, 1003 for a binary one, 1007 for text that is not UTF-8
// (encoding/json would replace the bad bytes, and a payload would not be
// what its publisher sent), 1009 for one over the limit.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/poller"
)

// chunkSize is what one read from the socket takes at most.
const chunkSize = 16 << 10

// chunkPool holds the chunks sockets read into, shared by every
// connection; messagePool the buffers frames are gathered in.
var (
	chunkPool   = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}
	messagePool = sync.Pool{New: func() any { return new([]byte) }}
)

// header is a frame's header (RFC 6455, section 5.2).
type header struct {
	fin    bool
	op     byte
	length uint64
	mask   [4]byte
}

// Read returns the next text frame, valid until the next Read, which
// gives back its buffer and its place. Any error (a close, a reset, a
// frame over the limit, a broken one) ends the socket, and Read has sent
// whatever close applies; a binary frame is closed with 1003.
func (c *Conn) Read() ([]byte, error) {
	c.givePlaceBack()
	if c.message != nil && cap(*c.message) <= LargeFrame {
		messagePool.Put(c.message)
	}
	c.message = nil
	c.reading <- struct{}{}
	defer func() { <-c.reading }()
	// A parked socket returns nil and no error: it is not gone.
	data, err := c.readMessage()
	if err != nil && err != errParked {
		c.goneOnce.Do(func() { close(c.gone) })
		return nil, err
	}
	return data, nil
}

// readMessage reads frames until a whole text message, answering the
// control frames between them.
func (c *Conn) readMessage() ([]byte, error) {
	// Between messages, holding nothing, wait for the socket with no
	// chunk, and park if it stays quiet for IdleAfter; after a control
	// frame, at once: a pong to a keepalive's ping is all a quiet client
	// sends, and every reader woke for it at the same moment.
	for quiet := IdleAfter; ; quiet = 0 {
		if c.message == nil {
			if err := c.await(quiet); err != nil {
				return nil, err
			}
		}
		h, err := c.readHeader()
		if err != nil {
			return nil, err
		}
		switch {
		case h.op >= opClose:
			if err := c.control(h); err != nil {
				return nil, err
			}
			continue
		case h.op == opBinary && c.message == nil:
			return nil, c.fail(websocket.StatusUnsupportedData,
				"text frames only", h.length)
		case h.op != opContinuation && c.message != nil,
			h.op == opContinuation && c.message == nil:
			return nil, c.fail(websocket.StatusProtocolError,
				fmt.Sprintf("unexpected opcode %d", h.op), 0)
		}
		if c.message == nil {
			c.message = messagePool.Get().(*[]byte)
			*c.message = (*c.message)[:0]
		}
		size := uint64(len(*c.message)) + h.length
		if limit := c.limit.Load(); size > uint64(limit) {
			return nil, c.fail(websocket.StatusMessageTooBig,
				fmt.Sprintf("read limited at %d bytes", limit), h.length)
		}
		if size > LargeFrame && !c.large.Load() && !c.takePlace() {
			return nil, net.ErrClosed
		}
		start := len(*c.message)
		if err := c.readAppend(c.message, int(h.length)); err != nil {
			return nil, err
		}
		unmask((*c.message)[start:], h.mask)
		switch {
		case h.fin && !utf8.Valid(*c.message):
			return nil, c.fail(websocket.StatusInvalidFramePayloadData,
				"invalid UTF-8", 0)
		case h.fin:
			return *c.message, nil
		}
	}
}

// readHeader reads the next frame's header and checks it.
func (c *Conn) readHeader() (header, error) {
	if err := c.buffer(2); err != nil {
		return header{}, err
	}
	b := (*c.in)[c.r:c.w]
	h := header{fin: b[0]&0x80 != 0, op: b[0] & 0x0f, length: uint64(b[1] & 0x7f)}
	var problem string
	switch {
	case b[0]&0x70 != 0:
		problem = "reserved bits set"
	case b[1]&0x80 == 0:
		problem = "a client's frames must be masked"
	case h.op > opPong || h.op > opBinary && h.op < opClose:
		problem = fmt.Sprintf("unknown opcode %d", h.op)
	case h.op >= opClose && (!h.fin || h.length > 125):
		problem = "a control frame must be whole and at most 125 bytes"
	}
	if problem != "" {
		return header{}, c.fail(websocket.StatusProtocolError, problem, 0)
	}
	size := 2 + 4
	switch h.length {
	case 126:
		size += 2
	case 127:
		size += 8
	}
	if err := c.buffer(size); err != nil {
		return header{}, err
	}
	b = (*c.in)[c.r : c.r+size]
	switch h.length {
	case 126:
		h.length = uint64(binary.BigEndian.Uint16(b[2:]))
	case 127:
		h.length = binary.BigEndian.Uint64(b[2:])
	}
	if h.length >= 1<<63 {
		return header{}, c.fail(websocket.StatusProtocolError,
			"a length's top bit must be 0", 0)
	}
	copy(h.mask[:], b[size-4:])
	c.take(size)
	// Any frame tells a waiting Ping the peer is there: a peer's pong
	// may wait behind thousands of publishes it sent first.
	select {
	case c.heard <- struct{}{}:
	default:
	}
	return h, nil
}

// control answers a control frame: a ping with a pong, a close with a
// close, and then the error that ends Read.
func (c *Conn) control(h header) error {
	var buffer [125]byte
	payload := buffer[:0]
	if err := c.readAppend(&payload, int(h.length)); err != nil {
		return err
	}
	unmask(payload, h.mask)
	switch h.op {
	case opPing:
		return c.writeControl(opPong, payload, time.Time{})
	case opClose:
		return c.answerClose(payload)
	}
	return nil // a pong
}

// answerClose answers the peer's close with its own code (none, if it
// gave none), and returns the error that ends Read; a close that breaks
// the rules is answered as fail answers a broken frame.
func (c *Conn) answerClose(payload []byte) error {
	closed := websocket.CloseError{Code: websocket.StatusNoStatusRcvd}
	if len(payload) >= 2 {
		closed.Code = websocket.StatusCode(binary.BigEndian.Uint16(payload))
		closed.Reason = string(payload[2:])
	}
	switch {
	case len(payload) == 1:
		return c.fail(websocket.StatusProtocolError,
			"a close payload of one byte", 0)
	case len(payload) >= 2 && !sendable(closed.Code):
		return c.fail(websocket.StatusProtocolError,
			fmt.Sprintf("close code %d may not be sent", closed.Code), 0)
	case !utf8.ValidString(closed.Reason):
		return c.fail(websocket.StatusInvalidFramePayloadData,
			"a close reason must be UTF-8", 0)
	}
	c.writeClose(closed.Code, "")
	c.conn.Close()
	return closed
}

// sendable reports whether code may be sent in a close frame: 1000 to
// 1003 and 1007 to 1014 (IANA's registry), and 3000 to 4999 for
// libraries and applications. 1004 is reserved, and 1005, 1006 and 1015
// only report a close that had no code, had no close frame, or failed
// its TLS handshake.
func sendable(code websocket.StatusCode) bool {
	return code >= 1000 && code <= 1003 || code >= 1007 && code <= 1014 ||
		code >= 3000 && code <= 4999
}

// fail closes the socket with code and reason, after skipping the rest of
// the frame in hand (skip bytes) and reading on to the peer's close, as
// a close must. A broken frame leaves no frames to read on in, so then
// every byte is read and dropped, up to the peer's end: closing a socket
// with bytes unread resets it, and the peer might never see the code.
// It returns the error that ends Read.
func (c *Conn) fail(code websocket.StatusCode, reason string, skip uint64) error {
	c.writeClose(code, reason)
	if code == websocket.StatusProtocolError {
		skip = 1<<63 - 1
	}
	c.awaitPeerClose(skip)
	c.conn.Close()
	return fmt.Errorf("socket closed with %d: %s", code, reason)
}

// awaitPeerClose skips skip bytes, then reads frames until the peer's
// close, for at most closeTimeout. The caller holds reading.
func (c *Conn) awaitPeerClose(skip uint64) {
	c.conn.SetReadDeadline(time.Now().Add(closeTimeout))
	for {
		for skip > 0 {
			if c.r == c.w && c.fill() != nil {
				return
			}
			n := min(skip, uint64(c.w-c.r))
			c.take(int(n))
			skip -= n
		}
		h, err := c.readHeader()
		if err != nil || h.op == opClose {
			return
		}
		skip = h.length
	}
}

// readAppend appends the next n bytes to *p as they come: a frame's
// buffer grows with what arrives, not to the length the frame claims, so
// a peer that claims much and sends little holds little.
func (c *Conn) readAppend(p *[]byte, n int) error {
	for n > 0 {
		if c.r == c.w {
			if err := c.fill(); err != nil {
				return err
			}
		}
		k := min(n, c.w-c.r)
		*p = append(*p, (*c.in)[c.r:c.r+k]...)
		c.take(k)
		n -= k
	}
	return nil
}

// buffer makes sure at least n bytes are in hand, n at most chunkSize.
func (c *Conn) buffer(n int) error {
	for c.w-c.r < n {
		if err := c.fill(); err != nil {
			return err
		}
	}
	return nil
}

// errParked is what await returns for a socket it parked.
var errParked = errors.New("socket: parked")

// await, holding no bytes, runs BeforeRead, waits for the socket to be
// readable, and only then takes a chunk to read into. A socket with a
// resume (Idle) quiet for quiet, unless that is negative, is parked
// instead, and await returns errParked.
func (c *Conn) await(quiet time.Duration) error {
	if c.in != nil {
		return nil
	}
	if c.opts.BeforeRead != nil {
		c.opts.BeforeRead()
	}
	// A reader the poller just woke reads; any other waits quiet. A
	// deadline passed waits not at all: a park with bytes there wakes.
	// Where nothing can park (TLS, no epoll), no deadline is set: it
	// would only wake a quiet reader to no purpose.
	if quiet >= 0 && c.idle != nil && poller.Can(c.raw) &&
		!c.woken.Swap(false) {
		c.conn.SetReadDeadline(time.Now().Add(quiet))
		err := wait(c.raw, c.one[:])
		c.conn.SetReadDeadline(time.Time{})
		if errors.Is(err, os.ErrDeadlineExceeded) &&
			c.parking.Park(c.raw, c.closed, c.wake) {
			return errParked
		}
	}
	// Where the socket cannot be waited on (TLS, a pipe), a read of one
	// byte waits instead, so that still no chunk is held. Both use the
	// connection's own byte: a local one would be allocated each wait.
	n, err := 0, wait(c.raw, c.one[:])
	if c.raw == nil {
		n, err = c.conn.Read(c.one[:])
	}
	if n == 0 && err != nil {
		return err
	}
	c.in, c.r, c.w = chunkPool.Get().(*[]byte), 0, n
	(*c.in)[0] = c.one[0]
	return nil
}

// wake reads on, on a goroutine of its own, once a parked socket wakes.
func (c *Conn) wake() { c.woken.Store(true); c.idle() }

// fill reads from the socket what is there, after the bytes in hand,
// running BeforeRead first.
func (c *Conn) fill() error {
	if c.in == nil {
		if err := c.await(-1); err != nil {
			return err
		}
	} else if c.opts.BeforeRead != nil {
		c.opts.BeforeRead()
	}
	if c.r > 0 {
		c.w = copy(*c.in, (*c.in)[c.r:c.w])
		c.r = 0
	}
	n, err := c.conn.Read((*c.in)[c.w:])
	c.w += n
	if n > 0 || err == nil {
		return nil
	}
	c.take(0)
	return err
}

// take takes n bytes in hand, and gives the chunk back once all are taken.
func (c *Conn) take(n int) {
	if c.r += n; c.r == c.w && c.in != nil {
		chunkPool.Put(c.in)
		c.in, c.r, c.w = nil, 0, 0
	}
}

// unmask unmasks a frame's payload in place, eight bytes at a time.
func unmask(p []byte, mask [4]byte) {
	key := uint64(binary.LittleEndian.Uint32(mask[:]))
	key |= key << 32
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, binary.LittleEndian.Uint64(p)^key)
		p = p[8:]
	}
	for i := range p {
		p[i] ^= mask[i%4]
	}
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
