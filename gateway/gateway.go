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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
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
	// WriteTimeoutFor(popsub.DefaultWriteTimeout), which a constant
	// cannot call.
	DefaultWriteTimeout = brokerTimeouts * popsub.DefaultWriteTimeout
	// DefaultIdle is how long a publisher's session stays open after its
	// last request.
	DefaultIdle = 30 * time.Second
	// DefaultMaxBody is the broker's default frame limit, 1 MiB.
	DefaultMaxBody = 1 << 20
	// DefaultMaxBodies bounds the bodies of every POST in flight
	// together: what the broker's own queue for the log holds sixteen
	// times over, so that a flood of large bodies costs at most this
	// much, and a few copies of it on their way into the log.
	DefaultMaxBodies = 16 << 20
	// DefaultBodyTimeout is how long a POST's body may take to arrive:
	// a second of a slow phone's upload of the largest body, ten times.
	DefaultBodyTimeout = 10 * time.Second
	// bodyWait is how long a POST waits for room in the bodies' budget
	// before it hears 503.
	bodyWait = time.Second
	// smallBody is the largest body that needs no room in the budget,
	// as a frame needs none in the broker's up to 64 KiB.
	smallBody = 64 << 10
	// maxPublishers bounds the open publisher sessions; a publisher past
	// it gets a session for its requests alone.
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
	// MaxBodies bounds the bytes of every POST body in flight together;
	// a POST that finds no room for a second hears 503 with Retry-After.
	// Zero: DefaultMaxBodies, 16 MiB.
	MaxBodies int64
	// BodyTimeout is how long a POST's body may take to arrive; a slower
	// one is answered 408. Zero: DefaultBodyTimeout, 10 s.
	BodyTimeout time.Duration
	// Keepalive is how often an idle stream gets a ": keepalive" comment.
	Keepalive time.Duration
	// WriteTimeout bounds each write to a stream's reader; a reader that
	// takes longer loses the stream. Zero: DefaultWriteTimeout; in front
	// of a broker whose write timeout is not its default, WriteTimeoutFor
	// that one.
	WriteTimeout time.Duration
	// Idle is how long a publisher's session stays open between requests.
	Idle time.Duration
	// Origins lists the foreign origins whose pages may publish and
	// stream, as the broker's OriginPatterns do for its WebSocket: host
	// patterns such as "app.example.com" or "*.example.com" (path.Match),
	// or whole origins with a scheme. Same-origin pages and clients that
	// send no Origin (curl, servers) are always served. Nil: none.
	Origins []string
	// Logger receives the gateway's few log lines; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Broker is what the gateway needs of a broker, which is normally a
// *popsub.Broker: its WebSocket handler, of which every request's session
// is a client, and its token check, which refuses a stranger before a
// byte of its body is read.
type Broker interface {
	http.Handler
	// Verify checks a token as the broker checks an auth frame's.
	Verify(token string) (*popsub.Claims, error)
}

// Gateway serves POST and GET on /topics/{topic}. It is an http.Handler
// for those two paths only; Close ends its streams and sessions. The
// topic is the path as sent, so serve it ahead of any ServeMux (as popsub
// serve does): a ServeMux redirects a path it would clean, /topics/a//b
// to /topics/a/b, and a client that follows would reach another topic.
type Gateway struct {
	opts     Options
	broker   Broker
	listener *pipeListener // the broker's end of every session
	server   *http.Server  // serves the broker on listener
	client   *http.Client  // dials the broker through listener
	bodies   *budget       // room for POST bodies in flight

	// mu guards the maps below, and closed.
	mu         sync.Mutex
	publishers map[string]*publisher    // open sessions, by token and host
	streams    map[*websocket.Conn]bool // open streams' sessions
	// durables are the durable names an open stream holds, and
	// takenOver those whose stream another session took over, when;
	// both by subject, name and topic (see Streaming by GET).
	durables  map[string]*eventStream
	takenOver map[string]time.Time
	closed    bool
}

// WriteTimeoutFor is the write timeout for a stream's reader in front of
// a broker whose own write timeout is brokers: three times it, so that
// the broker, which sees the session stop reading, cuts a slow reader
// off (4008) as it does any slow consumer, and says so in $sys/events.
// A broker's write that took part of a frame before the session stopped
// gets the broker's timeout again, so the broker may take up to twice
// it; three times leaves the broker a whole timeout's margin.
func WriteTimeoutFor(brokers time.Duration) time.Duration {
	return brokerTimeouts * brokers
}

