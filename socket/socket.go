// Package socket is the WebSocket under each PopSub connection: it
// accepts the upgrade, reads text frames, and writes the broker's
// deliveries in as few system calls as it can.
//
// # The contract
//
// popsub.go declares what a connection needs of its socket (the Socket
// contract in its section "The machine room"): Read returns the next
// text frame, or, once Idle has given it a resume, nil for a client
// quiet for IdleAfter, with nobody left reading until resume starts;
// Send writes a run of frames in order; Ping, Close and CloseNow do what
// they say. Conn keeps it over the TCP connection the
// HTTP server hands over (RFC 6455, server side, without extensions);
// the lab page's network keeps one in memory instead, in a browser,
// where nothing can be accepted (popsub.WithSocket). Clients, the tests and the command use
// github.com/coder/websocket; its server side costs an idle connection
// 14 KiB more than framing here does (read.go says where it goes).
//
// # Reading frames
//
// Bytes come off the socket into a pooled chunk, taken only once the
// socket is readable and given back as soon as every byte in it is
// taken, so an idle connection holds none. A frame is gathered into a
// pooled buffer. It may take its first 64 KiB (LargeFrame) freely; a
// larger one first waits for one of the places in Options.LargeFrames,
// which the broker sizes, and holds it until the next Read: until the
// broker has handled it. The wait is TCP's push back on that one client.
// A place is held by one whole frame and needs nothing else to be given
// back, so the places cannot deadlock, as byte-by-byte grants would, each
// reader holding part of what it needs.
//
// # One write per batch
//
// The broker's writer takes every frame queued for a connection at once;
// sending them with one system call is what makes a delivery cheap,
// since a small write costs about ten microseconds here and the frame
// itself a fraction of one. So Send frames the deliveries itself
// (appendFrame: a server's frame header is two to ten bytes) and writes
// a whole run at once; pings, pongs and closes are written alone.
//
// # What each speed trick buys
//
// Measured with the benchmarks docs/performance.md names:
//
//	trick                               buys
//	a run of frames in one write        a fifth of a delivery's CPU
//	runs joined by newlines (joined)    one frame, not one per delivery
//	framing buffers pooled              a new writer grows no buffer
//	BeforeRead, before each read        a burst's deliveries in one write
//	frames read here, not by the        an idle connection 23.5–26.7 →
//	library; an idle reader waits       15.1–15.3 KiB of the server's
//	holding no chunk, low on its        memory (popsub bench --idle
//	stack                               10000, both in one session)
//	a client quiet for IdleAfter        15.9–16.3 → 10.0–10.7 KiB of the
//	parks its socket in the poller,     server's memory (the same bench,
//	and its reader goroutine ends       alternating runs)
package socket

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/poller"
	"github.com/popsub/popsub/wire"
)

// Sizes of what Read reads and Send writes.
const (
	// LargeFrame is the size past which a frame needs a place among
	// Options.LargeFrames.
	LargeFrame = 64 << 10
	// MaxJoined bounds a run of frames joined by newlines: a frame of a
	// whole 4 MiB outbox held that much per writer (performance.md, what
	// was tried); smaller runs cost a burst more CPU.
	MaxJoined = 512 << 10
	// writeChunk is how many framed bytes Send gathers before it writes
	// them, unless one frame is more.
	writeChunk = 64 << 10
	// closeTimeout is how long a close waits for the peer's close frame
	// before it closes the socket anyway.
	closeTimeout = 5 * time.Second
)

