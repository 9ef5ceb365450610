// Package gateway lets a client that does not speak WebSocket use PopSub:
// an HTTP POST publishes, and an HTTP GET streams a topic as Server-Sent
// Events, which a browser's EventSource reads and resumes by itself.
//
//	$ curl -H "Authorization: Bearer $TOKEN" -d '"hello"' \
//	    http://127.0.0.1:8080/topics/chat
//	{"type":"published","topic":"chat","message_id":"…","seq":1}
//	$ curl -N -H "Authorization: Bearer $TOKEN" \
//	    http://127.0.0.1:8080/topics/chat?after=0
//	event: subscribed
//	data: {"type":"subscribed","topic":"chat","seq":1}
//
//	id: 1
//	event: message
//	data: {"type":"message","topic":"chat","payload":"hello",…}
//
// # Each request is a client of the broker
//
// The gateway is not a second broker. Each HTTP request becomes a
// WebSocket session with the broker in the same process, over an
// in-memory pipe, speaking the protocol any client speaks: auth, then
// publish or subscribe. So grants, rate limits, the connection cap,
// back-pressure and the cut-off of a slow reader are the broker's own,
// with nothing to keep in step, and popsub.go stays one protocol. The
// alternative, a second way into the broker's internals, would have made
// every rule in popsub.go a rule to write twice. The pipe costs a
// handshake per stream, and per publisher rather than per publish: a
// publisher's session stays open between requests (see publishers), so
// its rate limit holds across them, as it would on one socket.
//
// The broker sees each session coming from the HTTP client's own
// address, so its logs and login throttle see the real peer.
//
// # At most once, said plainly
//
// EventSource cannot ack. The gateway acks each QoS 1 delivery itself as
// soon as the event is written to the HTTP response, so the broker does
// not retry it: an event lost with a dropped connection is not sent
// again on that stream. What EventSource does instead is resume: every
// event on an exact topic carries its seq as its id, the browser sends
// the last one back as Last-Event-ID when it reconnects, and the stream
// goes on after it, replayed from the log for as long as the log
// retains it. A gap (the log no longer has what came after that id) is
// said with a subscribed event whose recovered is false.
package gateway

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/wire"
)

// Defaults, each a zero Option's meaning.
const (
	// DefaultKeepalive is how often an idle stream gets a comment line,
	// well inside the 30 to 60 seconds after which proxies and load
	// balancers commonly drop a silent response.
	DefaultKeepalive = 15 * time.Second
	// DefaultWriteTimeout bounds one event's write to a stream's reader:
	// twice the broker's own default for a socket's (see
	// Options.WriteTimeout).
	DefaultWriteTimeout = 2 * popsub.DefaultWriteTimeout
	// DefaultIdle is how long a publisher's session stays open after its
	// last request.
	DefaultIdle = 30 * time.Second
	// DefaultMaxBody is the broker's default frame limit, 1 MiB.
	DefaultMaxBody = 1 << 20
	// maxPublishers bounds the open publisher sessions; a publisher past
	// it gets a session for its one request.
	maxPublishers = 1024
	// retryMillis is what a stream tells EventSource to wait before it
	// reconnects.
	retryMillis = 1000
)

