package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
	"github.com/popsub/popsub/wire"
)

// These tests drive the gateway as curl and EventSource would, over real
// sockets on 127.0.0.1, against a broker on a bbolt file.

var testSecret = []byte("gateway-test-secret-of-at-least-32-bytes")

// server is a broker with the gateway in front, and what it told OnEvent.
type server struct {
	t       *testing.T
	url     string
	broker  *popsub.Broker
	gateway *Gateway
	events  chan wire.Event
}

// panicsFail is net/http's error log in these tests: net/http recovers
// a handler's panic and logs it, and the client sees only a dropped
// connection, so a logged panic fails the test.
type panicsFail struct{ t *testing.T }

// Write fails the test if p tells of a panic.
func (f panicsFail) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("panic")) {
		f.t.Errorf("the gateway panicked: %s", p)
	}
	return len(p), nil
}

// start serves a broker with opts, the gateway with gopts, on 127.0.0.1,
// behind the door the command serves with.
func start(t *testing.T, opts popsub.Options, gopts Options) *server {
	t.Helper()
	return startBehind(t, opts, gopts, DoorOptions{}, 0)
}

// startBehind is start with the door's options, and a cap on sockets.
func startBehind(t *testing.T, opts popsub.Options, gopts Options,
	door DoorOptions, sockets int) *server {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "test.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, events: make(chan wire.Event, 1<<16)}
	opts.Secret = testSecret
	if opts.Store == nil {
		opts.Store = store
	}
	opts.Logger = quiet
	opts.OnEvent = func(e wire.Event) {
		select {
		case s.events <- e:
		default:
		}
	}
	if s.broker, err = popsub.New(opts); err != nil {
		t.Fatal(err)
	}
	gopts.Logger = quiet
	s.gateway = New(s.broker, gopts)
	mux := http.NewServeMux()
	mux.Handle("/ws", s.broker)
	mux.Handle("/topics/{topic...}", s.gateway)
	web := httptest.NewUnstartedServer(mux)
	door.Logger = quiet
	web.Config = NewServer(mux, door)
	web.Config.ErrorLog = log.New(panicsFail{t}, "", 0)
	web.Listener = Limit(web.Listener, sockets)
	web.Start()
	s.url = web.URL
	t.Cleanup(func() {
		s.gateway.Close()
		web.CloseClientConnections()
		web.Close()
		ctx, cancel := context.WithTimeout(context.Background(),
			10*time.Second)
		defer cancel()
		s.broker.Shutdown(ctx)
	})
	return s
}

// quiet is a logger that drops everything.
var quiet = slog.New(slog.DiscardHandler)

// token signs a token for sub with grants (nil: every ordinary topic).
func token(t *testing.T, sub string, publish, subscribe []string) string {
	t.Helper()
	claims := popsub.Claims{Publish: publish, Subscribe: subscribe}
	claims.Subject = sub
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	signed, err := claims.Sign(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

// post publishes body to topic with query and token, and returns the
// status, the answer and its headers.
func (s *server) post(topic, query, token, body string) (int, wire.Received,
	http.Header) {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/topics/"+topic+query,
		strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	var answer wire.Received
	data, _ := io.ReadAll(res.Body)
	frames.Add(s.t.Name(), "", false, data)
	if err := json.Unmarshal(data, &answer); err != nil {
		s.t.Fatalf("answer %q: %v", data, err)
	}
	return res.StatusCode, answer, res.Header
}

// waitFor returns the first event kind for a connection named client.
func (s *server) waitFor(kind, client string) wire.Event {
	s.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e := <-s.events:
			if e.Kind == kind && (client == "" || e.Client == client) {
				return e
			}
		case <-timeout:
			s.t.Fatalf("no %s event for %q", kind, client)
		}
	}
}

