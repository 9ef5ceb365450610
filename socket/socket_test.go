package socket

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
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

// slowPeer is a socket whose peer takes at most took bytes before each
// write deadline passes: none, a peer that stopped reading; a few, one
// that reads slower than it is sent to. It keeps the deadlines set.
type slowPeer struct {
	recordingConn
	took      int
	deadlines []time.Time
}

func (s *slowPeer) Write(p []byte) (int, error) {
	if len(p) <= s.took {
		return s.recordingConn.Write(p)
	}
	n, _ := s.recordingConn.Write(p[:s.took])
	return n, os.ErrDeadlineExceeded
}

func (s *slowPeer) SetWriteDeadline(at time.Time) error {
	s.deadlines = append(s.deadlines, at)
	return nil
}

// A peer that reads, however slowly, gets all it is sent: each wait for
// it is WriteTimeout from its last progress, not from the write's start.
// One that took nothing for WriteTimeout is given up on, and so is one
// still taking its close frame at the close's own deadline.
func TestSend_GivesUpOnlyOnAPeerThatTookNothing(t *testing.T) {
	frames := [][]byte{bytes.Repeat([]byte("x"), 200<<10), []byte("last")}
	slow := &slowPeer{took: 1000}
	c := &Conn{conn: slow, opts: Options{WriteTimeout: time.Second},
		writing: make(chan struct{}, 1)}
	if err := c.Send(frames, false); err != nil {
		t.Fatalf("Send to a slow reader: %v", err)
	}
	if got, want := slow.written.Len(), 200<<10+10+4+2; got != want {
		t.Fatalf("the slow reader got %d bytes, want %d", got, want)
	}
	if len(slow.deadlines) < 200 {
		t.Fatalf("%d deadlines, want one a kilobyte", len(slow.deadlines))
	}

	stopped := &slowPeer{}
	c = &Conn{conn: stopped, opts: Options{WriteTimeout: time.Second},
		writing: make(chan struct{}, 1)}
	if err := c.Send(frames, false); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Send to a peer that stopped reading: %v", err)
	}
	if len(stopped.deadlines) != 1 {
		t.Fatalf("%d deadlines, want the one", len(stopped.deadlines))
	}

	closing := &slowPeer{took: 1}
	c = &Conn{conn: closing, opts: Options{WriteTimeout: time.Second},
		writing: make(chan struct{}, 1)}
	until := time.Now().Add(time.Millisecond)
	if err := c.writeControl(opClose, []byte("bye"), until); err == nil {
		t.Fatal("a close frame written past its deadline")
	}
	if !closing.deadlines[0].Equal(until) || len(closing.deadlines) != 1 {
		t.Fatalf("deadlines %v, want %v alone", closing.deadlines, until)
	}
}

// TestSend_JoinsRunsStrictlyUnderMaxJoined: frames of 2 bytes,
// joined by newlines, fill MaxJoined exactly at 174,763 of them, one
// byte past what the protocol page promises; Send must stop one
// frame short, and lose or reorder none.
func TestSend_JoinsRunsStrictlyUnderMaxJoined(t *testing.T) {
	socket := &recordingConn{}
	c := &Conn{conn: socket, opts: Options{WriteTimeout: time.Second},
		writing: make(chan struct{}, 1)}
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
			accepted <- c
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

// serveOne serves Accept on a test server and hands each Conn to
// accepted; the test closes the server.
func serveOne(t *testing.T, opts Options) (*httptest.Server, chan *Conn) {
	t.Helper()
	accepted := make(chan *Conn, 4)
	server := httptest.NewServer(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			c, err := Accept(w, r, opts)
			if err == nil {
				accepted <- c
			}
		}))
	t.Cleanup(server.Close)
	return server, accepted
}

// rawClient is a WebSocket client written here, byte by byte, so that a
// test can send what no library would: a frame split anywhere, a ping
// inside a message, an unmasked frame.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	in   *bufio.Reader
}

// dialRaw upgrades a TCP connection to server, sending first along with
// the request, in the same write.
func dialRaw(t *testing.T, server *httptest.Server, first []byte) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(server.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	request := "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n" +
		"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := conn.Write(append([]byte(request), first...)); err != nil {
		t.Fatal(err)
	}
	in := bufio.NewReader(conn)
	response, err := http.ReadResponse(in, nil)
	if err != nil || response.StatusCode != http.StatusSwitchingProtocols ||
		response.Header.Get("Sec-WebSocket-Accept") !=
			"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("upgrade: %v, %+v", err, response)
	}
	return &rawClient{t: t, conn: conn, in: in}
}