// brokerTimeouts is how many of the broker's write timeouts a stream's
// reader is given (WriteTimeoutFor).
const brokerTimeouts = 3

// New returns a gateway to broker.
func New(broker Broker, opts Options) *Gateway {
	opts.MaxBody = cmpOr(opts.MaxBody, DefaultMaxBody)
	opts.MaxBodies = cmpOr(opts.MaxBodies, DefaultMaxBodies)
	opts.BodyTimeout = cmpOr(opts.BodyTimeout, DefaultBodyTimeout)
	opts.Keepalive = cmpOr(opts.Keepalive, DefaultKeepalive)
	opts.WriteTimeout = cmpOr(opts.WriteTimeout, DefaultWriteTimeout)
	opts.Idle = cmpOr(opts.Idle, DefaultIdle)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	g := &Gateway{opts: opts, broker: broker, listener: l,
		server:     &http.Server{Handler: broker},
		bodies:     newBudget(opts.MaxBodies, bodyWait),
		publishers: map[string]*publisher{},
		streams:    map[*websocket.Conn]bool{},
		durables:   map[string]*eventStream{},
		takenOver:  map[string]time.Time{}}
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

// ServeHTTP publishes on POST and streams on GET, and answers a CORS
// preflight (OPTIONS) for the origins Options.Origins allows.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	topic := strings.TrimPrefix(r.URL.Path, "/topics/")
	if !g.crossOrigin(w, r) {
		refuse(w, refusal("forbidden_origin", "pages from "+
			r.Header.Get("Origin")+" may not use this broker; the "+
			"broker's --origins lists those that may"))
		return
	}
	switch r.Method {
	case http.MethodPost:
		g.publish(w, r, topic)
	case http.MethodGet:
		g.stream(w, r, topic)
	case http.MethodOptions:
		w.Header().Set("Allow", "GET, POST, OPTIONS")
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, POST, OPTIONS")
		answer(w, http.StatusMethodNotAllowed, refusal("bad_request",
			"use POST to publish or GET to subscribe"))
	}
}

// # Other origins
//
// A page from another site, running in a user's browser, may publish and
// stream only if its origin is listed in Options.Origins, as for the
// broker's WebSocket: it is then answered with the CORS headers that let
// the page read the answer, and its preflight is answered. Any other
// foreign origin is refused with 403 before anything else happens, not
// merely left unable to read the answer: a browser sends a simple POST
// before it asks, and the publish would otherwise happen.

// crossOrigin reports whether r may be served: it comes from no page,
// from the broker's own origin, or from an allowed one, which then gets
// the CORS headers.
func (g *Gateway) crossOrigin(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	if !slices.ContainsFunc(g.opts.Origins, func(pattern string) bool {
		target := u.Host
		if strings.Contains(pattern, "://") {
			target = origin
		}
		ok, _ := path.Match(strings.ToLower(pattern), strings.ToLower(target))
		return ok
	}) {
		return false
	}
	header := w.Header()
	header.Set("Access-Control-Allow-Origin", origin)
	header.Add("Vary", "Origin")
	header.Set("Access-Control-Expose-Headers", "Retry-After")
	if r.Method == http.MethodOptions {
		header.Set("Access-Control-Allow-Methods", "GET, POST")
		header.Set("Access-Control-Allow-Headers",
			"Authorization, Content-Type, Last-Event-ID")
		header.Set("Access-Control-Max-Age", "600")
	}
	return true
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
	"unauthenticated":    http.StatusUnauthorized,
	"auth_failed":        http.StatusUnauthorized,
	"token_expired":      http.StatusUnauthorized,
	"forbidden":          http.StatusForbidden,
	"forbidden_origin":   http.StatusForbidden,
	"durable_in_use":     http.StatusConflict,
	"durable_taken_over": http.StatusConflict,
	"timeout":            http.StatusRequestTimeout,
	"too_large":          http.StatusRequestEntityTooLarge,
	"rate_limited":       http.StatusTooManyRequests,
	"delayed_limit":      http.StatusTooManyRequests,
	"store_failed":       http.StatusServiceUnavailable,
	"topic_limit":        http.StatusServiceUnavailable,
	"unavailable":        http.StatusServiceUnavailable,
	"internal":           http.StatusInternalServerError,
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
	Type      string `json:"type"`
	Code      string `json:"code"`
	Message   string `json:"message"`
	Close     int    `json:"close,omitempty"`
	Topic     string `json:"topic,omitempty"`
	MessageID string `json:"message_id,omitempty"`
}