// Options configure Accept.
type Options struct {
	// OriginPatterns lists foreign origins allowed to open a WebSocket.
	OriginPatterns []string
	// WriteTimeout is how long one write may wait for a peer that does
	// not read; zero means 10 s.
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

// IdleAfter is how long a socket given a resume (Idle) waits for its
// client, its reader parked on the runtime's poller, before it parks in
// package poller, with no goroutine.
var IdleAfter = time.Second

// Conn is one client's WebSocket, accepted by Accept.
type Conn struct {
	conn net.Conn
	// raw waits for the socket to be readable without reading it (wait);
	// nil where the socket offers no such wait (TLS, a pipe). one is the
	// byte that wait peeks into, or that a read of one byte waits for.
	raw  syscall.RawConn
	one  [1]byte
	opts Options
	// limit caps a message, in bytes (SetReadLimit).
	limit atomic.Int64

	// reading is held by whoever reads the socket: Read, or a Close
	// reading on to the peer's close frame. It is a channel of one, not
	// a mutex, so that Close can wait for it or for the reader's end.
	reading chan struct{}
	// in holds what was read from the socket and not yet taken,
	// (*in)[r:w]; nil when nothing is, so an idle connection holds none.
	in   *[]byte
	r, w int
	// message holds the frame Read returned last; the reader's alone.
	message *[]byte
	// large is set while that frame holds a place. Whoever clears it,
	// the next Read or a close, gives the place back.
	large atomic.Bool

	// writing orders writes to the socket, a whole frame or run of
	// frames at a time, so they never interleave. It is a channel of
	// one, not a mutex, because it is held across a write that may wait
	// for its deadline: a goroutine waiting on a channel lets
	// testing/synctest's fake time pass, so the simulation can stall a
	// socket. closeSent, under it, is set once a close frame went out:
	// no frame may follow it (RFC 6455, section 5.5.1).
	writing   chan struct{}
	closeSent bool

	// heard is signalled when any frame comes, for Ping: a pong, or
	// any other frame, proof enough that the peer is there.
	heard chan struct{}
	// gone is closed when reading ends: the peer's close came, or the
	// socket failed. closed is closed by Close or CloseNow: a Read
	// waiting for a place gives up.
	gone, closed       chan struct{}
	goneOnce, shutOnce sync.Once

	// idle, set by Idle, reads on once a socket parked in the poller
	// wakes (wake), and woken says it just did. owned is set with it:
	// the socket has a reader that reads until Read fails, or is parked
	// and is woken by a close.
	idle    func()
	woken   atomic.Bool
	owned   atomic.Bool
	parking poller.Parking
}

// Accept upgrades a request to a WebSocket. It checks the Origin header:
// a page from another site, running in a user's browser, may not open a
// socket unless opts allows its origin.
func Accept(w http.ResponseWriter, r *http.Request, opts Options) (*Conn,
	error) {
	if status, err := checkUpgrade(w.Header(), r, opts.OriginPatterns); err != nil {
		http.Error(w, err.Error(), status)
		return nil, err
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotImplemented)
		return nil, err
	}
	opts.WriteTimeout = cmp.Or(opts.WriteTimeout, 10*time.Second)
	c := &Conn{conn: conn, opts: opts, reading: make(chan struct{}, 1),
		writing: make(chan struct{}, 1), heard: make(chan struct{}, 1),
		gone: make(chan struct{}), closed: make(chan struct{})}
	c.limit.Store(32 << 10)
	if s, ok := conn.(syscall.Conn); ok {
		c.raw, _ = s.SyscallConn()
	}
	// Whatever the server read past the request is the first frames.
	if n := rw.Reader.Buffered(); n > 0 {
		c.in = chunkPool.Get().(*[]byte)
		c.w, _ = rw.Reader.Read((*c.in)[:min(n, len(*c.in))])
	}
	accept := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") +
		"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	conn.SetWriteDeadline(time.Now().Add(opts.WriteTimeout))
	_, err = conn.Write([]byte("HTTP/1.1 101 Switching Protocols\r\n" +
		"Upgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(accept[:]) +
		"\r\n\r\n"))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// checkUpgrade checks that r asks for a WebSocket as RFC 6455 says, from
// an origin allowed, and returns the HTTP status that refuses it if not.
// Its refusals use the statuses github.com/coder/websocket's server
// uses.
func checkUpgrade(h http.Header, r *http.Request, origins []string) (int,
	error) {
	key, _ := base64.StdEncoding.DecodeString(r.Header.Get("Sec-WebSocket-Key"))
	has := func(name, token string) bool {
		return strings.Contains(strings.ToLower(r.Header.Get(name)), token)
	}
	switch {
	case !r.ProtoAtLeast(1, 1) || r.Method != http.MethodGet:
		return http.StatusBadRequest, errors.New("WebSocket protocol " +
			"violation: handshake request must be a GET, HTTP/1.1 or later")
	case !has("Connection", "upgrade") || !has("Upgrade", "websocket"):
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", "websocket")
		return http.StatusUpgradeRequired, errors.New("WebSocket protocol " +
			"violation: not an upgrade to websocket")
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		h.Set("Sec-WebSocket-Version", "13")
		return http.StatusBadRequest, errors.New("unsupported WebSocket " +
			"protocol version (only 13 is supported)")
	case len(key) != 16:
		return http.StatusBadRequest, errors.New("WebSocket protocol " +
			"violation: invalid Sec-WebSocket-Key")
	}
	return http.StatusForbidden, checkOrigin(r, origins)
}

// checkOrigin allows a request with no Origin (not from a browser), one
// from its own host, and one whose origin's host (or scheme://host,
// where the pattern has a scheme) matches one of patterns (path.Match,
// in any case).
func checkOrigin(r *http.Request, patterns []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return fmt.Errorf("request Origin %q is not a valid URL with a host",
			origin)
	}
	if strings.EqualFold(r.Host, u.Host) {
		return nil
	}
	for _, pattern := range patterns {
		target := u.Host
		if strings.Contains(pattern, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(pattern),
			strings.ToLower(target)); ok {
			return nil
		}
	}
	return fmt.Errorf("request Origin %q is not authorized for Host %q",
		u.Host, r.Host)
}

