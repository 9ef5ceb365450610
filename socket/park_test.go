//go:build linux

package socket

import (
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// quiet makes every quiet moment park a socket given a resume, for one
// test.
func quiet(t *testing.T) {
	t.Helper()
	before := IdleAfter
	IdleAfter = 0
	t.Cleanup(func() { IdleAfter = before })
}

// isParked reports whether c waits in the poller.
func isParked(c *Conn) bool { return c.parking.Parked() }

// resumes counts the starts of a socket's resume.
func resumes(t *testing.T, c *Conn) func() {
	t.Helper()
	started := make(chan struct{}, 8)
	c.Idle(func() { started <- struct{}{} })
	return func() {
		t.Helper()
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the parked socket was never resumed")
		}
	}
}

// parked returns a raw client and its socket, parked: quiet, and given a
// resume, whose starts resumed waits for.
func parked(t *testing.T) (client *rawClient, c *Conn, resumed func()) {
	t.Helper()
	quiet(t)
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second})
	client = dialRaw(t, server, nil)
	c = <-accepted
	resumed = resumes(t, c)
	parks(t, c, "when quiet")
	return client, c, resumed
}

// parks reads c, which must park: Read returns nil and no error.
func parks(t *testing.T, c *Conn, when string) {
	t.Helper()
	if data, err := c.Read(); data != nil || err != nil || !isParked(c) {
		t.Fatalf("Read %s: %q, %v; parked %v", when, data, err,
			isParked(c))
	}
}

// A quiet socket parks: Read returns nil and no error, and holds no
// chunk. A frame wakes it, once, and the next Read returns the frame
// rather than parking again. A ping sent while it is parked is answered
// through a wake-up, and Ping returns.
func TestIdle_AQuietSocketParksAndWakesForFramesAndPongs(t *testing.T) {
	client, c, resumed := parked(t)
	if c.in != nil {
		t.Fatal("a parked socket holds a chunk")
	}
	client.conn.Write(frame(opText, true, "hello"))
	resumed()
	if data, err := c.Read(); string(data) != "hello" || err != nil {
		t.Fatalf("Read after the wake-up: %q, %v", data, err)
	}

	parks(t, c, "after the frame")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(ctx) }()
	if op, payload := client.next(); op != opPing {
		t.Fatalf("got op %d, %q; want a ping", op, payload)
	}
	client.conn.Write(frame(opPong, true, ""))
	resumed()
	// The pong is read, and the socket parks again.
	parks(t, c, "after a pong")
	if err := <-pinged; err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// A parked socket that is closed, by either side, is resumed, and its
// Read says the socket is done: a connection whose reader waits in the
// poller must still be taken apart when it ends.
func TestIdle_AParkedSocketIsResumedByAClose(t *testing.T) {
	quiet(t)
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second})

	t.Run("the server closes", func(t *testing.T) {
		client := dialRaw(t, server, nil)
		c := <-accepted
		resumed := resumes(t, c)
		parks(t, c, "when quiet")
		go c.Close(websocket.StatusGoingAway, "bye")
		resumed()
		client.expectClose(websocket.StatusGoingAway)
		client.conn.Write(frame(opClose, true, "\x03\xe9"))
		if data, err := c.Read(); err == nil {
			t.Fatalf("Read after a close: %q, no error", data)
		}
		if isParked(c) {
			t.Fatal("a closed socket is still in the poller")
		}
	})
	t.Run("the client hangs up", func(t *testing.T) {
		client := dialRaw(t, server, nil)
		c := <-accepted
		resumed := resumes(t, c)
		parks(t, c, "when quiet")
		client.conn.Close()
		resumed()
		if data, err := c.Read(); err == nil {
			t.Fatalf("Read after a hang-up: %q, no error", data)
		}
		c.CloseNow()
	})
}

// A socket never parks inside a message: a quiet spell between two
// fragments leaves Read waiting for the rest, with the first in hand.
func TestIdle_NeverParksInsideAMessage(t *testing.T) {
	quiet(t)
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second})
	client := dialRaw(t, server, frame(opText, false, "one half, "))
	c := <-accepted
	c.Idle(func() { t.Error("resumed inside a message") })
	read := make(chan string, 1)
	go func() {
		data, err := c.Read()
		read <- string(data) + ", " + fmtErr(err)
	}()
	time.Sleep(50 * time.Millisecond) // a quiet spell, not a timeout
	client.conn.Write(frame(opContinuation, true, "the other"))
	if got := <-read; got != "one half, the other, <nil>" {
		t.Fatalf("Read: %s", got)
	}
}

// fmtErr prints err, or <nil>.
func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// A close the server starts leaves what the peer sent before its close
// reply to the socket's own reader, woken from the poller: an ack a quiet
// client sends as the broker shuts down is handled. Close read on to the
// peer's close itself, and skipped it.
func TestClose_LeavesTheFramesBeforeThePeersCloseToTheReader(t *testing.T) {
	client, c, resumed := parked(t)
	closed := make(chan error, 1)
	go func() { closed <- c.Close(websocket.StatusGoingAway, "bye") }()
	resumed()
	client.expectClose(websocket.StatusGoingAway)
	client.conn.Write(frame(opText, true, `{"type":"ack"}`))
	client.conn.Write(frame(opClose, true, "\x03\xe9"))
	if data, err := c.Read(); string(data) != `{"type":"ack"}` || err != nil {
		t.Fatalf("Read after the close: %q, %v; want the ack", data, err)
	}
	if data, err := c.Read(); err == nil {
		t.Fatalf("Read after the peer's close: %q, no error", data)
	}
	<-closed // the reader closed the socket, as the handshake ended
}