func TestPublish_AnswersWithTheFrameAndAFittingStatus(t *testing.T) {
	s := start(t, popsub.Options{
		FeatureOptions: popsub.FeatureOptions{PublishRate: 1}}, Options{MaxBody: 64})
	alice := token(t, "alice", nil, nil)
	sensor := token(t, "sensor", []string{"sensors/#"}, nil)
	claims := popsub.Claims{}
	claims.Subject = "alice"
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Minute))
	expired, _ := claims.Sign(testSecret)

	cases := []struct {
		name, topic, query, token, body string
		status                          int
		code                            string
	}{
		{"a QoS 1 publish is answered with its confirm", "chat", "",
			alice, `"hello"`, 200, ""},
		{"no token is 401", "chat", "", "", `1`, 401, "unauthenticated"},
		{"a bad token is 401", "chat", "", "not-a-token", `1`, 401,
			"auth_failed"},
		{"a topic outside the grant is 403", "chat", "", sensor, `1`, 403,
			"forbidden"},
		{"a body that is not JSON is 400", "sensors/a", "", sensor, `{`, 400,
			"bad_frame"},
		{"a body that is not UTF-8 is 400", "sensors/a", "", sensor,
			"\"\xff\"", 400, "bad_frame"},
		{"an expired token is 401", "chat", "", expired, `1`, 401,
			"token_expired"},
		{"a wildcard topic is 400", "sensors/+", "", sensor, `1`, 400,
			"invalid_topic"},
		{"a qos of 2 is 400", "sensors/a", "?qos=2", sensor, `1`, 400,
			"invalid_qos"},
		{"no body is 400", "sensors/a", "", sensor, ``, 400,
			"missing_field"},
		{"a delay that is not a number is 400", "sensors/a",
			"?delay_ms=soon", sensor, `1`, 400, "bad_frame"},
		{"a negative delay is 400", "sensors/a", "?delay_ms=-1", sensor, `1`,
			400, "invalid_delay"},
		{"a ttl_ms of 0 is 400", "sensors/a", "?ttl_ms=0", sensor, `1`, 400,
			"invalid_ttl"},
		{"a parameter it does not know is 400, not ignored", "sensors/a",
			"?dealy_ms=5000", sensor, `1`, 400, "bad_request"},
		{"a body over the limit is 413", "sensors/a", "", sensor,
			`"` + strings.Repeat("x", 80) + `"`, 413, "too_large"},
		{"the first publish in a second is allowed", "sensors/a", "", sensor,
			`1`, 200, ""},
		{"the next is 429: the session's rate limit holds across requests",
			"sensors/a", "", sensor, `2`, 429, "rate_limited"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.t = t
			status, answer, header := s.post(c.topic, c.query, c.token,
				c.body)
			if status != c.status || answer.Code != c.code {
				t.Fatalf("got %d %+v, want %d %q", status, answer, c.status,
					c.code)
			}
			switch status {
			case 200:
				if answer.Type != "published" || answer.Seq == 0 {
					t.Errorf("answer %+v, want a confirm", answer)
				}
			case 401:
				if header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
			case 429:
				if header.Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
			}
		})
	}
}

func TestPublish_DeliversConfirmsAndDeduplicates(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	alice := token(t, "alice", nil, nil)
	bob := dial(t, s.url, alice)
	bob.send(`{"type":"subscribe","topic":"chat","last":0}`)
	bob.expect("subscribed")

	status, first, _ := s.post("chat", "?message_id=m-1", alice, `{"n":1}`)
	if status != 200 || first.Seq != 1 || first.MessageID != "m-1" ||
		first.Duplicate {
		t.Fatalf("first publish: %d %+v", status, first)
	}
	status, again, _ := s.post("chat", "?message_id=m-1", alice, `{"n":1}`)
	if status != 200 || again.Seq != 1 || !again.Duplicate {
		t.Fatalf("the same message_id again: %d %+v, want seq 1, duplicate",
			status, again)
	}
	status, quick, _ := s.post("chat", "?qos=0", alice, `"fast"`)
	if status != 202 || quick.Type != "accepted" || quick.MessageID == "" {
		t.Fatalf("a QoS 0 publish: %d %+v, want 202 accepted", status, quick)
	}
	got := bob.expect("message")
	if got.Seq != 1 || string(got.Payload) != `{"n":1}` {
		t.Errorf("bob got %+v, want seq 1", got)
	}
	if got = bob.expect("message"); got.Seq != 2 ||
		got.MessageID != quick.MessageID {
		t.Errorf("bob got %+v, want seq 2 with the accepted id", got)
	}
}

