package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
	"github.com/popsub/popsub/internal/logbuf"
)

// These tests are the HTTP door as a stranger meets it: raw sockets on
// 127.0.0.1 that send half a request, or none, and never read.

// rawConn opens a socket to s and sends text on it.
func (s *server) rawConn(text string) net.Conn {
	s.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, text); err != nil {
		s.t.Fatal(err)
	}
	return conn
}

// response reads one HTTP response from conn, within 30 s.
func response(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	reader := bufio.NewReader(conn)
	res, err := http.ReadResponse(reader, nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// closedBy reports whether the server closed conn within 30 s, reading
// and dropping whatever came first.
func closedBy(conn net.Conn) bool {
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	return err == nil // EOF: io.Copy reports no error
}

// postHead is the head of a POST to topic whose body is length bytes
// long and has not been sent.
func postHead(topic, token string, length int) string {
	return fmt.Sprintf("POST /topics/%s HTTP/1.1\r\nHost: popsub\r\n"+
		"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", topic,
		token, length)
}

func TestDoor_RefusesAStrangerBeforeReadingItsBody(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	sensor := token(t, "sensor", []string{"sensors/#"}, nil)
	cases := []struct {
		name, token, topic string
		status             int
		code               string
	}{
		{"a token that is not one", "x", "chat", 401, "auth_failed"},
		{"a token from another secret", forged(t), "chat", 401,
			"auth_failed"},
		{"a topic outside the grant", sensor, "chat", 403, "forbidden"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.t = t
			// The body announced is a megabyte, and never comes: the
			// answer must not wait for it.
			conn := s.rawConn(postHead(c.topic, c.token, 1<<20))
			res, body := response(t, conn)
			if res.StatusCode != c.status || !strings.Contains(body,
				`"code":"`+c.code+`"`) {
				t.Fatalf("got %s %s, want %d %s", res.Status, body, c.status,
					c.code)
			}
			if !res.Close {
				t.Error("the refusal keeps the connection open")
			}
			if !closedBy(conn) {
				t.Error("the server did not close the connection")
			}
		})
	}
}

// forged is a token signed with another secret.
func forged(t *testing.T) string {
	t.Helper()
	signed, err := popsub.NewToken([]byte("another-secret-of-at-least-32-bytes"),
		"alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

func TestDoor_BoundsEveryStageOfARequest(t *testing.T) {
	door := DoorOptions{HeaderTimeout: 300 * time.Millisecond,
		IdleTimeout: 300 * time.Millisecond}
	s := startBehind(t, popsub.Options{},
		Options{BodyTimeout: 300 * time.Millisecond}, door, 0)
	alice := token(t, "alice", nil, nil)

	t.Run("headers that never end are cut off", func(t *testing.T) {
		s.t = t
		conn := s.rawConn("POST /topics/chat HTTP/1.1\r\nHost: popsub\r\n")
		if !closedBy(conn) {
			t.Error("a socket that never finished its headers stayed open")
		}
	})
	t.Run("headers over the limit are 431", func(t *testing.T) {
		s.t = t
		conn := s.rawConn("GET /topics/chat HTTP/1.1\r\nHost: popsub\r\n" +
			"X-Padding: " + strings.Repeat("x", 32<<10) + "\r\n\r\n")
		if res, _ := response(t, conn); res.StatusCode != 431 {
			t.Errorf("got %s, want 431", res.Status)
		}
	})
	t.Run("a body that never finishes is 408", func(t *testing.T) {
		s.t = t
		conn := s.rawConn(postHead("chat", alice, 100) + `"only part`)
		res, body := response(t, conn)
		if res.StatusCode != 408 || !strings.Contains(body, `"timeout"`) {
			t.Errorf("got %s %s, want 408 timeout", res.Status, body)
		}
	})
	t.Run("an idle keep-alive socket is closed", func(t *testing.T) {
		s.t = t
		conn := s.rawConn(postHead("chat", alice, 1) + "1")
		if res, body := response(t, conn); res.StatusCode != 200 {
			t.Fatalf("got %s %s, want 200", res.Status, body)
		}
		if !closedBy(conn) {
			t.Error("an idle keep-alive socket stayed open")
		}
	})
}

func TestDoor_CapsSocketsOfEveryKind(t *testing.T) {
	s := startBehind(t, popsub.Options{}, Options{}, DoorOptions{}, 2)
	// Two idle sockets hold the cap; neither has sent a byte.
	s.rawConn("")
	held := s.rawConn("")
	conn := s.rawConn("GET /topics/chat HTTP/1.1\r\nHost: popsub\r\n\r\n")
	res, _ := response(t, conn)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a third socket got %s, want 503 with Retry-After",
			res.Status)
	}

	// A socket that closes gives its place back.
	held.Close()
	alice := token(t, "alice", nil, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn := s.rawConn(postHead("chat", alice, 1) + "1")
		res, _ := response(t, conn)
		conn.Close()
		if res.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a socket closed, a publish still got %s",
				res.Status)
		}
	}
}

