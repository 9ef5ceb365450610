package socket

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// recordingConn is a socket that keeps what is written to it.
type recordingConn struct {
	net.Conn // nil: only Write and SetWriteDeadline are called
	written  bytes.Buffer
	empty    int // writes of nothing, each a wasted system call
}

func (r *recordingConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		r.empty++
	}
	return r.written.Write(p)
}

func (r *recordingConn) SetWriteDeadline(time.Time) error { return nil }

// TestSend_JoinsRunsStrictlyUnderMaxJoined: frames of 2 bytes,
// joined by newlines, fill MaxJoined exactly at 174,763 of them, one
// byte past what the protocol page promises; Send must stop one
// frame short, and lose or reorder none.
func TestSend_JoinsRunsStrictlyUnderMaxJoined(t *testing.T) {
	socket := &recordingConn{}
	c := &Conn{shared: &sharedSocket{Conn: socket,
		opts: Options{WriteTimeout: time.Second}, lock: make(chan struct{}, 1)}}
	var batch [][]byte
	for i := range 200000 {
		batch = append(batch, fmt.Appendf(nil, "%02d", i%100))
	}
	if err := c.Send(batch, true); err != nil || socket.empty > 0 {
		t.Fatalf("Send: %v, %d empty writes", err, socket.empty)
	}
	var got [][]byte
	for rest := socket.written.Bytes(); len(rest) > 0; {
		size, header := uint64(rest[1]), 2
		switch size {
		case 126:
			size, header = uint64(binary.BigEndian.Uint16(rest[2:])), 4
		case 127:
			size, header = binary.BigEndian.Uint64(rest[2:]), 10
		}
		if size >= MaxJoined {
			t.Fatalf("a frame of %d bytes, want under %d", size, MaxJoined)
		}
		payload := rest[header : header+int(size)]
		got = append(got, bytes.Split(payload, []byte("\n"))...)
		rest = rest[header+int(size):]
	}
	if len(got) != len(batch) {
		t.Fatalf("%d frames came out of %d", len(got), len(batch))
	}
	for i := range batch {
		if !bytes.Equal(got[i], batch[i]) {
			t.Fatalf("frame %d is %q, want %q", i, got[i], batch[i])
		}
	}
}

// A frame over LargeFrame holds a place until the next Read, and a
// close gives it back too: a reader that stops reading (after a panic,
// say) must not keep one of the places every connection shares.
func TestRead_ALargeFrameHoldsAPlaceUntilTheNextReadOrAClose(t *testing.T) {
	places := make(chan struct{}, 1)
	accepted := make(chan *Conn, 2)
	server := httptest.NewServer(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			c, err := Accept(w, r, Options{WriteTimeout: time.Second,
				LargeFrames: places})
			if err != nil {
				t.Error(err)
				return
			}
			accepted <- c.(*Conn)
		}))
	defer server.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func() *websocket.Conn {
		t.Helper()
		ws, _, err := websocket.Dial(ctx,
			"ws"+strings.TrimPrefix(server.URL, "http"), nil)
		if err != nil {
			t.Fatal(err)
		}
		ws.SetReadLimit(-1)
		return ws
	}
	large := bytes.Repeat([]byte("x"), 2*LargeFrame)

	// The first frame takes the one place, and holds it while handled.
	one := dial()
	defer one.CloseNow()
	first := <-accepted
	first.SetReadLimit(1 << 20)
	if err := one.Write(ctx, websocket.MessageText, large); err != nil {
		t.Fatal(err)
	}
	if data, err := first.Read(); err != nil || len(data) != len(large) {
		t.Fatalf("Read: %d bytes, %v", len(data), err)
	}
	if len(places) != 1 {
		t.Fatalf("%d places taken while the frame is handled, want 1",
			len(places))
	}

	// A close gives it back: the reader never reads again.
	first.CloseNow()
	if len(places) != 0 {
		t.Fatalf("%d places taken after a close, want 0", len(places))
	}

	// And the next Read does, on a connection that goes on.
	two := dial()
	defer two.CloseNow()
	second := <-accepted
	second.SetReadLimit(1 << 20)
	for range 2 {
		if err := two.Write(ctx, websocket.MessageText, large); err != nil {
			t.Fatal(err)
		}
		if data, err := second.Read(); err != nil || len(data) != len(large) {
			t.Fatalf("Read: %d bytes, %v", len(data), err)
		}
	}
	if len(places) != 1 {
		t.Fatalf("%d places taken, want the second frame's only",
			len(places))
	}
}