// refusal is an error frame of the gateway's own.
func refusal(code, message string) frame {
	return refusalOf(errorFrame{Type: "error", Code: code, Message: message})
}

// refusalOf is the frame of an error of the gateway's own.
func refusalOf(e errorFrame) frame {
	raw, _ := json.Marshal(e)
	return frame{Received: wire.Received{Type: "error", Code: e.Code,
		Message: e.Message, Topic: e.Topic, MessageID: e.MessageID},
		raw: raw}
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
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
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
		// The gateway verified the token before it opened the session,
		// so a session refused now was refused for being late: a broker
		// too busy to answer in time, not a bad token.
		if reply.Code == "auth_failed" || reply.Code == "unavailable" {
			reply = refusal("unavailable", "the broker did not take the "+
				"session in time; try again shortly")
		}
		return nil, reply, cmpErr(err, errRefused)
	}
	return ws, reply, nil
}

// errRefused says the broker answered a session's frame with an error,
// or ended a stream's subscription.
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
	f.raw, _ = json.Marshal(errorFrame{Type: "error", Code: code,
		Message: close.Reason, Close: int(close.Code)})
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
//
// A stranger is refused before a byte of its body is read: the token is
// verified, and its grant for the topic checked, from the headers alone,
// and a refusal closes the connection. Only then does a body over 64 KiB
// take room, from one budget for every request in flight
// (Options.MaxBodies), and a body without a Content-Length takes room
// for the largest it may be: a request that finds none waits a moment,
// then hears 503 with Retry-After, so a flood of large bodies costs the
// budget, not the machine, and a small publish is never queued behind
// it. This is the broker's own rule for frames (popsub.go, "Keepalives,
// limits and batches"), and each body, once read, is a frame the broker
// reads under that rule too. Reading the body has a deadline
// (Options.BodyTimeout), so a body that never finishes holds its room for
// that long at most.

// publish answers a POST.
func (g *Gateway) publish(w http.ResponseWriter, r *http.Request,
	topic string) {
	token := wire.BearerToken(r.Header.Get("Authorization"))
	publish, problem := publishFrameOf(r, topic)
	if problem.Type != "" {
		refuse(w, problem)
		return
	}
	if problem := g.authorize(token, "publish", topic); problem.Type != "" {
		// A refusal names the publish, as the broker's does.
		if problem.Code == "forbidden" {
			problem = refusalOf(errorFrame{Type: "error", Code: problem.Code,
				Message: problem.Message, Topic: topic,
				MessageID: publish.MessageID})
		}
		refuse(w, problem)
		return
	}
	size, problem := g.bodySize(r)
	if problem.Type != "" {
		refuse(w, problem)
		return
	}
	if size > smallBody {
		if !g.bodies.acquire(r.Context(), size) {
			refuse(w, refusal("unavailable", "the broker has too many "+
				"large request bodies in flight; try again shortly"))
			return
		}
		defer g.bodies.release(size)
	}
	if publish.Payload, problem = g.readBody(w, r); problem.Type != "" {
		refuse(w, problem)
		return
	}
	reply := g.publishOn(r, token, publish)
	if reply.Type == "accepted" {
		answer(w, http.StatusAccepted, reply)
		return
	}
	answer(w, statusOf(reply), reply)
}

// authorize checks token, as the broker would, and its grant to act
// ("publish" or "subscribe") on topic, and returns the refusal if any.
func (g *Gateway) authorize(token, act, topic string) frame {
	if token == "" {
		return refusal("unauthenticated", "send the token as "+
			"Authorization: Bearer TOKEN")
	}
	claims, err := g.broker.Verify(token)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return refusal("token_expired", "token expired")
	case err != nil:
		return refusal("auth_failed", "authentication failed")
	}
	grants := claims.Publish
	if act == "subscribe" {
		grants = claims.Subscribe
	}
	if !popsub.Allowed(grants, topic) {
		return refusal("forbidden", "token may not "+act+" to "+topic)
	}
	return noProblem
}