// A delayed publish over HTTP is answered with its confirm on
// $delayed/<topic>, and reaches a subscriber when due, with deliver_at
// and expires_at as a socket's publish would have them.
func TestPublish_TakesTheFramesTimesAsQueryParameters(t *testing.T) {
	s := start(t, popsub.Options{AckTimeout: 500 * time.Millisecond},
		Options{})
	alice := token(t, "alice", nil, nil)
	bob := dial(t, s.url, alice)
	bob.send(`{"type":"subscribe","topic":"chat"}`)
	bob.expect("subscribed")

	status, confirm, _ := s.post("chat",
		"?message_id=later&delay_ms=300&ttl_ms=60000", alice, `"later"`)
	if status != 200 || confirm.Type != "published" ||
		confirm.Topic != "$delayed/chat" || confirm.MessageID != "later" {
		t.Fatalf("a delayed publish: %d %+v, want its confirm on "+
			"$delayed/chat", status, confirm)
	}
	got := bob.expect("message")
	if got.MessageID != "later" || got.DeliverAt == 0 ||
		got.ExpiresAt != got.DeliverAt+60000 {
		t.Fatalf("bob got %+v, want later with deliver_at, and expires_at "+
			"a minute after it", got)
	}
}

func TestPublish_StatusWhenTheBrokerCannot(t *testing.T) {
	t.Run("a full broker is 503", func(t *testing.T) {
		s := start(t, popsub.Options{
			FeatureOptions: popsub.FeatureOptions{MaxConnections: 1}}, Options{})
		alice := token(t, "alice", nil, nil)
		dial(t, s.url, alice)
		status, answer, _ := s.post("chat", "", alice, `1`)
		if status != 503 || answer.Code != "unavailable" {
			t.Fatalf("got %d %+v, want 503 unavailable", status, answer)
		}
	})
	t.Run("a topic past the broker's cap is 503", func(t *testing.T) {
		s := start(t, popsub.Options{
			FeatureOptions: popsub.FeatureOptions{MaxTopics: 1}}, Options{})
		alice := token(t, "alice", nil, nil)
		if status, _, _ := s.post("chat", "", alice, `1`); status != 200 {
			t.Fatalf("the first topic got %d, want 200", status)
		}
		status, answer, header := s.post("news", "", alice, `1`)
		if status != 503 || answer.Code != "topic_limit" ||
			answer.Topic != "news" || header.Get("Retry-After") == "" {
			t.Fatalf("got %d %+v, want 503 topic_limit naming news, with "+
				"Retry-After", status, answer)
		}
	})
	t.Run("a log that refuses the message is 503", func(t *testing.T) {
		s := start(t, popsub.Options{Store: refusing(t)}, Options{})
		status, answer, _ := s.post("chat", "", token(t, "alice", nil, nil),
			`1`)
		if status != 503 || answer.Code != "store_failed" {
			t.Fatalf("got %d %+v, want 503 store_failed", status, answer)
		}
	})
}

func TestStream_ReplaysThenStreamsLive(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	alice := token(t, "alice", nil, nil)
	s.post("chat", "", alice, `"one"`)
	s.post("chat", "", alice, `"two"`)

	events := s.stream("chat", "?after=0&access_token="+alice, "")
	subscribed := events.next()
	if subscribed.name != "subscribed" || subscribed.frame.Seq != 2 {
		t.Fatalf("first event %+v, want subscribed at seq 2", subscribed)
	}
	for want := uint64(1); want <= 2; want++ {
		if e := events.next(); e.id != fmt.Sprint(want) ||
			e.frame.Seq != want {
			t.Fatalf("event %+v, want seq %d", e, want)
		}
	}
	s.post("chat", "", alice, `"three"`)
	if e := events.next(); e.id != "3" || string(e.frame.Payload) != `"three"` {
		t.Fatalf("live event %+v, want three at 3", e)
	}
	// The QoS 1 deliveries were acked as they were written.
	s.waitFor("acked", "sse")
}

func TestStream_ResumesWithLastEventID(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	alice := token(t, "alice", nil, nil)
	for i := 1; i <= 3; i++ {
		s.post("chat", "", alice, fmt.Sprint(i))
	}
	first := s.stream("chat", "?after=0", alice)
	first.next()
	for i := 0; i < 2; i++ {
		first.next()
	}
	// The connection drops; EventSource comes back with the last id it
	// saw, which wins over the URL's after=0.
	first.cut()
	s.post("chat", "", alice, "4")
	again := s.stream("chat", "?after=0", alice, "Last-Event-ID", "2")
	if e := again.next(); e.name != "subscribed" || e.frame.Recovered != nil {
		t.Fatalf("first event %+v, want subscribed, recovered", e)
	}
	for want := uint64(3); want <= 4; want++ {
		if e := again.next(); e.frame.Seq != want {
			t.Fatalf("event %+v, want seq %d", e, want)
		}
	}
}