// Options configure a Gateway; the zero value of each field means its
// default.
type Options struct {
	// MaxBody is the largest publish body in bytes; set it to the
	// broker's MaxFrameBytes less room for the frame around the payload.
	// A larger body is refused with 413.
	MaxBody int64
	// Keepalive is how often an idle stream gets a ": keepalive" comment.
	Keepalive time.Duration
	// WriteTimeout bounds each write to a stream's reader; a reader that
	// takes longer loses the stream. Make it longer than the broker's,
	// so that the broker, which sees the session stop reading, cuts a
	// slow reader off (4008) as it does any slow consumer, and says so
	// in $sys/events.
	WriteTimeout time.Duration
	// Idle is how long a publisher's session stays open between requests.
	Idle time.Duration
	// Logger receives the gateway's few log lines; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Gateway serves POST and GET on /topics/{topic}. It is an http.Handler
// for those two paths only; Close ends its streams and sessions.
type Gateway struct {
	opts     Options
	listener *pipeListener // the broker's end of every session
	server   *http.Server  // serves the broker on listener
	client   *http.Client  // dials the broker through listener

	// mu guards publishers and streams, and closed.
	mu         sync.Mutex
	publishers map[string]*publisher    // open sessions, by token and host
	streams    map[*websocket.Conn]bool // open streams' sessions
	closed     bool
}

// New returns a gateway to broker, which is normally a *popsub.Broker.
func New(broker http.Handler, opts Options) *Gateway {
	opts.MaxBody = cmpOr(opts.MaxBody, DefaultMaxBody)
	opts.Keepalive = cmpOr(opts.Keepalive, DefaultKeepalive)
	opts.WriteTimeout = cmpOr(opts.WriteTimeout, DefaultWriteTimeout)
	opts.Idle = cmpOr(opts.Idle, DefaultIdle)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	g := &Gateway{opts: opts, listener: l,
		server:     &http.Server{Handler: broker},
		publishers: map[string]*publisher{},
		streams:    map[*websocket.Conn]bool{}}
	// Each dial is a fresh pipe: keep-alive would hand one request's
	// pipe, and its client's address, to another.
	g.client = &http.Client{Transport: &http.Transport{
		DialContext: l.dial, DisableKeepAlives: true}}
	go g.server.Serve(l)
	return g
}

// cmpOr is cmp.Or for the two kinds of option, kept local so that a
// negative value also means the default.
func cmpOr[T int64 | time.Duration](value, otherwise T) T {
	if value <= 0 {
		return otherwise
	}
	return value
}

// ServeHTTP publishes on POST and streams on GET.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	if topic == "" {
		topic = strings.TrimPrefix(r.URL.Path, "/topics/")
	}
	switch r.Method {
	case http.MethodPost:
		g.publish(w, r, topic)
	case http.MethodGet:
		g.stream(w, r, topic)
	default:
		w.Header().Set("Allow", "GET, POST")
		answer(w, http.StatusMethodNotAllowed, refusal("bad_request",
			"use POST to publish or GET to subscribe"))
	}
}

// Close ends every stream and closes every session. Streams hear an
// event saying the broker is going away, as WebSocket clients hear 1001.
func (g *Gateway) Close() {
	g.mu.Lock()
	g.closed = true
	for _, p := range g.publishers {
		go p.ws.Close(websocket.StatusGoingAway, "server shutting down")
	}
	for ws := range g.streams {
		go ws.Close(websocket.StatusGoingAway, "server shutting down")
	}
	g.mu.Unlock()
	g.listener.Close()
}

// # Answers
//
// Every answer is a frame of the wire protocol as JSON: a publish is
// answered with the "published" frame a WebSocket client would get, and
// a refusal with the same error frame, its code telling the HTTP status.
// A client can handle both transports with one set of cases.

// statuses maps the broker's error codes to HTTP statuses; a code not
// listed is a bad request.
var statuses = map[string]int{
	"unauthenticated": http.StatusUnauthorized,
	"auth_failed":     http.StatusUnauthorized,
	"token_expired":   http.StatusUnauthorized,
	"forbidden":       http.StatusForbidden,
	"too_large":       http.StatusRequestEntityTooLarge,
	"rate_limited":    http.StatusTooManyRequests,
	"store_failed":    http.StatusServiceUnavailable,
	"unavailable":     http.StatusServiceUnavailable,
	"internal":        http.StatusInternalServerError,
}

// frame is one frame from the broker, decoded and as it came, so that
// what the gateway passes on is the broker's frame byte for byte.
type frame struct {
	wire.Received
	raw   []byte
	ended bool // the session ended; the frame says why
	close int  // the close code it ended with, if one came
}

// errorFrame is an error frame of the gateway's own, its fields in the
// broker's order. Close is the code a session closed with, if it did.
type errorFrame struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Close   int    `json:"close,omitempty"`
}

// refusal is an error frame of the gateway's own.
func refusal(code, message string) frame {
	raw, _ := json.Marshal(errorFrame{"error", code, message, 0})
	return frame{Received: wire.Received{Type: "error", Code: code,
		Message: message}, raw: raw}
}

