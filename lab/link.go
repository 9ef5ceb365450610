package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/popsub/popsub"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/socket"
	"github.com/popsub/popsub/wire"
)

// # The network
//
// A client's connection is a link in memory: frames each way on a
// channel, as a socket's buffers would hold them. The broker takes its
// end through popsub.WithSocket, so it serves the link exactly as it
// serves a WebSocket. Toward the client the link holds linkFrames
// frames: a client that stops reading fills it, and then the broker's
// writes wait, as they would for a TCP window, until WriteTimeout cuts
// the client off. A ping travels in the same queue, so a client that
// does not read does not answer one either.

// linkFrames is how many frames a link holds toward a client that does
// not read.
const linkFrames = 8

// item is one frame on a link, or a ping, whose pong closes pong.
type item struct {
	frame []byte
	pong  chan struct{}
}

// link is one client's connection.
type link struct {
	gate     *gate
	toBroker chan []byte
	toClient chan item
	done     chan struct{}
	end      sync.Once

	// opts are the broker's socket options, from Accept.
	opts socket.Options
	// ended hears how the link ended, once; lost hears of each delivery
	// the link lost.
	ended func(why string)
	lost  func(delivery []byte)

	mu sync.Mutex
	// reason says how the link ended, for the client's last read.
	reason string
	limit  int64
	// dropNext is set while the link is to lose the next delivery it
	// carries toward the client (the "drop" fault): a faulty proxy.
	dropNext bool
}

func newLink(g *gate, ended func(why string)) *link {
	return &link{gate: g, ended: ended, toBroker: make(chan []byte, 64),
		toClient: make(chan item, linkFrames), done: make(chan struct{}),
		limit: 1 << 20}
}

// open is the link's broker end, for popsub.WithSocket.
func (l *link) open(opts socket.Options) popsub.Socket {
	l.opts = opts
	return brokerEnd{l}
}

// close ends the link, with the close frame the broker sent (a code of
// -1: none, and reason says why).
func (l *link) close(code websocket.StatusCode, reason string) {
	l.end.Do(func() {
		l.mu.Lock()
		why := reason
		if code >= 0 {
			why = fmt.Sprintf("closed %d: %s", code, reason)
		}
		l.reason = why
		l.mu.Unlock()
		close(l.done)
		l.ended(why)
	})
}

// brokerEnd is the broker's end of a link.
type brokerEnd struct{ *link }

// Read returns the client's next frame.
func (e brokerEnd) Read() ([]byte, error) {
	if e.opts.BeforeRead != nil {
		e.opts.BeforeRead()
	}
	select {
	case frame := <-e.toBroker:
		e.gate.wait()
		e.mu.Lock()
		limit := e.limit
		e.mu.Unlock()
		if int64(len(frame)) > limit {
			e.close(websocket.StatusMessageTooBig, "frame too big")
			return nil, errors.New("frame over the read limit")
		}
		return frame, nil
	case <-e.done:
		return nil, net.ErrClosed
	}
}

// SetReadLimit caps the frames Read returns.
func (e brokerEnd) SetReadLimit(n int64) {
	e.mu.Lock()
	e.limit = n
	e.mu.Unlock()
}

// Send queues frames for the client, a run joined by newlines as one
// frame, waiting at most WriteTimeout for room. A message whose
// expires_at has passed is dropped as its turn comes (wire.Expired).
func (e brokerEnd) Send(frames [][]byte, joined bool) error {
	e.gate.wait()
	if frames = slices.DeleteFunc(slices.Clone(frames),
		wire.Expired); joined && len(frames) > 0 {
		frames = [][]byte{bytes.Join(frames, []byte("\n"))}
	}
	for _, f := range frames {
		if wire.Expired(f) { // it waited for room meanwhile
			continue
		}
		if e.dropping(f) {
			continue
		}
		if err := e.put(item{frame: bytes.Clone(f)}); err != nil {
			return err
		}
	}
	return nil
}

// dropping reports whether the link loses frame f: the first delivery
// after the drop fault.
func (e brokerEnd) dropping(f []byte) bool {
	e.mu.Lock()
	drop := e.dropNext && bytes.HasPrefix(f, []byte(`{"type":"message"`))
	if drop {
		e.dropNext = false
	}
	e.mu.Unlock()
	if drop {
		e.lost(f)
	}
	return drop
}

// put queues one item for the client, waiting at most WriteTimeout.
func (e brokerEnd) put(it item) error {
	timeout := time.NewTimer(e.opts.WriteTimeout)
	defer timeout.Stop()
	select {
	case e.toClient <- it:
		return nil
	case <-timeout.C:
		e.close(-1, "cut off: a write waited "+e.opts.WriteTimeout.String())
		return errors.New("write timeout")
	case <-e.done:
		return net.ErrClosed
	}
}

// Ping queues a ping behind the frames already queued and waits for its
// pong.
func (e brokerEnd) Ping(ctx context.Context) error {
	pong := make(chan struct{})
	select {
	case e.toClient <- item{pong: pong}:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.done:
		return net.ErrClosed
	}
	select {
	case <-pong:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.done:
		return net.ErrClosed
	}
}

// Close sends a close frame and ends the link.
func (e brokerEnd) Close(code websocket.StatusCode, reason string) error {
	e.close(code, reason)
	return nil
}

// CloseNow ends the link without a close frame.
func (e brokerEnd) CloseNow() error {
	e.close(-1, "closed without a close frame")
	return nil
}

// Idle does nothing: the page's broker reads its links on goroutines that
// cost a page nothing worth saving.
func (e brokerEnd) Idle(func()) {}

// send sends a frame from the client.
func (l *link) send(frame []byte) error {
	select {
	case l.toBroker <- frame:
		return nil
	case <-l.done:
		return net.ErrClosed
	}
}

// receive returns the client's next frame, answering pings on the way;
// once the link has ended and its queue is empty, it returns the close.
func (l *link) receive() ([]byte, error) {
	for {
		var it item
		select {
		case it = <-l.toClient:
		case <-l.done:
			select {
			case it = <-l.toClient:
			default:
				l.mu.Lock()
				defer l.mu.Unlock()
				return nil, errors.New(l.reason)
			}
		}
		if it.pong != nil {
			close(it.pong)
			continue
		}
		return it.frame, nil
	}
}

// gate holds the broker's work while it is paused, as SIGSTOP would:
// its links and its disk wait.
type gate struct {
	mu     sync.Mutex
	paused chan struct{} // closed on resume; nil while running
}

// wait returns once the broker is not paused.
func (g *gate) wait() {
	g.mu.Lock()
	paused := g.paused
	g.mu.Unlock()
	if paused != nil {
		<-paused
	}
}

// pause holds the broker until resume.
func (g *gate) pause() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused == nil {
		g.paused = make(chan struct{})
	}
}

// resume lets the broker go on.
func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused != nil {
		close(g.paused)
		g.paused = nil
	}
}