func TestStream_SaysWhenALogGapCannotBeRecovered(t *testing.T) {
	s := start(t, popsub.Options{MaxMessages: 2}, Options{})
	alice := token(t, "alice", nil, nil)
	for i := 1; i <= 5; i++ {
		s.post("chat", "", alice, fmt.Sprint(i))
	}
	events := s.stream("chat", "", alice, "Last-Event-ID", "1")
	e := events.next()
	if e.name != "subscribed" || e.frame.Recovered == nil ||
		*e.frame.Recovered {
		t.Fatalf("first event %+v, want subscribed with recovered:false", e)
	}
	if e := events.next(); e.frame.Seq != 4 {
		t.Fatalf("after the gap %+v, want the oldest kept, 4", e)
	}
}

func TestStream_RefusalsAreHTTPErrors(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	sensor := token(t, "sensor", nil, []string{"sensors/#"})
	cases := []struct {
		name, topic, query string
		status             int
		code               string
	}{
		{"no token is 401", "chat", "", 401, "unauthenticated"},
		{"a bad token is 401", "chat", "?access_token=nope", 401,
			"auth_failed"},
		{"a topic outside the grant is 403", "chat", "?access_token=" +
			sensor, 403, "forbidden"},
		{"a bad after is 400", "sensors/a", "?after=-1&access_token=" +
			sensor, 400, "bad_frame"},
		{"replay on a wildcard is 400", "sensors/+", "?after=0&" +
			"access_token=" + sensor, 400, "bad_frame"},
		{"a parameter it does not know is 400, not ignored", "sensors/a",
			"?afer=3&access_token=" + sensor, 400, "bad_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := http.Get(s.url + "/topics/" + c.topic + c.query)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var answer wire.Received
			json.NewDecoder(res.Body).Decode(&answer)
			if res.StatusCode != c.status || answer.Code != c.code {
				t.Fatalf("got %d %+v, want %d %q", res.StatusCode, answer,
					c.status, c.code)
			}
		})
	}
}

func TestStream_KeepsAnIdleStreamAlive(t *testing.T) {
	s := start(t, popsub.Options{}, Options{Keepalive: 20 * time.Millisecond})
	events := s.stream("quiet", "", token(t, "alice", nil, nil))
	events.next()
	if line := events.comment(); line != ": keepalive" {
		t.Fatalf("got %q, want a keepalive comment", line)
	}
}

func TestStream_EndsWithAClosedEvent(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	events := s.stream("chat", "", token(t, "alice", nil, nil))
	events.next()
	s.gateway.Close()
	e := events.next()
	if e.name != "closed" || e.frame.Code != "unavailable" {
		t.Fatalf("got %+v, want closed, unavailable (1001)", e)
	}
}

// TestStream_SlowReaderIsCutOffAlone checks that a stream whose reader
// stops reading is handled as any slow subscriber: cut off by the broker
// (4008, as serve sets it up: the gateway's write timeout more than
// twice the broker's, as the broker may take twice its own), while
// another subscriber gets every message. The test publishes, paced,
// until the stream's session is gone, so it does not depend on how much
// the sockets' buffers hold; only on their being finite. The gateway's
// timeout here is four times the broker's: a loaded machine's room.
func TestStream_SlowReaderIsCutOffAlone(t *testing.T) {
	s := start(t, popsub.Options{WriteTimeout: 500 * time.Millisecond},
		Options{WriteTimeout: 2 * time.Second})
	alice := token(t, "alice", nil, nil)
	stuck := s.rawStream("chat", alice)
	defer stuck.Close()
	stream := s.waitFor("subscribed", "sse")

	fast := dial(t, s.url, alice)
	fast.send(`{"type":"subscribe","topic":"chat","last":0}`)
	fast.expect("subscribed")
	last := make(chan uint64, 1)
	go func() {
		var seq uint64
		defer func() { last <- seq }()
		for {
			f, err := fast.read()
			if err != nil || string(f.Payload) == `"end"` {
				return
			}
			if f.Seq != seq+1 {
				t.Errorf("the fast subscriber got seq %d after %d", f.Seq,
					seq)
			}
			seq = f.Seq
		}
	}()

	payload := strings.Repeat("x", 8<<10)
	pace := time.NewTicker(time.Millisecond)
	defer pace.Stop()
	var published uint64
	for gone := false; !gone; {
		seq, err := s.broker.Publish(context.Background(), "chat", payload, 0)
		if err != nil {
			t.Fatal(err)
		}
		published = seq
		if published > 1e5 {
			t.Fatalf("published %d without the stuck stream being cut off",
				published)
		}
		for len(s.events) > 0 && !gone {
			e := <-s.events
			if e.Conn == stream.Conn && e.Kind == "disconnected" {
				t.Fatal("the stream ended by itself, not cut off by the broker")
			}
			gone = e.Conn == stream.Conn && e.Kind == "disconnected_slow"
		}
		<-pace.C
	}
	s.broker.Publish(context.Background(), "chat", "end", 1)
	if got := <-last; got != published {
		t.Errorf("the fast subscriber got up to %d of %d", got, published)
	}
}