// frame is a client's frame: op, final or not, masked with a fixed key.
func frame(op byte, fin bool, payload string) []byte {
	b := []byte{op, 0x80}
	if fin {
		b[0] |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b[1] |= byte(n)
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b[:1], 0x80|126), uint16(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b[:1], 0x80|127), uint64(n))
	}
	mask := []byte{1, 2, 3, 4}
	b = append(b, mask...)
	for i := range len(payload) {
		b = append(b, payload[i]^mask[i%4])
	}
	return b
}

// next reads the server's next frame: its opcode and payload.
func (r *rawClient) next() (byte, []byte) {
	r.t.Helper()
	var head [2]byte
	if _, err := io.ReadFull(r.in, head[:]); err != nil {
		r.t.Fatalf("reading a frame: %v", err)
	}
	size := uint64(head[1] & 0x7f)
	switch size {
	case 126:
		var n [2]byte
		io.ReadFull(r.in, n[:])
		size = uint64(binary.BigEndian.Uint16(n[:]))
	case 127:
		var n [8]byte
		io.ReadFull(r.in, n[:])
		size = binary.BigEndian.Uint64(n[:])
	}
	payload := make([]byte, size)
	if _, err := io.ReadFull(r.in, payload); err != nil {
		r.t.Fatalf("reading a frame: %v", err)
	}
	return head[0] & 0x0f, payload
}

// expectClose reads frames until a close, and checks its code.
func (r *rawClient) expectClose(code websocket.StatusCode) {
	r.t.Helper()
	for {
		op, payload := r.next()
		if op != opClose {
			continue
		}
		if got := websocket.StatusCode(binary.BigEndian.Uint16(payload)); got != code {
			r.t.Fatalf("closed with %d (%q), want %d", got, payload[2:], code)
		}
		return
	}
}

// A message may come in fragments split anywhere, with a ping among
// them, in the very packet that carried the upgrade: Read puts it back
// together, answers the ping, and holds no chunk once it is taken.
func TestRead_FragmentsAPingAndBytesSentWithTheUpgrade(t *testing.T) {
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second,
		LargeFrames: make(chan struct{}, 1)})
	long := strings.Repeat("é", 40000) // 80,000 bytes: a 64-bit length
	wire := slices.Concat(frame(opText, false, "hello, "),
		frame(opPing, true, "are you there?"),
		frame(opContinuation, false, long), frame(opContinuation, true, "!"),
		frame(opText, true, "second"))
	client := dialRaw(t, server, wire[:9])
	c := <-accepted
	c.SetReadLimit(1 << 20)
	go func() {
		for i := 9; i < len(wire); i += 1000 { // a kilobyte at a time
			client.conn.Write(wire[i:min(i+1000, len(wire))])
			time.Sleep(time.Millisecond)
		}
	}()
	for _, want := range []string{"hello, " + long + "!", "second"} {
		data, err := c.Read()
		if err != nil || string(data) != want {
			t.Fatalf("Read: %d bytes, %v; want %d", len(data), err, len(want))
		}
	}
	if c.in != nil {
		t.Fatalf("an idle reader holds a chunk of %d bytes", len(*c.in))
	}
	if op, payload := client.next(); op != opPong ||
		string(payload) != "are you there?" {
		t.Fatalf("answered the ping with op %d, %q", op, payload)
	}
}