// refuse answers a request the gateway will not serve, and closes its
// connection: a stranger keeps no idle socket, and a body nobody read is
// not read now.
func refuse(w http.ResponseWriter, f frame) {
	w.Header().Set("Connection", "close")
	answer(w, statusOf(f), f)
}

// publishFrameOf reads a POST's parameters into a publish frame, or says
// what is wrong with them.
func publishFrameOf(r *http.Request, topic string) (wire.Frame, frame) {
	query := r.URL.Query()
	publish := wire.Frame{Type: "publish", Topic: topic, QoS: 1,
		MessageID: query.Get("message_id")}
	if problem := unknownParameter(query, "qos", "message_id", "ttl_ms",
		"delay_ms", "deliver_at"); problem.Type != "" {
		return publish, problem
	}
	if q := query.Get("qos"); q != "" {
		qos, err := strconv.Atoi(q)
		if err != nil || qos < 0 || qos > 1 {
			return publish, refusal("invalid_qos", "qos must be 0 or 1")
		}
		publish.QoS = qos
	}
	if len(publish.MessageID) > maxMessageIDBytes {
		return publish, refusal("invalid_message_id",
			"message_id is longer than 256 bytes")
	}
	// The times are the frame's, and the broker checks them as its own.
	for name, field := range map[string]**int64{"ttl_ms": &publish.TTLMS,
		"delay_ms": &publish.DelayMS, "deliver_at": &publish.DeliverAt} {
		if v := query.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return publish, refusal("bad_frame", name+" must be a "+
					"whole number of milliseconds")
			}
			*field = &n
		}
	}
	// A message_id the caller did not give is made here: every answer is
	// matched to its request by it (see publisher).
	if publish.MessageID == "" {
		publish.MessageID = wire.NewMessageID()
	}
	return publish, noProblem
}

// unknownParameter refuses a query that names a parameter other than
// known, with bad_request naming it: most likely a typo (?dealy_ms=),
// which ignored would publish at once, or replay everything, where the
// caller asked for something else. popsub.js refuses an option it does
// not know the same way.
func unknownParameter(query url.Values, known ...string) frame {
	for _, name := range slices.Sorted(maps.Keys(query)) {
		if !slices.Contains(known, name) {
			return refusal("bad_request", "unknown parameter "+
				strconv.Quote(name)+": this path takes "+
				strings.Join(known, ", "))
		}
	}
	return noProblem
}

// maxMessageIDBytes is the broker's limit on a message_id.
const maxMessageIDBytes = 256

// bodySize is the room a request's body needs: its Content-Length, or
// the most a body may be when it does not say. A body that says it is
// too large is refused unread.
func (g *Gateway) bodySize(r *http.Request) (int64, frame) {
	if r.ContentLength > g.opts.MaxBody {
		return 0, refusal("too_large", fmt.Sprintf("the body is over %d "+
			"bytes", g.opts.MaxBody))
	}
	if r.ContentLength < 0 {
		return g.opts.MaxBody, noProblem
	}
	return r.ContentLength, noProblem
}

// readBody reads a POST's body within Options.BodyTimeout and returns it
// as a payload, or says what is wrong with it.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) (
	json.RawMessage, frame) {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(g.opts.BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opts.MaxBody))
	rc.SetReadDeadline(time.Time{})
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, refusal("too_large", fmt.Sprintf("the body is over %d "+
			"bytes", g.opts.MaxBody))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, refusal("timeout", fmt.Sprintf("the body did not "+
			"arrive within %s", g.opts.BodyTimeout))
	case err != nil:
		return nil, refusal("bad_frame", "reading the body: "+err.Error())
	case !utf8.Valid(body):
		return nil, refusal("bad_frame", "the body must be UTF-8 text")
	case len(bytes.TrimSpace(body)) > 0 && !json.Valid(body):
		return nil, refusal("bad_frame", "the body must be one JSON "+
			"value, such as \"hello\" or {\"n\":1}")
	}
	return bytes.TrimSpace(body), noProblem
}

// noProblem is the frame a check returns when it found nothing wrong.
var noProblem frame

// budget is a number of bytes that requests take and give back, waiting
// a moment for room when there is none.
type budget struct {
	mu    sync.Mutex
	total int64         // bytes in all
	room  int64         // bytes free; guarded by mu
	freed chan struct{} // signalled, capacity one, when room grows
	wait  time.Duration // how long acquire waits for room
}