// events reads a Server-Sent Events stream.
type events struct {
	t      *testing.T
	body   io.ReadCloser
	reader *bufio.Reader
}

// event is one event of a stream.
type event struct {
	id, name string
	frame    wire.Received
}

// stream opens a stream of topic with query, and headers in pairs; a
// token goes as Authorization: Bearer.
func (s *server) stream(topic, query, token string, headers ...string) *events {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/topics/"+topic+query, nil)
	req.Header.Set("Accept", "text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	if res.StatusCode != 200 ||
		res.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(res.Body)
		s.t.Fatalf("stream: %s %s", res.Status, data)
	}
	s.t.Cleanup(func() { res.Body.Close() })
	e := &events{t: s.t, body: res.Body, reader: bufio.NewReader(res.Body)}
	if line := e.line(); line != fmt.Sprintf("retry: %d", retryMillis) {
		s.t.Fatalf("stream opens with %q, want a retry", line)
	}
	e.line()
	return e
}

// line reads one line, failing the test at the end of the stream.
func (e *events) line() string {
	e.t.Helper()
	line, err := e.reader.ReadString('\n')
	if err != nil {
		e.t.Fatalf("stream ended: %v", err)
	}
	return strings.TrimSuffix(line, "\n")
}

// next returns the next event, skipping comments.
func (e *events) next() event {
	e.t.Helper()
	var ev event
	for {
		line := e.line()
		switch {
		case line == "" && ev.name != "":
			return ev
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			frames.Add(e.t.Name(), "", false, []byte(line[6:]))
			if err := json.Unmarshal([]byte(line[6:]), &ev.frame); err != nil {
				e.t.Fatalf("data %q: %v", line, err)
			}
		}
	}
}

// comment returns the next comment line.
func (e *events) comment() string {
	e.t.Helper()
	for {
		if line := e.line(); strings.HasPrefix(line, ":") {
			return line
		}
	}
}

// cut drops the stream's connection, as a network would.
func (e *events) cut() { e.body.Close() }

// rawStream opens a stream on a socket that is then never read.
func (s *server) rawStream(topic, token string) net.Conn {
	s.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		s.t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /topics/%s?access_token=%s HTTP/1.1\r\n"+
		"Host: popsub\r\nAccept: text/event-stream\r\n\r\n", topic, token)
	return conn
}

// socket is a WebSocket client of the broker, for the tests' other side.
type socket struct {
	t  *testing.T
	ws *websocket.Conn
}

// dial connects to the broker's WebSocket and authenticates.
func dial(t *testing.T, url, token string) *socket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+
		"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(-1)
	t.Cleanup(func() { ws.CloseNow() })
	s := &socket{t: t, ws: ws}
	s.send(`{"type":"auth","token":"` + token + `"}`)
	s.expect("authenticated")
	return s
}

// send writes one frame.
func (s *socket) send(frame string) {
	s.t.Helper()
	frames.Add(s.t.Name(), "", true, []byte(frame))
	if err := s.ws.Write(context.Background(), websocket.MessageText,
		[]byte(frame)); err != nil {
		s.t.Fatal(err)
	}
}

// read returns the next frame.
func (s *socket) read() (wire.Received, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, data, err := s.ws.Read(ctx)
	var f wire.Received
	if err == nil {
		frames.Add(s.t.Name(), "", false, data)
		err = json.Unmarshal(data, &f)
	}
	return f, err
}