// Each broken frame is closed with the code RFC 6455 names, and Read
// says the socket ended.
func TestRead_ClosesWhatItCannotTake(t *testing.T) {
	cases := []struct {
		name  string
		wire  []byte
		limit int64
		code  websocket.StatusCode
	}{
		{"binary", frame(opBinary, true, "\x00\x01"), 100,
			websocket.StatusUnsupportedData},
		{"over the limit", frame(opText, true, strings.Repeat("x", 101)),
			100, websocket.StatusMessageTooBig},
		{"unmasked", []byte{0x81, 0x02, 'h', 'i'}, 100,
			websocket.StatusProtocolError},
		{"reserved bit", append([]byte{0xc1}, frame(opText, true, "x")[1:]...),
			100, websocket.StatusProtocolError},
		{"continuation first", frame(opContinuation, true, "x"), 100,
			websocket.StatusProtocolError},
		{"text inside a message", slices.Concat(frame(opText, false, "a"),
			frame(opText, true, "b")), 100, websocket.StatusProtocolError},
		{"long ping", frame(opPing, true, strings.Repeat("p", 126)), 100,
			websocket.StatusProtocolError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			server, accepted := serveOne(t, Options{WriteTimeout: time.Second})
			client := dialRaw(t, server, nil)
			c := <-accepted
			c.SetReadLimit(tc.limit)
			read := make(chan error, 1)
			go func() {
				_, err := c.Read()
				read <- err
			}()
			// The peer answers the close, as a peer should, so that a
			// close waiting for it does not wait out closeTimeout.
			client.conn.Write(tc.wire)
			client.expectClose(tc.code)
			client.conn.Write(frame(opClose, true, ""))
			client.conn.Close()
			if err := <-read; err == nil {
				t.Fatal("Read returned a frame")
			}
		})
	}
}

// A close from the broker ends once the peer answers it, not after
// closeTimeout, whether the reader is waiting (it sees the answer, and
// Read ends with its code) or not yet (Close reads on to it itself).
func TestClose_EndsWithThePeersAnswer(t *testing.T) {
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(server.URL,
		"http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	read := make(chan error, 1)
	go func() {
		_, err := c.Read()
		read <- err
	}()
	// The client's library answers a close while it reads.
	go ws.Read(ctx)
	start := time.Now()
	c.Close(4008, "slow consumer")
	if took := time.Since(start); took >= closeTimeout {
		t.Fatalf("Close took %v, the whole timeout", took)
	}
	var closed websocket.CloseError
	if err := <-read; err == nil ||
		errors.As(err, &closed) && closed.Code != 4008 {
		t.Fatalf("Read ended with %v, want an end, or the answer 4008", err)
	}
}

// Ping returns once a pong comes, which the reader takes without
// returning it; with no reader, Close reads on to the peer's close
// itself.
func TestPingAndClose_AnsweredByAPeer(t *testing.T) {
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second})
	client := dialRaw(t, server, nil)
	c := <-accepted
	answered := make(chan string, 1)
	go func() {
		var answers []string
		for {
			var head [2]byte
			if _, err := io.ReadFull(client.in, head[:]); err != nil {
				answered <- strings.Join(answers, ", ")
				return
			}
			payload := make([]byte, head[1]&0x7f)
			io.ReadFull(client.in, payload)
			switch head[0] & 0x0f {
			case opPing:
				client.conn.Write(frame(opPong, true, string(payload)))
				client.conn.Write(frame(opText, true, "after the pong"))
				answers = append(answers, "pong")
			case opClose:
				client.conn.Write(frame(opClose, true, string(payload)))
				answers = append(answers, "close")
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(ctx) }()
	if data, err := c.Read(); err != nil || string(data) != "after the pong" {
		t.Fatalf("Read: %q, %v", data, err)
	}
	if err := <-pinged; err != nil {
		t.Fatalf("Ping: %v", err)
	}
	start := time.Now()
	c.Close(websocket.StatusGoingAway, "bye")
	if took := time.Since(start); took >= closeTimeout {
		t.Fatalf("Close took %v, the whole timeout", took)
	}
	if got := <-answered; got != "pong, close" {
		t.Fatalf("the peer answered %s", got)
	}
}

// Ping is answered by any frame, not only a pong: a peer that floods
// publishes has its pong read only after them, and is there all the
// while. A peer that sends nothing is not heard.
func TestPing_AnsweredByAnyFrame(t *testing.T) {
	server, accepted := serveOne(t, Options{WriteTimeout: time.Second})
	client := dialRaw(t, server, nil)
	c := <-accepted
	read := make(chan string, 1)
	go func() { data, _ := c.Read(); read <- string(data) }()

	quiet, cancel := context.WithTimeout(context.Background(),
		100*time.Millisecond)
	defer cancel()
	if err := c.Ping(quiet); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping of a silent peer: %v, want its deadline", err)
	}
	if op, _ := client.next(); op != opPing {
		t.Fatalf("got op %d, want a ping", op)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(ctx) }()
	if op, _ := client.next(); op != opPing {
		t.Fatalf("got op %d, want a ping", op)
	}
	client.conn.Write(frame(opText, true, "a publish, before the pong"))
	if got := <-read; got != "a publish, before the pong" {
		t.Fatalf("Read: %q", got)
	}
	if err := <-pinged; err != nil {
		t.Fatalf("Ping answered by a frame: %v", err)
	}
}