// Idle lets Read, between messages, after IdleAfter of quiet, return
// nil and no error, leaving the socket with no reader: resume is started
// on a goroutine of its own once the client sends anything or the
// socket closes, and reads on. Call it from the reader, before a Read.
// Where the socket cannot be watched without a goroutine (no epoll, TLS,
// a pipe), Read waits as before.
func (c *Conn) Idle(resume func()) {
	c.idle = resume
	c.owned.Store(true)
}

// SetReadLimit caps the frames Read returns; a larger one closes the
// socket with 1009 before it is buffered.
func (c *Conn) SetReadLimit(n int64) { c.limit.Store(n) }

// Ping pings the peer and waits for its pong, or for ctx to end, the
// ping's write too. Any frame read since the last Ping returned proves
// the peer alive: a busy peer's pong waits behind the frames it sent
// before it, which the broker may take seconds to handle.
func (c *Conn) Ping(ctx context.Context) error {
	deadline, _ := ctx.Deadline()
	if err := c.writeControl(opPing, nil, deadline); err != nil {
		// A write cut short by ctx's deadline is ctx's end, which is
		// due now.
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			<-ctx.Done()
			return ctx.Err()
		}
		return err
	}
	select {
	case <-c.heard:
		return nil
	case <-c.gone:
		return net.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close sends a close frame, waits up to closeTimeout for the peer's,
// and closes the socket. A socket given a resume (Idle) is read up to
// the peer's close by its own reader, woken if it was parked, so that
// the frames the peer sent before it are read, not skipped: an ack sent
// as the broker shuts down is handled. Otherwise the reader, if one is
// reading, sees the peer's close; if none is, Close reads on to it
// itself.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	c.shut()
	if err := c.writeClose(code, reason); err != nil {
		return c.conn.Close()
	}
	reading := c.reading
	if c.owned.Load() {
		reading = nil // a nil channel: Close never reads
	}
	select {
	case reading <- struct{}{}:
		c.awaitPeerClose(0)
		<-c.reading
	case <-c.gone:
	case <-time.After(closeTimeout):
	}
	return c.conn.Close()
}

// CloseNow closes the socket without a close frame.
func (c *Conn) CloseNow() error {
	c.shut()
	return c.conn.Close()
}

// shut gives up any wait for a place, and gives back the place the last
// frame holds, if any: a reader that stops reading after a panic must
// not keep it. The frame stays with the reader, which may still read it.
func (c *Conn) shut() {
	c.shutOnce.Do(func() { close(c.closed) })
	c.givePlaceBack()
	c.parking.Unpark()
}