// statusOf is the HTTP status that answers a frame.
func statusOf(f frame) int {
	if f.Type != "error" {
		return http.StatusOK
	}
	if status, ok := statuses[f.Code]; ok {
		return status
	}
	return http.StatusBadRequest
}

// answer writes f as the JSON body of a response with status.
func answer(w http.ResponseWriter, status int, f frame) {
	header := w.Header()
	header.Set("Content-Type", "application/json")
	switch status {
	case http.StatusUnauthorized:
		header.Set("WWW-Authenticate", `Bearer realm="popsub"`)
	case http.StatusTooManyRequests:
		header.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	w.Write(append(f.raw, '\n'))
}

// # Sessions
//
// A session is a WebSocket connection to the broker over a pipe. It is
// opened with the auth frame, naming the client "http" or "sse" so that
// the broker's logs and x-ray tell gateway sessions from others.

// pipeListener hands the broker the server end of each pipe a dial
// makes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{} // closed by Close
	once  sync.Once
}

// remoteKey is the context key under which a dial finds the HTTP
// client's address.
type remoteKey struct{}

// Accept returns the next pipe's server end.
func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case conn := <-l.conns:
		return conn, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept.
func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the listener's address, which nobody dials by name.
func (l *pipeListener) Addr() net.Addr { return address("gateway") }