// expect returns the next frame, which must be of type typ.
func (s *socket) expect(typ string) wire.Received {
	s.t.Helper()
	f, err := s.read()
	if err != nil || f.Type != typ {
		s.t.Fatalf("got %+v (%v), want %s", f, err, typ)
	}
	return f
}

// refusingStore is a store whose disk refuses every commit.
type refusingStore struct{ popsub.Store }

// Commit fails.
func (refusingStore) Commit(*popsub.Batch) error {
	return errors.New("disk full")
}

// refusing returns a refusingStore over a bbolt file.
func refusing(t *testing.T) popsub.Store {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "full.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return refusingStore{store}
}

// TestGateway_StrangersInEveryOrder sends seeded random requests from
// eight clients at once: every method, topics and filters with and
// without grants, bad queries and bodies, no token, a bad one, tokens in
// the header and the URL, odd Last-Event-IDs, and streams dropped after a
// moment. Meanwhile a witness publishes on a topic of its own. No request
// may get a 5xx but 503, the gateway must never panic (panicsFail), and
// the witness's messages must all be there, in order.
func TestGateway_StrangersInEveryOrder(t *testing.T) {
	s := start(t, popsub.Options{}, Options{})
	alice := token(t, "alice", nil, nil)
	var strangers sync.WaitGroup
	for i := range 8 {
		strangers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 23))
			for range 20 {
				s.strangerRequest(r, alice)
			}
		})
	}
	const confirmed = 100
	for i := range confirmed {
		status, answer, _ := s.post("witness", "", alice, strconv.Itoa(i))
		if status != http.StatusOK || answer.Seq != uint64(i+1) {
			t.Fatalf("witness publish %d: %d %+v", i, status, answer)
		}
	}
	strangers.Wait()

	events := s.stream("witness", "?after=0&access_token="+alice, "")
	if e := events.next(); e.name != "subscribed" || e.frame.Seq != confirmed {
		t.Fatalf("first event %+v, want subscribed at %d", e, confirmed)
	}
	for i := range confirmed {
		if e := events.next(); e.frame.Seq != uint64(i+1) ||
			string(e.frame.Payload) != strconv.Itoa(i) {
			t.Fatalf("witness event %+v, want seq %d", e, i+1)
		}
	}
}

// strangerRequest sends one random request and reads its answer, or a
// moment of its stream.
func (s *server) strangerRequest(r *rand.Rand, good string) {
	pick := func(choices ...string) string { return choices[r.IntN(len(choices))] }
	ctx, cancel := context.WithTimeout(context.Background(),
		time.Duration(20+r.IntN(200))*time.Millisecond)
	defer cancel()
	tok := pick("", "not-a-token", good)
	url := s.url + "/topics/" + pick("a", "a/b", "a/+", "#", "$sys/events",
		"$dead/a", "a//b", "%20a", "a%2Fb", strings.Repeat("t", 300)) +
		pick("", "?qos=0", "?qos=1", "?qos=2", "?qos=x", "?message_id=h-1",
			"?message_id=", "?after=1", "?after=-1", "?last=2", "?last=x",
			"?after=1&last=1", "?durable=d", "?durable=",
			"?access_token="+tok)
	body := pick("", "1", `{"k":[1,2]}`, "{", `"s"`, "null", "1 2",
		strings.Repeat("z", 2000))
	request, err := http.NewRequestWithContext(ctx,
		pick("GET", "GET", "POST", "POST", "PUT", "DELETE", "HEAD"), url,
		strings.NewReader(body))
	if err != nil {
		s.t.Errorf("stranger: %v", err)
		return
	}
	if tok != "" && r.IntN(2) == 0 {
		request.Header.Set("Authorization", "Bearer "+tok)
	}
	if r.IntN(4) == 0 {
		request.Header.Set("Last-Event-ID", pick("2", "x", "-3",
			"99999999999999999999"))
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		return // the deadline, which ends a stream
	}
	defer response.Body.Close()
	io.Copy(io.Discard, response.Body)
	if response.StatusCode >= 500 &&
		response.StatusCode != http.StatusServiceUnavailable {
		s.t.Errorf("%s %s: %s", request.Method, url, response.Status)
	}
}