// Send writes frames in order: each its own WebSocket frame or, joined,
// runs of them joined by newlines in one frame, under MaxJoined unless
// one frame is more. It writes in one system call per writeChunk, or per
// joined run. A message whose expires_at has passed (wire.Expired) is
// dropped as its turn comes, so one that waited behind a write the peer
// was slow to take is not sent late.
func (c *Conn) Send(frames [][]byte, joined bool) error {
	framed := writeBufferPool.Get().(*[]byte)
	defer writeBufferPool.Put(framed)
	buffer := (*framed)[:0]
	defer func() { *framed = buffer }()
	for len(frames) > 0 {
		if wire.Expired(frames[0]) {
			frames = frames[1:]
			continue
		}
		n, size := 1, len(frames[0])+1 // the run, and a newline to come
		for joined && n < len(frames) && size+len(frames[n]) < MaxJoined {
			if wire.Expired(frames[n]) {
				frames = slices.Delete(frames, n, n+1)
				continue
			}
			size, n = size+len(frames[n])+1, n+1
		}
		buffer, frames = appendFrame(buffer, frames[:n]), frames[n:]
		if len(buffer) >= writeChunk || joined && len(frames) > 0 {
			if err := c.write(buffer, false, time.Time{}); err != nil {
				return err
			}
			buffer = buffer[:0]
		}
	}
	if len(buffer) == 0 {
		return nil
	}
	return c.write(buffer, false, time.Time{})
}

// writeBufferPool holds the buffers Send frames its runs in, shared by
// every connection: a broker's writer exits whenever its outbox empties,
// and growing a new buffer for each run cost more CPU than the run's
// writes did.
var writeBufferPool = sync.Pool{New: func() any { return new([]byte) }}

// write writes framed, frames whole, unless a close frame went out
// before; closing says framed is one. It gives up on a peer that took
// nothing for WriteTimeout, or at until unless it is zero: a peer that
// took part of framed meanwhile is reading, only slower than framed is
// long, and gets WriteTimeout again for the rest. One deadline for a
// whole run cut off a reader that was reading; so did one for each 64
// KiB of it, on a link slower than 64 KiB a WriteTimeout, or a reader
// kept from its CPU for a moment.
func (c *Conn) write(framed []byte, closing bool, until time.Time) error {
	c.writing <- struct{}{}
	defer func() { <-c.writing }()
	if c.closeSent {
		return net.ErrClosed
	}
	c.closeSent = closing
	for len(framed) > 0 {
		deadline := time.Now().Add(c.opts.WriteTimeout)
		if !until.IsZero() && until.Before(deadline) {
			deadline = until
		}
		c.conn.SetWriteDeadline(deadline)
		n, err := c.conn.Write(framed)
		framed = framed[n:]
		if err != nil && (n == 0 || deadline.Equal(until) ||
			!errors.Is(err, os.ErrDeadlineExceeded)) {
			return err
		}
	}
	return nil
}

// Opcodes (RFC 6455, section 5.2).
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

// writeControl writes one control frame, final and unmasked, with up to
// 125 bytes of payload; until, if not zero, cuts its wait short.
func (c *Conn) writeControl(op byte, payload []byte, until time.Time) error {
	var frame [2 + 125]byte
	n := copy(frame[2:], payload)
	frame[0], frame[1] = 0x80|op, byte(n)
	return c.write(frame[:2+n], op == opClose, until)
}

// writeClose writes a close frame with code and as much of reason as
// fits, cut at a rune; code 1005 (none given) goes as no payload.
func (c *Conn) writeClose(code websocket.StatusCode, reason string) error {
	if code == websocket.StatusNoStatusRcvd {
		return c.writeControl(opClose, nil, time.Time{})
	}
	if len(reason) > 123 {
		reason = strings.ToValidUTF8(reason[:123], "")
	}
	return c.writeControl(opClose,
		append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...),
		time.Time{})
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
		buffer = append(buffer, 0x80|opText, byte(size))
	case size < 1<<16:
		buffer = append(buffer, 0x80|opText, 126, byte(size>>8), byte(size))
	default:
		buffer = binary.BigEndian.AppendUint64(append(buffer, 0x80|opText, 127),
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
