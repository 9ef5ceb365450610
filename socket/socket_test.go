package socket

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"
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