func TestDoor_HandshakeErrorsAreCountedAndLoggedOnceASecond(t *testing.T) {
	var counted atomic.Int64
	var log logbuf.Buffer
	server := NewServer(http.NotFoundHandler(), DoorOptions{
		Logger:           slog.New(slog.NewTextHandler(&log, nil)),
		OnHandshakeError: func() { counted.Add(1) }})
	web := httptest.NewUnstartedServer(nil)
	web.Config = server
	web.StartTLS()
	defer web.Close()

	// Connect and hang up, as a port scan does, fifty times.
	for range 50 {
		conn, err := net.Dial("tcp", web.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte("not a TLS hello\r\n\r\n"))
		conn.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for counted.Load() < 50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if counted.Load() != 50 {
		t.Fatalf("counted %d handshake errors, want 50", counted.Load())
	}
	// A client that does finish its handshake is served as usual.
	client := web.Client()
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{
		InsecureSkipVerify: true}
	if res, err := client.Get(web.URL); err != nil || res.StatusCode != 404 {
		t.Fatalf("a real client: %v %v", res, err)
	}
	lines := strings.Count(log.String(), "TLS handshakes failed")
	if lines < 1 || lines > 3 {
		t.Errorf("%d log lines for 50 errors in a moment, want one a "+
			"second:\n%s", lines, log.String())
	}
}

func TestDoor_LargeBodiesInFlightShareOneBudget(t *testing.T) {
	const large = smallBody + 100
	s := start(t, popsub.Options{MaxFrameBytes: 4 * large}, Options{
		MaxBody: 2 * large, MaxBodies: large + large/2,
		BodyTimeout: 20 * time.Second})
	alice := token(t, "alice", nil, nil)
	body := `"` + strings.Repeat("x", large-2) + `"`

	// A large body that is slow to come holds its room.
	slow := s.rawConn(postHead("chat", alice, large) + `"`)
	s.waitForBodies(large)

	// The next large body finds no room: 503 with Retry-After, never 401.
	status, answer, header := s.post("chat", "", alice, body)
	if status != 503 || answer.Code != "unavailable" ||
		header.Get("Retry-After") == "" {
		t.Fatalf("got %d %+v, want 503 unavailable with Retry-After", status,
			answer)
	}
	// A small one needs no room, and is not held up.
	if status, answer, _ = s.post("chat", "", alice, `1`); status != 200 {
		t.Fatalf("a small body: %d %+v, want 200", status, answer)
	}
	// Once the slow body is done, its room is free again.
	io.WriteString(slow, body[1:])
	if res, body := response(t, slow); res.StatusCode != 200 {
		t.Fatalf("the slow body: %s %s", res.Status, body)
	}
	s.waitForBodies(0)
	status, answer, _ = s.post("chat", "", alice, body)
	if status != 200 {
		t.Fatalf("after the room came back: %d %+v, want 200", status,
			answer)
	}
}

// A body sent without a Content-Length (chunked, as curl -T - streams
// it) may be as large as a body may be, so it holds that much room until
// it is read: the budget bounds what such bodies cost, not what they say.
func TestDoor_ABodyOfUnknownLengthHoldsRoomForTheLargest(t *testing.T) {
	const large = smallBody + 100
	s := start(t, popsub.Options{MaxFrameBytes: 4 * large}, Options{
		MaxBody: 2 * large, MaxBodies: 2*large + large/2,
		BodyTimeout: 20 * time.Second})
	alice := token(t, "alice", nil, nil)

	// One byte of a chunked body, and no more for now.
	head := strings.Replace(postHead("chat", alice, 0), "Content-Length: 0",
		"Transfer-Encoding: chunked", 1)
	slow := s.rawConn(head + "1\r\n\"\r\n")
	s.waitForBodies(2 * large)

	// A large body finds half of its size free: 503.
	body := `"` + strings.Repeat("x", large-2) + `"`
	if status, answer, _ := s.post("chat", "", alice, body); status != 503 {
		t.Fatalf("a large body beside the chunked one: %d %+v, want 503",
			status, answer)
	}
	// The chunked body ends; it is published, and its room comes back.
	io.WriteString(slow, "2\r\nhi\r\n1\r\n\"\r\n0\r\n\r\n")
	if res, answer := response(t, slow); res.StatusCode != 200 ||
		!strings.Contains(answer, `"published"`) {
		t.Fatalf("the chunked body: %s %s", res.Status, answer)
	}
	s.waitForBodies(0)
	if status, answer, _ := s.post("chat", "", alice, body); status != 200 {
		t.Fatalf("after the chunked body: %d %+v, want 200", status, answer)
	}
}

// waitForBodies waits until requests in flight hold n bytes of the
// bodies' budget, for 10 s at most.
func (s *server) waitForBodies(n int64) {
	s.t.Helper()
	b := s.gateway.bodies
	for deadline := time.Now().Add(10 * time.Second); ; {
		b.mu.Lock()
		taken := b.total - b.room
		b.mu.Unlock()
		if taken == n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("bodies in flight hold %d bytes, want %d", taken, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPublish_RequestsOnOneTokenDoNotTakeTurns(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	alice := token(t, "alice", nil, nil)
	bob := dial(t, s.url, alice)
	bob.send(`{"type":"subscribe","topic":"chat","last":0}`)
	bob.expect("subscribed")

	// Sixty-four requests at once on one token, half of them QoS 0: each
	// hears the answer that names its own message.
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := range n {
		wg.Go(func() {
			qos := i % 2
			req, _ := http.NewRequest("POST", fmt.Sprintf(
				"%s/topics/chat?message_id=m-%d&qos=%d", s.url, i, qos),
				strings.NewReader(fmt.Sprint(i)))
			req.Header.Set("Authorization", "Bearer "+alice)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err.Error()
				return
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			want := []int{202, 200}[qos]
			if res.StatusCode != want || !bytes.Contains(body,
				fmt.Appendf(nil, `"message_id":"m-%d"`, i)) {
				errs <- fmt.Sprintf("m-%d: %s %s", i, res.Status, body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	got := map[string]bool{}
	for range n {
		got[bob.expect("message").MessageID] = true
	}
	if len(got) != n {
		t.Errorf("bob got %d distinct messages, want %d", len(got), n)
	}
	// They shared one session, which waits for nothing now: a QoS 0
	// publish, answered by its pong, leaves no request waiting behind.
	s.gateway.mu.Lock()
	sessions := len(s.gateway.publishers)
	waiting := 0
	for _, p := range s.gateway.publishers {
		p.mu.Lock()
		waiting += len(p.waiting) + len(p.pongs)
		p.mu.Unlock()
	}
	s.gateway.mu.Unlock()
	if sessions != 1 || waiting != 0 {
		t.Errorf("%d publisher sessions for one token, %d requests left "+
			"waiting; want 1 and 0", sessions, waiting)
	}
}

func TestStream_ADurableNameHasOneOwner(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	alice := token(t, "alice", nil, nil)
	first := s.stream("chat", "?durable=tab", alice)
	first.next() // subscribed

	t.Run("a second stream on the name is 409", func(t *testing.T) {
		s.t = t
		status, body := s.refusedStream("chat", "?durable=tab", alice)
		if status != 409 || !strings.Contains(body, "durable_in_use") {
			t.Fatalf("got %d %s, want 409 durable_in_use", status, body)
		}
	})
	t.Run("a stream taken over does not come back", func(t *testing.T) {
		s.t = t
		ws := dial(t, s.url, alice)
		ws.send(`{"type":"subscribe","topic":"chat","durable":"tab"}`)
		ws.expect("subscribed")
		if ev := first.next(); ev.name != "unsubscribed" {
			t.Fatalf("the stream got %+v, want unsubscribed", ev)
		}
		// EventSource reconnects with the last id it saw: refused, so it
		// stops, and the socket keeps the name.
		var status int
		var body string
		deadline := time.Now().Add(30 * time.Second)
		for status != 409 && time.Now().Before(deadline) {
			status, body = s.refusedStream("chat", "?durable=tab", alice,
				"Last-Event-ID", "0")
		}
		if status != 409 || !strings.Contains(body, "durable_taken_over") {
			t.Fatalf("the reconnect got %d %s, want 409 durable_taken_over",
				status, body)
		}
		// A new page, with no Last-Event-ID, may take it back.
		s.stream("chat", "?durable=tab", alice)
		ws.expect("unsubscribed")
	})
}

// refusedStream opens a stream that should be refused, and returns the
// status and the body.
func (s *server) refusedStream(topic, query, token string,
	headers ...string) (int, string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET",
		s.url+"/topics/"+topic+query, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode == 200 {
		return 200, ""
	}
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

func TestCORS_OnlyTheListedOriginsMayUseTheGateway(t *testing.T) {
	s := start(t, popsub.Options{}, Options{
		Origins: []string{"app.example.com"}})
	alice := token(t, "alice", nil, nil)
	request := func(method, origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, s.url+"/topics/chat",
			strings.NewReader(`1`))
		req.Header.Set("Authorization", "Bearer "+alice)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}

	res := request("OPTIONS", "https://app.example.com")
	if res.StatusCode != 204 || res.Header.Get(
		"Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(res.Header.Get("Access-Control-Allow-Headers"),
			"Authorization") {
		t.Errorf("a listed origin's preflight: %s %v", res.Status, res.Header)
	}
	res = request("POST", "https://app.example.com")
	if res.StatusCode != 200 || res.Header.Get(
		"Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Errorf("a listed origin's publish: %s %v", res.Status, res.Header)
	}
	for _, method := range []string{"OPTIONS", "POST", "GET"} {
		res = request(method, "https://evil.example.net")
		if res.StatusCode != 403 ||
			res.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s from a foreign origin: %s, want 403 without CORS",
				method, res.Status)
		}
	}
	// The broker's own pages are same-origin, and need no listing.
	if res = request("POST", s.url); res.StatusCode != 200 {
		t.Errorf("a same-origin publish: %s", res.Status)
	}
}

// BenchmarkPublish_ParallelOnOneToken publishes by POST from 64
// goroutines at once, all on one token or each on its own: on one
// token, the requests share one session without taking turns.
func BenchmarkPublish_ParallelOnOneToken(b *testing.B) {
	for _, shared := range []bool{true, false} {
		name := map[bool]string{true: "one token", false: "a token each"}
		b.Run(name[shared], func(b *testing.B) {
			t := &testing.T{}
			s := startBenchServer(b, t)
			var next atomic.Int64
			one := token(t, "alice", nil, nil)
			b.SetParallelism(32) // 64 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				tok := one
				if !shared {
					tok = token(t, fmt.Sprint("p-", next.Add(1)), nil, nil)
				}
				client := &http.Client{}
				for pb.Next() {
					req, _ := http.NewRequest("POST", s.url+"/topics/bench",
						strings.NewReader(`"x"`))
					req.Header.Set("Authorization", "Bearer "+tok)
					res, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			})
		})
	}
}

// startBenchServer is start for a benchmark.
func startBenchServer(b *testing.B, t *testing.T) *server {
	b.Helper()
	store, err := boltstore.Open(filepath.Join(b.TempDir(), "b.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	broker, err := popsub.New(popsub.Options{Secret: testSecret,
		Store: store, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	g := New(broker, Options{Logger: quiet})
	mux := http.NewServeMux()
	mux.Handle("/topics/{topic...}", g)
	web := httptest.NewServer(mux)
	b.Cleanup(func() {
		g.Close()
		web.Close()
		broker.Shutdown(context.Background())
	})
	return &server{t: t, url: web.URL, broker: broker, gateway: g}
}