// newBudget returns a budget of size bytes whose takers wait up to wait.
func newBudget(size int64, wait time.Duration) *budget {
	return &budget{total: size, room: size, freed: make(chan struct{}, 1),
		wait: wait}
}

// acquire takes n bytes, waiting up to b.wait for room, and reports
// whether it got them. A request larger than the whole budget gets it
// when it is all free, so that no body the limits allow is refused for
// ever.
func (b *budget) acquire(ctx context.Context, n int64) bool {
	timeout := time.NewTimer(b.wait)
	defer timeout.Stop()
	for {
		b.mu.Lock()
		if b.room >= n || b.room == b.total {
			b.room -= n
			b.mu.Unlock()
			return true
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-timeout.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// release gives n bytes back and wakes a waiting request.
func (b *budget) release(n int64) {
	b.mu.Lock()
	b.room += n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// Publishers: one session per token and host, shared by every request
// on them. Requests do not take turns on it: each writes its publish as
// it comes and waits for the answer that names its message_id (every
// published and error frame does), so sixty-four requests on one token
// are as fast as on sixty-four. A QoS 0 publish, which has no answer of
// its own, is followed by a ping: the broker handles a session's frames
// in order, so its pong, or an error naming the message first, answers
// it. The order an HTTP publisher gets is the order its requests reach
// the gateway: requests in flight at once have no order between them,
// as on any HTTP server, and a request sent after another's answer
// comes after it in the topic. The rate limit counts across every
// request on the session, as it would on one socket.

// publisher is an open session that publishes for one token from one
// host. A goroutine reads the session all the while (read), so the
// broker's keepalive pings are answered between requests too.
type publisher struct {
	ws  *websocket.Conn
	key string // the publishers entry it is, or would be
	// writing orders each request's frames, and so its place among the
	// pongs: held while a request registers and writes.
	writing sync.Mutex
	// mu guards the fields below.
	mu sync.Mutex
	// waiting are the requests waiting for an answer, by topic and
	// message_id, oldest first; pongs the QoS 0 requests in the order of
	// their pings.
	waiting map[string][]chan frame
	pongs   []chan frame
	// users counts requests under way; idle retires the session after
	// Options.Idle with none.
	users int
	idle  *time.Timer
	// ended is set once the session failed or was retired: new requests
	// open another. done is closed when its reader ends, and why says
	// why.
	ended bool
	done  chan struct{}
	why   frame
}

// answerKey is how a request waits for its answer: topic and message_id.
// A delayed publish is answered on $delayed/<topic>, where it waits.
func answerKey(topic, id string) string {
	return strings.TrimPrefix(topic, "$delayed/") + "\x00" + id
}

// read hands each answer to the request waiting for it until the
// session ends; requests still waiting then hear why.
func (p *publisher) read() {
	for {
		f, err := next(context.Background(), p.ws)
		if err != nil {
			p.mu.Lock()
			p.ended, p.why = true, f
			p.mu.Unlock()
			close(p.done)
			return
		}
		p.mu.Lock()
		var to chan frame
		if f.Type == "pong" && len(p.pongs) > 0 {
			to, p.pongs = p.pongs[0], p.pongs[1:]
		} else if queue := p.waiting[answerKey(f.Topic, f.MessageID)]; len(
			queue) > 0 {
			to = queue[0]
			p.waiting[answerKey(f.Topic, f.MessageID)] = queue[1:]
			if len(queue) == 1 {
				delete(p.waiting, answerKey(f.Topic, f.MessageID))
			}
		}
		p.mu.Unlock()
		if to != nil {
			to <- f // buffered: a request that gave up is not waited for
		}
	}
}

// send writes publish on the session and returns the channel its answer
// comes on. A QoS 0 publish's pong comes on it too.
func (p *publisher) send(ctx context.Context, publish wire.Frame) (
	chan frame, error) {
	answers := make(chan frame, 2)
	key := answerKey(publish.Topic, publish.MessageID)
	data, _ := json.Marshal(publish)
	p.writing.Lock()
	defer p.writing.Unlock()
	p.mu.Lock()
	p.waiting[key] = append(p.waiting[key], answers)
	if publish.QoS == 0 {
		p.pongs = append(p.pongs, answers)
	}
	p.mu.Unlock()
	if err := p.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return nil, err
	}
	if publish.QoS == 0 {
		return answers, p.ws.Write(ctx, websocket.MessageText,
			[]byte(`{"type":"ping"}`))
	}
	return answers, nil
}

// forget takes answers out of the requests waiting on key, if a frame
// naming it has not taken it already.
func (p *publisher) forget(key string, answers chan frame) {
	p.mu.Lock()
	defer p.mu.Unlock()
	queue := slices.DeleteFunc(p.waiting[key], func(c chan frame) bool {
		return c == answers
	})
	if len(queue) == 0 {
		delete(p.waiting, key)
	} else {
		p.waiting[key] = queue
	}
}

// publishOn publishes on the token's session and returns the broker's
// answer.
func (g *Gateway) publishOn(r *http.Request, token string,
	publish wire.Frame) frame {
	p, reply := g.publisherFor(r, token)
	if p == nil {
		return reply
	}
	defer g.release(p)
	ctx, cancel := context.WithTimeout(r.Context(), g.opts.WriteTimeout)
	defer cancel()
	answers, err := p.send(ctx, publish)
	if err != nil {
		g.fail(p)
		return closed(err)
	}
	// A QoS 0 publish the broker took is answered by its pong, and no
	// frame naming it ever comes: its place in waiting goes with it.
	defer p.forget(answerKey(publish.Topic, publish.MessageID), answers)
	select {
	case reply := <-answers:
		if reply.Type == "pong" {
			return accepted(publish)
		}
		return reply
	case <-p.done:
		return p.why
	case <-ctx.Done():
		// An answer that never came leaves the session's order in
		// doubt: later requests open another.
		g.fail(p)
		return refusal("unavailable", "no answer from the broker in time")
	}
}

// accepted is the answer to a QoS 0 publish the broker took.
func accepted(publish wire.Frame) frame {
	raw, _ := json.Marshal(struct {
		Type      string `json:"type"`
		Topic     string `json:"topic"`
		MessageID string `json:"message_id"`
		QoS       int    `json:"qos"`
	}{"accepted", publish.Topic, publish.MessageID, 0})
	return frame{Received: wire.Received{Type: "accepted"}, raw: raw}
}

// publisherFor returns the token's open session from r's host, opening
// it if need be, counted as in use until release. On a refusal it
// returns nil and the frame that says why.
func (g *Gateway) publisherFor(r *http.Request, token string) (*publisher,
	frame) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	key := host + " " + token
	g.mu.Lock()
	p := g.publishers[key]
	g.mu.Unlock()
	if p != nil && p.use() {
		return p, noProblem
	}

	ws, reply, err := g.open(r, token, "http")
	if err != nil {
		return nil, reply
	}
	p = &publisher{ws: ws, key: key, waiting: map[string][]chan frame{},
		done: make(chan struct{}), users: 1}
	p.idle = time.AfterFunc(g.opts.Idle, func() { g.retireIdle(p) })
	p.idle.Stop()
	go p.read()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		go g.retire(p)
		return nil, refusal("unavailable", "the broker is shutting down")
	}
	// A publisher past the bound gets this session for its requests
	// alone; it closes when they end.
	if old := g.publishers[key]; old != nil || len(g.publishers) <
		maxPublishers {
		g.publishers[key] = p
	}
	return p, noProblem
}

// use counts one more request on p, unless p has ended.
func (p *publisher) use() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	p.users++
	p.idle.Stop()
	return true
}