// dial makes a pipe and hands its server end to Accept, dressed with the
// HTTP client's address from ctx.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn,
	error) {
	remote, _ := ctx.Value(remoteKey{}).(string)
	client, server := net.Pipe()
	select {
	case l.conns <- addressed{server, address(remote)}:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// address is a net.Addr that is only its text.
type address string

// Network names the address's network.
func (address) Network() string { return "tcp" }

// String returns the address.
func (a address) String() string { return string(a) }

// addressed is a pipe end that reports the HTTP client's address as its
// peer's.
type addressed struct {
	net.Conn
	remote net.Addr
}

// RemoteAddr returns the HTTP client's address.
func (c addressed) RemoteAddr() net.Addr { return c.remote }

// open dials the broker on behalf of r's client and authenticates with
// token. On a refusal it returns the frame that says why.
func (g *Gateway) open(r *http.Request, token, name string) (
	*websocket.Conn, frame, error) {
	ctx, cancel := context.WithTimeout(
		context.WithValue(r.Context(), remoteKey{}, r.RemoteAddr),
		g.opts.WriteTimeout)
	defer cancel()
	ws, response, err := websocket.Dial(ctx, "ws://gateway/ws",
		&websocket.DialOptions{HTTPClient: g.client})
	if err != nil {
		// The broker refuses an upgrade only when it is full or closing.
		if response != nil {
			return nil, refusal("unavailable", "the broker refused the "+
				"session: "+response.Status), err
		}
		return nil, refusal("unavailable", "the broker is not taking "+
			"sessions"), err
	}
	ws.SetReadLimit(-1)
	hello, _ := json.Marshal(map[string]string{"type": "auth",
		"token": token, "client": name})
	reply, err := roundTrip(ctx, ws, hello)
	if err != nil || reply.Type != "authenticated" {
		ws.CloseNow()
		return nil, reply, cmpErr(err, errRefused)
	}
	return ws, reply, nil
}

// errRefused says the broker answered a session's frame with an error.
var errRefused = errors.New("gateway: refused")

// cmpErr returns err, or otherwise when err is nil.
func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// roundTrip sends one frame and returns the next frame that answers it.
func roundTrip(ctx context.Context, ws *websocket.Conn, data []byte) (
	frame, error) {
	if err := ws.Write(ctx, websocket.MessageText, data); err != nil {
		return closed(err), err
	}
	return next(ctx, ws)
}

// next reads one frame. A closed session reads as the error frame that
// says why, with the close code's name.
func next(ctx context.Context, ws *websocket.Conn) (frame, error) {
	_, data, err := ws.Read(ctx)
	if err != nil {
		return closed(err), err
	}
	f := frame{raw: data}
	if err := json.Unmarshal(data, &f.Received); err != nil {
		return refusal("internal", "the broker sent "+string(data)), err
	}
	return f, nil
}

// closeCodes names the close codes a session can end with.
var closeCodes = map[websocket.StatusCode]string{
	popsub.CloseAuthFailed:        "auth_failed",
	popsub.CloseTokenExpired:      "token_expired",
	popsub.CloseSlowConsumer:      "cut_off",
	websocket.StatusGoingAway:     "unavailable",
	websocket.StatusMessageTooBig: "too_large",
}

// closed turns the error that ended a session into an error frame,
// which names the close code ("close") and the code's name ("code").
func closed(err error) frame {
	var close websocket.CloseError
	if !errors.As(err, &close) {
		f := refusal("unavailable", "the session ended: "+err.Error())
		f.ended = true
		return f
	}
	code := closeCodes[close.Code]
	if code == "" {
		code = "closed"
	}
	f := refusal(code, close.Reason)
	f.ended, f.close = true, int(close.Code)
	f.raw, _ = json.Marshal(errorFrame{"error", code, close.Reason,
		int(close.Code)})
	return f
}

// # Publishing by POST
//
// POST /topics/{topic} publishes its body, which must be one JSON value,
// as the payload. qos and message_id come as query parameters. QoS
// defaults to 1 here, not 0 as on a socket: an HTTP request waits for
// its answer anyway, and the answer is then the confirm with the seq.
// With qos=0 the answer is 202 Accepted: the broker took the message,
// and nothing says whether it reached the disk.

// publisher is an open session that publishes for one token from one
// host. Its lock makes requests on it take turns, so each request's
// answer is the next frame that session gets. A goroutine reads the
// session all the while, so the broker's keepalive pings are answered
// between requests too.
type publisher struct {
	mu      sync.Mutex // held for one request
	ws      *websocket.Conn
	replies chan frame    // the reader's frames; closed when it ends
	gone    chan struct{} // closed by retire: the reader stops
	idle    *time.Timer   // retires the session after Options.Idle unused
	key     string        // the publishers entry it is, or would be
	ended   atomic.Bool   // the session failed; use another
	once    sync.Once     // retires once
}

// read passes the session's frames to replies until the session ends,
// the error frame that says why last.
func (p *publisher) read() {
	defer close(p.replies)
	for {
		f, err := next(context.Background(), p.ws)
		if err != nil {
			p.ended.Store(true)
		}
		select {
		case p.replies <- f:
		case <-p.gone:
			return
		}
		if err != nil {
			return
		}
	}
}

// reply returns the session's next frame, or why there is none.
func (p *publisher) reply(ctx context.Context) (frame, bool) {
	select {
	case f, ok := <-p.replies:
		if !ok {
			return refusal("unavailable", "the session ended"), false
		}
		return f, !f.ended
	case <-ctx.Done():
		p.ended.Store(true)
		return refusal("unavailable", "no answer from the broker in "+
			"time"), false
	}
}

// publishFrame is the publish frame the gateway sends.
type publishFrame struct {
	Type      string          `json:"type"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload,omitempty"`
	MessageID string          `json:"message_id"`
	QoS       int             `json:"qos"`
}

// publish answers a POST.
func (g *Gateway) publish(w http.ResponseWriter, r *http.Request,
	topic string) {
	token := wire.BearerToken(r.Header.Get("Authorization"))
	if token == "" {
		answer(w, http.StatusUnauthorized, refusal("unauthenticated",
			"send the token as Authorization: Bearer TOKEN"))
		return
	}
	publish, problem := g.publishFrameOf(w, r, topic)
	if problem.Type != "" {
		answer(w, statusOf(problem), problem)
		return
	}
	reply := g.publishOn(r, token, publish)
	if reply.Type == "accepted" {
		answer(w, http.StatusAccepted, reply)
		return
	}
	answer(w, statusOf(reply), reply)
}

// publishFrameOf reads a POST's body and parameters into a publish
// frame, or says what is wrong with them.
func (g *Gateway) publishFrameOf(w http.ResponseWriter, r *http.Request,
	topic string) (publishFrame, frame) {
	query := r.URL.Query()
	publish := publishFrame{Type: "publish", Topic: topic, QoS: 1,
		MessageID: query.Get("message_id")}
	if q := query.Get("qos"); q != "" {
		qos, err := strconv.Atoi(q)
		if err != nil {
			return publish, refusal("invalid_qos", "qos must be 0 or 1")
		}
		publish.QoS = qos
	}
	// A message_id the caller did not give is made here, so that the
	// answer to a QoS 0 publish can name it too.
	if publish.MessageID == "" {
		publish.MessageID = newID()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opts.MaxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return publish, refusal("too_large", fmt.Sprintf("the body is "+
			"over %d bytes", g.opts.MaxBody))
	case err != nil:
		return publish, refusal("bad_frame", "reading the body: "+err.Error())
	case len(bytes.TrimSpace(body)) > 0 && !json.Valid(body):
		return publish, refusal("bad_frame", "the body must be one JSON "+
			"value, such as \"hello\" or {\"n\":1}")
	}
	publish.Payload = bytes.TrimSpace(body)
	return publish, noProblem
}

// noProblem is the frame a check returns when it found nothing wrong.
var noProblem frame

// newID returns a random message id.
func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// publishOn publishes on the token's session and returns the broker's
// answer.
func (g *Gateway) publishOn(r *http.Request, token string,
	publish publishFrame) frame {
	p, reply := g.publisherFor(r, token)
	if p == nil {
		return reply
	}
	defer g.release(p)
	data, _ := json.Marshal(publish)
	ctx, cancel := context.WithTimeout(r.Context(), g.opts.WriteTimeout)
	defer cancel()
	if err := p.ws.Write(ctx, websocket.MessageText, data); err != nil {
		p.ended.Store(true)
		return closed(err)
	}
	// A QoS 0 publish has no answer of its own; the ping after it does,
	// and any refusal of the publish comes before the pong, since the
	// broker handles a session's frames in order.
	if publish.QoS == 0 {
		p.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"ping"}`))
	}
	for {
		reply, ok := p.reply(ctx)
		switch {
		case !ok:
			return reply
		case reply.Type == "pong":
			return accepted(publish)
		case reply.Type == "error" && publish.QoS == 0:
			// Its pong follows; take it, so the next request starts
			// clean.
			p.reply(ctx)
			return reply
		case reply.Type == "published", reply.Type == "error":
			return reply
		}
	}
}

// accepted is the answer to a QoS 0 publish the broker took.
func accepted(publish publishFrame) frame {
	raw, _ := json.Marshal(struct {
		Type      string `json:"type"`
		Topic     string `json:"topic"`
		MessageID string `json:"message_id"`
		QoS       int    `json:"qos"`
	}{"accepted", publish.Topic, publish.MessageID, 0})
	return frame{Received: wire.Received{Type: "accepted"}, raw: raw}
}

// publisherFor returns the token's open session from r's host, locked
// for one request, opening it if need be. On a refusal it returns nil
// and the frame that says why.
func (g *Gateway) publisherFor(r *http.Request, token string) (*publisher,
	frame) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	key := host + " " + token
	g.mu.Lock()
	p := g.publishers[key]
	g.mu.Unlock()
	if p != nil {
		p.mu.Lock()
		if !p.ended.Load() {
			p.idle.Stop()
			return p, noProblem
		}
		p.mu.Unlock()
	}

	ws, reply, err := g.open(r, token, "http")
	if err != nil {
		return nil, reply
	}
	p = &publisher{ws: ws, key: key, replies: make(chan frame),
		gone: make(chan struct{})}
	p.idle = time.AfterFunc(g.opts.Idle, func() { g.retire(p) })
	p.idle.Stop()
	go p.read()
	p.mu.Lock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		p.mu.Unlock()
		go g.retire(p)
		return nil, refusal("unavailable", "the broker is shutting down")
	}
	// A publisher past the bound gets this session for one request.
	if old := g.publishers[key]; old != nil || len(g.publishers) <
		maxPublishers {
		g.publishers[key] = p
	}
	return p, noProblem
}

// release ends one request on p: the session waits for the next, or
// closes if it failed or was not kept.
func (g *Gateway) release(p *publisher) {
	g.mu.Lock()
	kept := g.publishers[p.key] == p
	g.mu.Unlock()
	defer p.mu.Unlock()
	if p.ended.Load() || !kept {
		g.retire(p)
		return
	}
	p.idle.Reset(g.opts.Idle)
}

// retire closes p's session and forgets it. The close handshake goes on
// in the background, so no request waits for it.
func (g *Gateway) retire(p *publisher) {
	g.mu.Lock()
	if g.publishers[p.key] == p {
		delete(g.publishers, p.key)
	}
	g.mu.Unlock()
	p.once.Do(func() {
		p.idle.Stop()
		close(p.gone)
		go p.ws.Close(websocket.StatusNormalClosure, "")
	})
}

// # Streaming by GET
//
// GET /topics/{topic} subscribes and streams each delivery as an event:
//
//	id: 7
//	event: message
//	data: {"type":"message","topic":"chat","payload":"hi",…,"seq":7}
//
// The first event is "subscribed", the broker's reply, with
// "recovered":false when the log no longer has what was asked for. A
// stream the broker ends (4008 for a reader too slow, 4003 for a token
// that expired, 1001 for a shutdown) ends with a "closed" event naming
// the code; EventSource then reconnects with Last-Event-ID by itself.
// after, last and durable are the subscribe frame's options, as query
// parameters; Last-Event-ID, which a reconnecting EventSource sends,
// stands for after and wins over the URL's options. Wildcard filters
// stream live only, as on a socket, and their events carry no id: seqs
// belong to topics, and a filter spans many.
//
// EventSource cannot set headers, so a stream also takes its token as
// the access_token query parameter (RFC 6750 calls it that); security.md
// says what that costs.

// stream answers a GET with a stream of events.
func (g *Gateway) stream(w http.ResponseWriter, r *http.Request,
	topic string) {
	token := cmp.Or(wire.BearerToken(r.Header.Get("Authorization")),
		r.URL.Query().Get("access_token"))
	if token == "" {
		answer(w, http.StatusUnauthorized, refusal("unauthenticated",
			"send the token as Authorization: Bearer TOKEN, or, from "+
				"EventSource, as ?access_token=TOKEN"))
		return
	}
	subscribe, problem := subscribeFrameOf(r, topic)
	if problem.Type != "" {
		answer(w, statusOf(problem), problem)
		return
	}
	ws, reply, err := g.open(r, token, "sse")
	if err != nil {
		answer(w, statusOf(reply), reply)
		return
	}
	defer ws.CloseNow()
	if !g.track(ws) {
		answer(w, http.StatusServiceUnavailable, refusal("unavailable",
			"the broker is shutting down"))
		return
	}
	defer g.untrack(ws)

	// The subscribe's reply decides the status: a refusal is an HTTP
	// error, which EventSource does not retry, rather than a stream.
	data, _ := json.Marshal(subscribe)
	reply, err = roundTrip(r.Context(), ws, data)
	if err != nil || reply.Type != "subscribed" {
		answer(w, statusOf(reply), reply)
		return
	}
	s := &eventStream{w: w, rc: http.NewResponseController(w),
		timeout: g.opts.WriteTimeout, ids: !strings.ContainsAny(topic, "+#")}
	s.start(reply)
	g.pump(r.Context(), ws, s)
}

// subscribeFrame is the subscribe frame a stream sends.
type subscribeFrame struct {
	Type    string  `json:"type"`
	Topic   string  `json:"topic"`
	After   *uint64 `json:"after,omitempty"`
	Last    *uint64 `json:"last,omitempty"`
	Durable string  `json:"durable,omitempty"`
}

// subscribeFrameOf reads a GET's parameters into a subscribe frame.
func subscribeFrameOf(r *http.Request, topic string) (subscribeFrame,
	frame) {
	query := r.URL.Query()
	subscribe := subscribeFrame{Type: "subscribe", Topic: topic,
		Durable: query.Get("durable")}
	var problem frame
	number := func(name, text string) *uint64 {
		if text == "" {
			return nil
		}
		n, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			problem = refusal("bad_frame", name+" must be a whole "+
				"number, 0 or more, not "+strconv.Quote(text))
		}
		return &n
	}
	subscribe.After = number("after", query.Get("after"))
	subscribe.Last = number("last", query.Get("last"))
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		subscribe.After, subscribe.Last = number("Last-Event-ID", id), nil
	}
	return subscribe, problem
}

// track records a stream's session, for Close, unless the gateway is
// closed.
func (g *Gateway) track(ws *websocket.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.streams[ws] = true
	}
	return !g.closed
}

// untrack forgets a stream's session.
func (g *Gateway) untrack(ws *websocket.Conn) {
	g.mu.Lock()
	delete(g.streams, ws)
	g.mu.Unlock()
}

// pump copies deliveries from the session to the stream until either
// ends, acking each QoS 1 delivery once it is written.
//
// One goroutine reads the session and hands each frame over an
// unbuffered channel, so that it reads no further than the stream has
// written: a reader that is slow holds the session's socket full, and the
// broker sees a slow consumer and deals with it as with any other (it
// reads on from the log, and cuts the session off with 4008 if the log
// drops what it has not sent).
func (g *Gateway) pump(ctx context.Context, ws *websocket.Conn,
	s *eventStream) {
	frames := make(chan frame)
	ended := make(chan frame, 1)
	go func() {
		for {
			f, err := next(context.Background(), ws)
			if err != nil {
				ended <- f
				return
			}
			select {
			case frames <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	keepalive := time.NewTicker(g.opts.Keepalive)
	defer keepalive.Stop()
	for {
		var err error
		select {
		case f := <-frames:
			err = s.deliver(ctx, ws, f)
		case f := <-ended:
			s.end(g.why(f))
			return
		case <-keepalive.C:
			err = s.comment("keepalive")
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// why returns the frame a stream's end event carries. Close closes the
// sessions from this side, so a session it ends may read as a closed
// connection rather than as the broker's 1001, whichever comes first;
// either way the stream hears that the broker is going away.
func (g *Gateway) why(f frame) frame {
	g.mu.Lock()
	shutdown := g.closed
	g.mu.Unlock()
	if shutdown && f.close == 0 {
		return closed(websocket.CloseError{Code: websocket.StatusGoingAway,
			Reason: "server shutting down"})
	}
	return f
}

// eventStream writes Server-Sent Events to one response.
type eventStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // for each write
	ids     bool          // events carry their seq as id: an exact topic
}

// start sends the headers, the reconnect delay and the subscribed event.
func (s *eventStream) start(subscribed frame) {
	header := s.w.Header()
	header.Set("Content-Type", "text/event-stream")
	header.Set("Cache-Control", "no-cache")
	// A proxy such as nginx would otherwise buffer the stream.
	header.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	s.write(fmt.Sprintf("retry: %d\n\n", retryMillis))
	s.event("", "subscribed", subscribed)
}

// deliver writes one frame from the session as an event, and acks a QoS
// 1 delivery once it is written.
func (s *eventStream) deliver(ctx context.Context, ws *websocket.Conn,
	f frame) error {
	switch f.Type {
	case "message":
		id := ""
		if s.ids {
			id = strconv.FormatUint(f.Seq, 10)
		}
		if err := s.event(id, "message", f); err != nil || f.QoS == 0 {
			return err
		}
		ack, _ := json.Marshal(map[string]string{"type": "ack",
			"topic": f.Topic, "message_id": f.MessageID})
		return ws.Write(ctx, websocket.MessageText, ack)
	case "unsubscribed":
		// A durable subscription taken over by another session ends
		// this stream.
		s.event("", "unsubscribed", f)
		return errRefused
	default:
		return s.event("", f.Type, f)
	}
}

// end writes the closed event that says why the session ended.
func (s *eventStream) end(f frame) {
	s.event("", "closed", f)
}

// event writes one event: its id if any, its name, and the frame as its
// data, on one line.
func (s *eventStream) event(id, name string, f frame) error {
	data := bytes.TrimSpace(f.raw)
	var b strings.Builder
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	b.WriteString("event: " + name + "\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	return s.write(b.String())
}

// comment writes a comment line, which EventSource ignores and which
// keeps an idle response from looking dead to proxies.
func (s *eventStream) comment(text string) error {
	return s.write(": " + text + "\n\n")
}

// write writes and flushes text within the write timeout.
func (s *eventStream) write(text string) error {
	s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := io.WriteString(s.w, text); err != nil {
		return err
	}
	return s.rc.Flush()
}