// The upgrade is refused as RFC 6455 and the Origin rules say.
func TestAccept_RefusesWhatIsNotAnUpgradeFromAnOriginAllowed(t *testing.T) {
	server, _ := serveOne(t, Options{OriginPatterns: []string{"*.example.com"}})
	upgrade := http.Header{"Connection": {"keep-alive, Upgrade"},
		"Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	cases := []struct {
		name   string
		change func(http.Header)
		status int
	}{
		{"plain GET", func(h http.Header) { clear(h) }, 426},
		{"version 8", func(h http.Header) { h.Set("Sec-Websocket-Version", "8") }, 400},
		{"short key", func(h http.Header) { h.Set("Sec-Websocket-Key", "c2hvcnQ=") }, 400},
		{"foreign origin", func(h http.Header) { h.Set("Origin", "https://evil.test") }, 403},
		{"allowed origin", func(h http.Header) { h.Set("Origin", "https://app.example.com") }, 101},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			request, _ := http.NewRequest("GET", server.URL, nil)
			request.Header = upgrade.Clone()
			tc.change(request.Header)
			response, err := http.DefaultClient.Do(request)
			if err != nil {
				t.Fatal(err)
			}
			response.Body.Close()
			if response.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", response.StatusCode, tc.status)
			}
		})
	}
}

// Seeded runs of messages in random fragments, with pings between them,
// written in random slices: Read returns every message whole and in
// order, and a pong answers every ping.
func TestRead_RandomFragmentsAndSlices(t *testing.T) {
	for seed := range int64(20) {
		rng := rand.New(rand.NewSource(seed))
		server, accepted := serveOne(t, Options{WriteTimeout: time.Second,
			LargeFrames: make(chan struct{}, 1)})
		var wire []byte
		var want []string
		pings := 0
		for range 30 {
			message := strings.Repeat(string(rune('a'+rng.Intn(26))),
				rng.Intn(3000))
			want = append(want, message)
			rest, op := message, byte(opText)
			for {
				n := min(len(rest), rng.Intn(1200))
				last := n == len(rest)
				wire = append(wire, frame(op, last, rest[:n])...)
				rest, op = rest[n:], opContinuation
				if rng.Intn(4) == 0 {
					wire = append(wire, frame(opPing, true, "p")...)
					pings++
				}
				if last {
					break
				}
			}
		}
		// A last message, so that Read takes the pings before it too.
		wire, want = append(wire, frame(opText, true, "end")...),
			append(want, "end")
		client := dialRaw(t, server, nil)
		c := <-accepted
		c.SetReadLimit(1 << 20)
		go func() {
			for rest := wire; len(rest) > 0; {
				n := min(len(rest), 1+rng.Intn(700))
				client.conn.Write(rest[:n])
				rest = rest[n:]
			}
		}()
		for i, message := range want {
			data, err := c.Read()
			if err != nil || string(data) != message {
				t.Fatalf("seed %d, message %d: %d bytes, %v; want %d",
					seed, i, len(data), err, len(message))
			}
		}
		for range pings {
			if op, _ := client.next(); op != opPong {
				t.Fatalf("seed %d: op %d where a pong was due", seed, op)
			}
		}
		c.CloseNow()
	}
}

// BenchmarkSend_OneDelivery sends one 100-byte delivery a write to a
// peer over loopback that reads everything, as a subscriber of one
// message at a time is sent it.
func BenchmarkSend_OneDelivery(b *testing.B) {
	accepted := make(chan *Conn, 1)
	server := httptest.NewServer(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			if c, err := Accept(w, r, Options{}); err == nil {
				accepted <- c
			}
		}))
	defer server.Close()
	peer, err := net.Dial("tcp", strings.TrimPrefix(server.URL, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	request := "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n" +
		"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := peer.Write([]byte(request)); err != nil {
		b.Fatal(err)
	}
	go io.Copy(io.Discard, peer)
	c := <-accepted
	defer c.CloseNow()
	delivery := [][]byte{bytes.Repeat([]byte("x"), 100)}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Send(delivery, false); err != nil {
			b.Fatal(err)
		}
	}
}