// release ends one request on p: with none left, the session waits for
// the next, or closes if it failed or was not kept.
func (g *Gateway) release(p *publisher) {
	g.mu.Lock()
	kept := g.publishers[p.key] == p
	g.mu.Unlock()
	p.mu.Lock()
	p.users--
	last, ended := p.users == 0, p.ended
	if last && kept && !ended {
		p.idle.Reset(g.opts.Idle)
	}
	p.mu.Unlock()
	if last && (ended || !kept) {
		g.retire(p)
	}
}

// fail marks p as failed: requests under way finish, new ones open
// another session.
func (g *Gateway) fail(p *publisher) {
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	g.mu.Lock()
	if g.publishers[p.key] == p {
		delete(g.publishers, p.key)
	}
	g.mu.Unlock()
}

// retireIdle retires p after Options.Idle unused, unless a request took
// it meanwhile.
func (g *Gateway) retireIdle(p *publisher) {
	p.mu.Lock()
	busy := p.users > 0
	if !busy {
		p.ended = true
	}
	p.mu.Unlock()
	if !busy {
		g.retire(p)
	}
}

// retire closes p's session and forgets it. The close handshake goes on
// in the background, so no request waits for it.
func (g *Gateway) retire(p *publisher) {
	g.fail(p)
	p.idle.Stop()
	go p.ws.Close(websocket.StatusNormalClosure, "")
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
	if problem := g.authorize(token, "subscribe", topic); problem.Type != "" {
		switch problem.Code {
		case "unauthenticated":
			problem = refusal("unauthenticated", "send the token as "+
				"Authorization: Bearer TOKEN, or, from EventSource, as "+
				"?access_token=TOKEN")
		case "forbidden":
			problem = refusalOf(errorFrame{Type: "error", Code: "forbidden",
				Message: problem.Message, Topic: topic})
		}
		refuse(w, problem)
		return
	}
	subscribe, problem := subscribeFrameOf(r, topic)
	if problem.Type != "" {
		answer(w, statusOf(problem), problem)
		return
	}
	s := &eventStream{w: w, rc: http.NewResponseController(w),
		timeout: g.opts.WriteTimeout, ids: !strings.ContainsAny(topic, "+#")}
	if subscribe.Durable != "" {
		claims, _ := g.broker.Verify(token)
		s.durable = strings.Join([]string{claims.Subject, subscribe.Durable,
			topic}, "\x00")
		if problem := g.own(s, r); problem.Type != "" {
			answer(w, statusOf(problem), problem)
			return
		}
		s.takenOver = func() { g.disown(s, true) }
		defer g.disown(s, false)
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
	s.start(reply)
	g.pump(r.Context(), ws, s)
}

// A durable name has one owner at a time. The broker's rule is that the
// newest claim wins, which suits a socket that reconnects after its old
// connection died unnoticed; but EventSource reconnects by itself, a
// second after any end, so two tabs on one name would take it from each
// other every second, each seeing half the messages. So the gateway
// refuses a second stream on a name an open stream holds (409,
// durable_in_use), and a stream whose name another session took over
// does not come back: its reconnect, which carries Last-Event-ID, is
// refused for a minute (409, durable_taken_over), and EventSource stops.
// A new page, which sends no Last-Event-ID, may claim the name again.

// takenOverFor is how long a stream's reconnect is refused after another
// session took its durable name over.
const takenOverFor = time.Minute

// own claims s's durable name for it, or says why it may not.
func (g *Gateway) own(s *eventStream, r *http.Request) frame {
	durable := s.durable
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, at := range g.takenOver {
		if time.Since(at) > takenOverFor {
			delete(g.takenOver, key)
		}
	}
	_, taken := g.takenOver[durable]
	switch {
	case g.durables[durable] != nil:
		return refusal("durable_in_use", "another stream holds this "+
			"durable subscription; close it first")
	case taken && r.Header.Get("Last-Event-ID") != "":
		return refusal("durable_taken_over", "another session took this "+
			"durable subscription over; open the page again to take it "+
			"back")
	}
	delete(g.takenOver, durable)
	g.durables[durable] = s
	return noProblem
}

// disown gives s's durable name up, if s still holds it: when s ends,
// or, marked taken over, the moment another session takes it, before s
// tells its reader, so that the reader's reconnect finds it so.
func (g *Gateway) disown(s *eventStream, takenOver bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.durables[s.durable] == s {
		delete(g.durables, s.durable)
		if takenOver {
			g.takenOver[s.durable] = time.Now()
		}
	}
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
	problem := unknownParameter(query, "after", "last", "durable",
		"access_token")
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
// reads on from the log, says "skipped" if the log drops what it has not
// sent, and cuts the session off with 4008 if its socket takes nothing).
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
	// durable is the durable name the stream holds, by subject, name and
	// topic, or ""; takenOver records another session taking it, before
	// the stream says so.
	durable   string
	takenOver func()
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
		// this stream, and so would any other end the broker gives.
		if s.takenOver != nil && strings.Contains(f.Reason, "taken over") {
			s.takenOver()
		}
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
