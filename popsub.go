// Package popsub is a small publish/subscribe broker that speaks JSON over
// WebSocket: small enough to read in an afternoon, careful enough to run
// for demos and small deployments at the edge.
//
// It rebuilds the original PopSub (written in Rust) and goes further where
// that one stopped: every subscriber owes its own acknowledgement, a retry
// goes only to the subscriber that did not ack, every topic is a log with
// dense sequence numbers that late subscribers replay as a contract, state
// is split per topic and per connection instead of behind one lock, slow
// subscribers are cut off instead of buffered forever, and durable
// subscriptions keep a cursor on disk that survives a crash.
//
// # What it promises
//
//   - QoS 0 is at most once; QoS 1 is at least once, per subscriber, for as
//     long as the subscriber stays connected (or, with a durable name,
//     across reconnects and restarts). Subscribers must tolerate duplicates.
//   - Within a topic, every subscriber sees messages in seq order, replay
//     first and live after, with no gap and no duplicate at the hand-over.
//   - A QoS 1 publish is confirmed only after it is synced to disk; a
//     confirmed message survives kill -9.
//
// It does not replicate, cluster or order messages across topics; see
// docs/tutorials for where to go when one machine is not enough.
//
// # Reading order
//
// The file follows a message: options and the wire frames; the broker and
// its topics; connecting and authenticating; subscribing; publishing and
// fan-out; acknowledgements; retries and dead letters; replay; the log and
// its storage seam; shutdown; helpers.
//
// # Goroutines
//
// Per connection: one reader (the HTTP handler's own), one writer, a
// confirmer once the connection publishes with QoS 1, and one replayer per
// subscription while it catches up. Per broker: a retry loop, a retention
// loop and the log committer.
//
// # A session
//
//	$ popsub serve
//	popsub listening on http://127.0.0.1:8080 (WebSocket at /ws)
//	$ popsub client pub chat '"hello"' --qos 1
//	{"type":"published","topic":"chat","message_id":"…","seq":1}
//	$ popsub client sub chat
//	{"type":"message","topic":"chat","payload":"hello",…,"seq":1,"attempt":1}
package popsub

import (
	"bytes"
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	bolt "go.etcd.io/bbolt"
)

// # Options and defaults
//
// Every limit is a named default with its unit and its reason, and every
// one can be changed by the command's flags. The timing defaults are the
// original PopSub's, so its users see the same behaviour; the size limits
// are ours, chosen so that one misbehaving client costs a bounded amount
// of memory rather than whatever it manages to make the broker buffer.

// Defaults for Options. A zero field in Options takes these values.
const (
	// DefaultAckTimeout is how long a QoS 1 delivery waits for its ack
	// before it is sent again: the original PopSub's five seconds.
	DefaultAckTimeout = 5 * time.Second
	// DefaultMaxRetries is how many times a delivery is retried after the
	// first attempt before it is dead-lettered: the original's five.
	DefaultMaxRetries = 5
	// DefaultMaxMessages is how many messages a topic's log keeps.
	DefaultMaxMessages = 1000
	// DefaultTTL is how long a message stays in a topic's log.
	DefaultTTL = time.Hour
	// DefaultMaxFrameBytes caps one incoming frame after authentication.
	DefaultMaxFrameBytes = 1 << 20
	// DefaultOutbox is how many frames wait for one connection's writer.
	DefaultOutbox = 1024
	// DefaultMaxInflight is how many QoS 1 deliveries one connection may
	// owe acks for before it counts as a slow consumer.
	DefaultMaxInflight = 1000
	// DefaultAuthTimeout is how long a new connection has to authenticate.
	DefaultAuthTimeout = 5 * time.Second
	// DefaultPingInterval is how often the broker pings each connection.
	// A peer that misses one ping is closed, so a dead one is noticed
	// within two intervals, well before a NAT forgets the flow.
	DefaultPingInterval = 20 * time.Second
	// DefaultLoginTokenTTL is how long a token from login is valid.
	DefaultLoginTokenTTL = time.Hour
)

// Limits that are not options: they protect the broker, not a policy.
const (
	authReadLimit     = 8 << 10         // bytes a frame may have before auth
	maxTokenBytes     = 4 << 10         // a JWT longer than this is not parsed
	tokenLeeway       = 5 * time.Second // clock skew allowed on exp
	maxTopicBytes     = 256             // the longest topic name, in bytes
	maxMessageIDBytes = 256             // the longest message_id, in bytes
	replayChunk       = 256             // messages read from the log at a time
	deadPrefix        = "$dead/"
)

// Close codes the broker uses, beside the WebSocket standard ones (1001
// going away, 1003 binary frame, 1007 invalid UTF-8, 1009 too large).
const (
	// CloseAuthFailed: authentication failed, missing or too late.
	CloseAuthFailed websocket.StatusCode = 4001
	// CloseTokenExpired: the token expired and no fresh one came.
	CloseTokenExpired websocket.StatusCode = 4003
	// CloseSlowConsumer: the outbox or the in-flight window was full.
	CloseSlowConsumer websocket.StatusCode = 4008
)

// Errors the broker returns to its Go callers.
var (
	// ErrClosed is returned after Shutdown.
	ErrClosed = errors.New("popsub: broker closed")
	// ErrNoSecret is returned by New when Options.Secret is empty.
	ErrNoSecret = errors.New("popsub: no token secret configured")
)

// Options configure a Broker. Only Secret and Store are required.
type Options struct {
	// Secret signs and verifies the HS256 tokens clients authenticate with.
	Secret []byte
	// Store keeps topic logs and durable cursors; see OpenBolt.
	Store Store
	// AckTimeout is how long a QoS 1 delivery waits for its ack.
	AckTimeout time.Duration
	// MaxRetries is how many retries follow the first delivery.
	MaxRetries int
	// MaxMessages is how many messages each topic's log keeps.
	MaxMessages int
	// TTL is how long a message stays in its topic's log.
	TTL time.Duration
	// MaxFrameBytes caps an incoming frame; larger ones close with 1009.
	MaxFrameBytes int64
	// Outbox is how many frames may queue for one connection's writer.
	Outbox int
	// MaxInflight is how many unacked QoS 1 deliveries a connection holds.
	MaxInflight int
	// AuthTimeout is how long a new connection has to send its auth frame.
	AuthTimeout time.Duration
	// OriginPatterns lists foreign origins allowed to open a WebSocket;
	// same-origin and non-browser clients are always allowed.
	OriginPatterns []string
	// MaxConnections caps open connections; more are refused with HTTP
	// 503 before the upgrade. Zero means no cap.
	MaxConnections int
	// PublishRate caps publishes per second per connection, with a burst
	// of one second's worth. Zero means no cap.
	PublishRate float64
	// PingInterval is how often each connection is pinged.
	PingInterval time.Duration
	// Issuer and Audience, when set, must match a token's iss and aud.
	Issuer, Audience string
	// Users may log in with a password; see HashPassword.
	Users map[string]User
	// LoginTokenTTL is how long a token from login is valid.
	LoginTokenTTL time.Duration
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// withDefaults returns a copy of o with every zero field set to its default.
func (o Options) withDefaults() Options {
	o.AckTimeout = orDefault(o.AckTimeout, DefaultAckTimeout)
	o.MaxRetries = orDefault(o.MaxRetries, DefaultMaxRetries)
	o.MaxMessages = orDefault(o.MaxMessages, DefaultMaxMessages)
	o.TTL = orDefault(o.TTL, DefaultTTL)
	o.MaxFrameBytes = orDefault(o.MaxFrameBytes, DefaultMaxFrameBytes)
	o.Outbox = orDefault(o.Outbox, DefaultOutbox)
	o.MaxInflight = orDefault(o.MaxInflight, DefaultMaxInflight)
	o.AuthTimeout = orDefault(o.AuthTimeout, DefaultAuthTimeout)
	o.PingInterval = orDefault(o.PingInterval, DefaultPingInterval)
	o.LoginTokenTTL = orDefault(o.LoginTokenTTL, DefaultLoginTokenTTL)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// # Messages and frames
//
// The protocol is the original's: one JSON object per text frame, with a
// "type". Everything PopSub adds (seq, attempt, after, last, durable) is a
// new field, never a changed one, so the original's clients keep working.
// Incoming frames decode into one flat struct rather than a type per
// frame: the reader sees every field of the protocol in one place.

// Message is one published message, as stored in a topic's log.
type Message struct {
	// Topic is the exact topic it was published to.
	Topic string `json:"topic"`
	// ID is the publisher's message_id, or one the broker made.
	ID string `json:"message_id"`
	// Seq is the message's place in its topic's log: 1, 2, 3, …
	Seq uint64 `json:"seq"`
	// Timestamp is Unix milliseconds, set by the broker at publish.
	Timestamp int64 `json:"timestamp"`
	// QoS is 0 (at most once) or 1 (at least once, acked).
	QoS int `json:"qos"`
	// Payload is any JSON value, compacted onto one line.
	Payload json.RawMessage `json:"payload"`
}

// frame is any frame a client sends. Pointers mark fields whose absence
// means something different from their zero value.
type frame struct {
	Type       string          `json:"type"`
	Token      string          `json:"token"`
	Batch      bool            `json:"batch"`
	Username   string          `json:"username"`
	Password   string          `json:"password"`
	Topic      string          `json:"topic"`
	Payload    json.RawMessage `json:"payload"`
	MessageID  string          `json:"message_id"`
	MessageIDs []string        `json:"message_ids"`
	Seq        *uint64         `json:"seq"`
	QoS        int             `json:"qos"`
	After      *uint64         `json:"after"`
	Last       *uint64         `json:"last"`
	Durable    string          `json:"durable"`
}

// reply is any frame the broker sends that is not a delivery.
type reply struct {
	Type      string  `json:"type"`
	Sub       string  `json:"sub,omitempty"`
	Token     string  `json:"token,omitempty"`
	Code      string  `json:"code,omitempty"`
	Message   string  `json:"message,omitempty"`
	Topic     string  `json:"topic,omitempty"`
	MessageID string  `json:"message_id,omitempty"`
	Seq       *uint64 `json:"seq,omitempty"`
	Recovered *bool   `json:"recovered,omitempty"`
	Duplicate bool    `json:"duplicate,omitempty"`
	Reason    string  `json:"reason,omitempty"`
}

// errorReply builds the error frame for code, about topic or message id.
func errorReply(code, text string) reply {
	return reply{Type: "error", Code: code, Message: text}
}

// # The broker and its topics
//
// The original kept all state in one struct behind one mutex, so a slow
// operation anywhere held up every client. Here the broker's own lock
// guards only its tables (topics, connections, wildcard subscriptions,
// durable names) and is held for map look-ups, never across I/O. Each
// topic has its own lock for its seq counter and subscriber set, and each
// connection has its own for its pending acks. Lock order, when two are
// held: topic, then broker (read) or connection, then the log committer.

// Broker routes messages between WebSocket clients. Create one with New,
// serve it as an http.Handler, and stop it with Shutdown.
type Broker struct {
	opts   Options      // with defaults applied; read-only after New
	logger *slog.Logger // opts.Logger
	store  Store        // the durable log and cursors
	log    *committer   // batches appends, trims and cursors to store

	mu          sync.RWMutex               // guards the fields below
	topics      map[string]*topic          // exact topic name → topic
	wildcards   map[*subscription]struct{} // live-only filter subscriptions
	connections map[*connection]struct{}   // every open connection
	durables    map[string]*subscription   // durable key → its owner
	closing     bool                       // set by Shutdown
	stop        chan struct{}              // closed by Shutdown
	loops       sync.WaitGroup             // retry and retention loops
	closed      sync.WaitGroup             // open connection handlers
	shutdown    sync.Once                  // makes Shutdown idempotent
	shutdownErr error                      // what the first Shutdown got
	open        atomic.Int64               // connections, for MaxConnections
	logins      loginThrottle              // failed logins, per user and address
}

// topic is one exact topic: its log's in-memory index and its subscribers.
type topic struct {
	name string // the exact topic name

	mu          sync.Mutex                 // guards the fields below
	head        uint64                     // newest seq given; 0 before any
	committed   uint64                     // newest seq on disk and fanned out
	lastTime    int64                      // newest timestamp, Unix ms
	index       []entry                    // retained messages, by seq
	ids         map[string]uint64          // QoS 1 message_id → seq
	subscribers map[*subscription]struct{} // exact-topic subscriptions
}

// entry is what the broker remembers of a retained message without its
// payload: enough to apply retention and to recognise a repeated id.
type entry struct {
	seq       uint64 // the message's seq
	timestamp int64  // Unix ms, for the time-to-live
	id        string // message_id, for idempotent QoS 1 publishes
	qos       int    // only QoS 1 ids are remembered for dedup
}

// New starts a broker over opts.Store, loading every topic's index from it.
// The caller keeps ownership of the store: Shutdown closes it.
func New(opts Options) (*Broker, error) {
	if len(opts.Secret) == 0 {
		return nil, ErrNoSecret
	}
	if opts.Store == nil {
		return nil, errors.New("popsub: Options.Store is required")
	}
	opts = opts.withDefaults()
	b := &Broker{
		opts:        opts,
		logger:      opts.Logger,
		store:       opts.Store,
		topics:      make(map[string]*topic),
		wildcards:   make(map[*subscription]struct{}),
		connections: make(map[*connection]struct{}),
		durables:    make(map[string]*subscription),
		stop:        make(chan struct{}),
	}
	if err := b.loadTopics(); err != nil {
		return nil, err
	}
	b.log = newCommitter(b)

	// Retries and retention run on their own loops; see their sections.
	b.loops.Add(2)
	go b.retryLoop()
	go b.retentionLoop()
	return b, nil
}

// loadTopics rebuilds each stored topic's head and index at start.
func (b *Broker) loadTopics() error {
	heads, err := b.store.Topics()
	if err != nil {
		return fmt.Errorf("load topics: %w", err)
	}
	for name, head := range heads {
		t := newTopic(name)
		t.head, t.committed = head, head
		for after := uint64(0); ; {
			msgs, err := b.store.Read(name, after, replayChunk)
			if err != nil {
				return fmt.Errorf("load topic %q: %w", name, err)
			}
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				t.remember(m)
			}
			after = msgs[len(msgs)-1].Seq
		}
		b.topics[name] = t
	}
	return nil
}

// newTopic returns an empty topic called name.
func newTopic(name string) *topic {
	return &topic{
		name:        name,
		ids:         make(map[string]uint64),
		subscribers: make(map[*subscription]struct{}),
	}
}

// topic returns the topic called name, creating it on first use.
func (b *Broker) topic(name string) *topic {
	b.mu.RLock()
	t := b.topics[name]
	b.mu.RUnlock()
	if t != nil {
		return t
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if t = b.topics[name]; t == nil {
		t = newTopic(name)
		b.topics[name] = t
	}
	return t
}

// remember adds m to the topic's index. The caller holds t.mu (or owns t).
func (t *topic) remember(m *Message) {
	t.index = append(t.index, entry{m.Seq, m.Timestamp, m.ID, m.QoS})
	if m.QoS == 1 {
		t.ids[m.ID] = m.Seq
	}
	t.lastTime = max(t.lastTime, m.Timestamp)
}

// forget drops the oldest n entries of the index and returns the seq of
// the last one dropped. The caller holds t.mu.
func (t *topic) forget(n int) uint64 {
	for _, e := range t.index[:n] {
		if t.ids[e.id] == e.seq {
			delete(t.ids, e.id)
		}
	}
	last := t.index[n-1].seq
	t.index = slices.Delete(t.index, 0, n)
	return last
}

// firstSeq is the oldest retained seq, or head+1 when the log is empty.
// The caller holds t.mu.
func (t *topic) firstSeq() uint64 {
	if len(t.index) == 0 {
		return t.head + 1
	}
	return t.index[0].seq
}

// # Connecting and authenticating
//
// A client proves who it is with a signed token in its first frame, as
// in the original; browsers cannot set headers on a WebSocket, so a frame
// is the one way every client can. Until then the connection gets a small
// read limit and a deadline, so a stranger cannot hold memory or a socket
// for long. After auth it gets a writer goroutine and a bounded outbox:
// every frame to the client goes through the outbox, so nothing but the
// writer ever blocks on the client's socket.

// Claims are what a token says about its holder: who (sub), until when
// (exp), and optionally which topics it may publish and subscribe to.
type Claims struct {
	jwt.RegisteredClaims
	// Publish lists the filters the holder may publish to; nil means
	// every ordinary topic (none starting with $).
	Publish []string `json:"publish,omitempty"`
	// Subscribe lists the filters the holder may subscribe to; nil means
	// every ordinary topic. $sys/… and $dead/… need an explicit grant.
	Subscribe []string `json:"subscribe,omitempty"`
}

// Sign signs the claims with secret, HS256.
func (c Claims) Sign(secret []byte) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// NewToken signs a token for subject sub that expires after ttl and may
// use every ordinary topic.
func NewToken(secret []byte, sub string, ttl time.Duration) (string, error) {
	now := time.Now()
	return Claims{RegisteredClaims: jwt.RegisteredClaims{
		Subject:   sub,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}.Sign(secret)
}

// verify checks a token: HS256 only (so neither alg none nor an RSA key
// passed off as an HMAC secret gets through), exp and sub required, and
// iss and aud when the broker is configured with them.
func (b *Broker) verify(token string) (*Claims, error) {
	if len(token) == 0 || len(token) > maxTokenBytes {
		return nil, errors.New("token missing or too long")
	}
	options := []jwt.ParserOption{jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithExpirationRequired(), jwt.WithLeeway(tokenLeeway)}
	if b.opts.Issuer != "" {
		options = append(options, jwt.WithIssuer(b.opts.Issuer))
	}
	if b.opts.Audience != "" {
		options = append(options, jwt.WithAudience(b.opts.Audience))
	}
	claims := &Claims{}
	_, err := jwt.ParseWithClaims(token, claims,
		func(*jwt.Token) (any, error) { return b.opts.Secret, nil },
		options...)
	if err != nil {
		return nil, err
	}
	if claims.Subject == "" {
		return nil, errors.New("token has no sub")
	}
	return claims, nil
}

// connection is one authenticated (or authenticating) WebSocket client.
type connection struct {
	broker *Broker
	ws     *websocket.Conn
	remote string // the peer's address, for logs

	sub       string        // token subject; set once, before the writer
	claims    *Claims       // the token's grants; reader goroutine only
	expiry    *time.Timer   // closes the connection when the token expires
	batch     bool          // the client accepts several objects a frame
	tokens    float64       // publish rate bucket; reader goroutine only
	refilled  time.Time     // when tokens was last topped up
	outbox    chan []byte   // frames for the writer; nil closes the socket
	room      chan struct{} // signalled when the outbox or window drains
	done      chan struct{} // closed when the reader returns
	confirms  chan confirm  // publish confirms in order; nil until used
	closing   atomic.Bool   // set by the first close
	closeCode websocket.StatusCode
	closeWhy  string

	mu            sync.Mutex               // guards the fields below
	subscriptions map[string]*subscription // by filter
	pending       map[pendingKey]*pending  // QoS 1 deliveries not acked
}

// ServeHTTP upgrades a request to a WebSocket and serves one client until
// it leaves. It blocks for the connection's whole life.
func (b *Broker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Refusing before the upgrade costs one HTTP response, not a socket
	// and two goroutines.
	if n := b.open.Add(1); b.opts.MaxConnections > 0 &&
		n > int64(b.opts.MaxConnections) {
		b.open.Add(-1)
		http.Error(w, "too many connections", http.StatusServiceUnavailable)
		return
	}
	defer b.open.Add(-1)
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OriginPatterns: b.opts.OriginPatterns,
	})
	if err != nil {
		b.logger.Debug("upgrade refused", "remote", r.RemoteAddr, "err", err)
		return
	}
	c := &connection{
		broker:        b,
		ws:            ws,
		remote:        r.RemoteAddr,
		outbox:        make(chan []byte, b.opts.Outbox),
		room:          make(chan struct{}, 1),
		done:          make(chan struct{}),
		subscriptions: make(map[string]*subscription),
		pending:       make(map[pendingKey]*pending),
	}
	if !b.register(c) {
		ws.Close(websocket.StatusGoingAway, "server shutting down")
		return
	}

	// However the client left, its socket is closed here: a peer that
	// vanished mid-frame would otherwise keep a file descriptor open.
	defer ws.CloseNow()
	defer b.unregister(c)
	c.serve()
}

// register adds c to the broker's table unless the broker is closing.
func (b *Broker) register(c *connection) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.connections[c] = struct{}{}
	b.closed.Add(1)
	return true
}

// unregister removes c and everything it subscribed to.
func (b *Broker) unregister(c *connection) {
	close(c.done)
	c.mu.Lock()
	subs := make([]*subscription, 0, len(c.subscriptions))
	for _, s := range c.subscriptions {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		b.unsubscribe(s)
	}
	b.mu.Lock()
	delete(b.connections, c)
	b.mu.Unlock()
	b.logger.Info("disconnected", "sub", c.sub, "remote", c.remote)
	b.closed.Done()
}

// serve authenticates the client, then reads its frames until it leaves.
func (c *connection) serve() {
	if !c.authenticate() {
		return
	}
	c.ws.SetReadLimit(c.broker.opts.MaxFrameBytes)
	go c.writeLoop()
	for {
		data, ok := c.read()
		if !ok {
			return
		}
		c.handle(data)
	}
}

// authenticate reads frames until a valid auth frame. Login frames may
// come first, to trade a password for a token; anything else is refused.
// Replies here are written directly: the writer has not started yet.
func (c *connection) authenticate() bool {
	c.ws.SetReadLimit(authReadLimit)

	// A timer, not a context: a cancelled Read drops the socket without
	// a close frame, and the client deserves to hear 4001.
	timer := time.AfterFunc(c.broker.opts.AuthTimeout, func() {
		c.ws.Close(CloseAuthFailed, "authentication timeout")
	})
	defer timer.Stop()
	for {
		data, ok := c.read()
		if !ok {
			return false
		}
		var f frame
		err := json.Unmarshal(data, &f)
		switch {
		case err == nil && f.Type == "login":
			c.write(c.broker.login(f, c.remote))
		case err == nil && f.Type == "auth":
			return c.accept(f)
		default:
			c.refuse("unauthenticated", "must authenticate first")
			return false
		}
	}
}

// accept checks the auth frame's token and, if it is good, starts the
// session: the subject, the grants, and a timer for the token's expiry.
func (c *connection) accept(f frame) bool {
	claims, err := c.broker.verify(f.Token)
	if err != nil {
		c.broker.logger.Info("auth failed", "remote", c.remote, "err", err)
		c.refuse("auth_failed", "authentication failed")
		return false
	}
	c.sub, c.claims, c.batch = claims.Subject, claims, f.Batch
	c.expiry = time.AfterFunc(untilExpiry(claims), c.expire)
	c.broker.logger.Info("connected", "sub", c.sub, "remote", c.remote)
	c.write(reply{Type: "authenticated", Sub: c.sub})
	return true
}

// untilExpiry is how long a verified token has left, leeway included.
func untilExpiry(claims *Claims) time.Duration {
	return time.Until(claims.ExpiresAt.Time) + tokenLeeway
}

// expire closes a connection whose token ran out without a fresh auth.
func (c *connection) expire() {
	c.closeWith(errorReply("token_expired", "token expired"),
		CloseTokenExpired, "token expired")
}

// refuse writes an error frame and closes with 4001.
func (c *connection) refuse(code, text string) {
	c.write(errorReply(code, text))
	c.ws.Close(CloseAuthFailed, text)
}

// write encodes r and writes it straight to the socket. Only used before
// the writer goroutine starts.
func (c *connection) write(r reply) {
	data, _ := json.Marshal(r)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.ws.Write(ctx, websocket.MessageText, data)
}

// read returns the next text frame. Binary frames and invalid UTF-8 close
// the connection: encoding/json would silently replace bad bytes, and
// then a payload would not be what its publisher sent.
func (c *connection) read() ([]byte, bool) {
	typ, data, err := c.ws.Read(context.Background())
	if err != nil {
		return nil, false
	}
	if typ != websocket.MessageText {
		c.ws.Close(websocket.StatusUnsupportedData, "text frames only")
		return nil, false
	}
	if !utf8.Valid(data) {
		c.ws.Close(websocket.StatusInvalidFramePayloadData, "invalid UTF-8")
		return nil, false
	}
	return data, true
}

// handle decodes one frame and answers it. A bad frame costs the client
// an error frame, never its connection.
func (c *connection) handle(data []byte) {
	f, problem := decodeFrame(data)
	if problem.Type != "" {
		c.reply(problem)
		return
	}
	switch f.Type {
	case "auth":
		c.reauthenticate(f)
	case "login":
		c.reply(c.broker.login(f, c.remote))
	case "subscribe":
		c.subscribe(f)
	case "unsubscribe":
		c.unsubscribeFrame(f)
	case "publish":
		c.publish(f)
	case "ack":
		c.ack(f)
	case "ping":
		c.reply(reply{Type: "pong"})
	default:
		c.reply(errorReply("unknown_type", "unknown frame type: "+f.Type))
	}
}

// decodeFrame parses one frame, or explains what is wrong with it.
func decodeFrame(data []byte) (frame, reply) {
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		return f, errorReply("bad_frame", "malformed frame: "+jsonError(err))
	}
	if f.Type == "" {
		return f, errorReply("missing_field", "frame has no type")
	}
	return f, reply{}
}

// reauthenticate accepts a fresh token for the same subject, as the
// original allowed: the session is extended and takes the new grants.
// Subscriptions made under the old grants stay.
func (c *connection) reauthenticate(f frame) {
	claims, err := c.broker.verify(f.Token)
	if err != nil || claims.Subject != c.sub {
		c.closeWith(errorReply("auth_failed", "authentication failed"),
			CloseAuthFailed, "authentication failed")
		return
	}
	c.claims = claims
	c.expiry.Reset(untilExpiry(claims))
	c.reply(reply{Type: "authenticated", Sub: c.sub})
}

// User is an account that may log in with a password.
type User struct {
	// PasswordHash is what HashPassword made of the password.
	PasswordHash string
	// Publish and Subscribe are the grants of tokens from login; nil
	// means every ordinary topic.
	Publish, Subscribe []string
}

// login answers a login frame with a token, as the original did. Each
// failure slows the next attempt for that user and that address; the
// delay is capped, so a stranger guessing cannot lock a user out.
func (b *Broker) login(f frame, remote string) reply {
	if len(b.opts.Users) == 0 {
		return errorReply("login_unavailable", "no users are configured")
	}
	keys := []string{"user:" + f.Username, "addr:" + hostOf(remote)}
	time.Sleep(b.logins.delay(keys...))

	// An unknown user costs the same hash as a known one, so timing does
	// not tell a stranger which names exist.
	user, known := b.opts.Users[f.Username]
	if !known {
		user.PasswordHash = dummyHash()
	}
	if !checkPassword(user.PasswordHash, f.Password) || !known {
		b.logins.record(false, keys...)
		b.logger.Info("login failed", "user", f.Username, "remote", remote)
		return errorReply("invalid_credentials", "invalid credentials")
	}
	b.logins.record(true, keys[0])
	token, err := b.loginToken(f.Username, user)
	if err != nil {
		return errorReply("internal", "could not sign a token")
	}
	return reply{Type: "login_response", Token: token}
}

// loginToken signs a token for a user who logged in.
func (b *Broker) loginToken(name string, user User) (string, error) {
	now := time.Now()
	claims := Claims{Publish: user.Publish, Subscribe: user.Subscribe}
	claims.Subject, claims.Issuer = name, b.opts.Issuer
	claims.IssuedAt = jwt.NewNumericDate(now)
	claims.ExpiresAt = jwt.NewNumericDate(now.Add(b.opts.LoginTokenTTL))
	if b.opts.Audience != "" {
		claims.Audience = jwt.ClaimStrings{b.opts.Audience}
	}
	return claims.Sign(b.opts.Secret)
}

// Password hashing is PBKDF2-SHA256 from the standard library, at the
// iteration count OWASP recommends, stored as
// pbkdf2-sha256$ITERATIONS$SALT$KEY with base64 salt and key.
const passwordIterations = 600_000

// dummyHash is checked for unknown users, so they cost as much as real
// ones. It is made on first use: hashing takes a noticeable moment.
var dummyHash = sync.OnceValue(func() string {
	hash, _ := hashPassword("", passwordIterations)
	return hash
})

// HashPassword returns the stored form of password for a User.
func HashPassword(password string) (string, error) {
	return hashPassword(password, passwordIterations)
}

// hashPassword hashes password with a fresh salt at iterations.
func hashPassword(password string, iterations int) (string, error) {
	salt := make([]byte, 16)
	rand.Read(salt)
	key, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	encode := base64.RawStdEncoding.EncodeToString
	return fmt.Sprintf("pbkdf2-sha256$%d$%s$%s", iterations, encode(salt),
		encode(key)), nil
}

// checkPassword reports whether password matches hash, in constant time.
func checkPassword(hash, password string) bool {
	parts := strings.Split(hash, "$")
	if len(parts) != 4 || parts[0] != "pbkdf2-sha256" {
		return false
	}
	iterations, err := strconv.Atoi(parts[1])
	salt, err1 := base64.RawStdEncoding.DecodeString(parts[2])
	key, err2 := base64.RawStdEncoding.DecodeString(parts[3])
	if err != nil || err1 != nil || err2 != nil || len(key) == 0 ||
		iterations < 1 {
		return false
	}
	got, err := pbkdf2.Key(sha256.New, password, salt, iterations, len(key))
	return err == nil && subtle.ConstantTimeCompare(got, key) == 1
}

// Login throttling: the first failure costs nothing, each further one
// doubles the wait before the next attempt, up to loginMaxDelay, and ten
// quiet minutes forget it all.
const (
	loginBaseDelay = 250 * time.Millisecond
	loginMaxDelay  = 4 * time.Second
	loginForget    = 10 * time.Minute
	loginMaxKeys   = 10_000 // more keys than this, and old ones are dropped
)

// loginThrottle counts recent login failures per key (user or address).
type loginThrottle struct {
	mu       sync.Mutex               // guards failures
	failures map[string]loginFailures // key → recent failures
}

// loginFailures is one key's recent failures.
type loginFailures struct {
	count int       // failures since the last success or forgetting
	last  time.Time // when the newest failure happened
}

// delay is how long the next attempt for any of keys must wait.
func (t *loginThrottle) delay(keys ...string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var wait time.Duration
	for _, key := range keys {
		f := t.failures[key]
		if f.count < 2 || time.Since(f.last) > loginForget {
			continue
		}
		wait = max(wait, min(loginBaseDelay<<min(f.count-2, 8),
			loginMaxDelay))
	}
	return wait
}

// record counts a failure against keys, or clears them on success.
func (t *loginThrottle) record(ok bool, keys ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failures == nil || len(t.failures) > loginMaxKeys {
		t.failures = make(map[string]loginFailures)
	}
	for _, key := range keys {
		if ok {
			delete(t.failures, key)
			continue
		}
		f := t.failures[key]
		if time.Since(f.last) > loginForget {
			f.count = 0
		}
		t.failures[key] = loginFailures{f.count + 1, time.Now()}
	}
}

// hostOf is the host part of a remote address.
func hostOf(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// # The outbox and back-pressure
//
// The original had no back-pressure: a slow subscriber's channel simply
// filled. Here each connection has a bounded outbox drained by its own
// writer goroutine. Replies to a client's own requests wait for room, so a
// client that stops reading stops being read. Live deliveries never wait:
// a publisher must not stall because one subscriber is slow, so a full
// outbox, or a full window of unacked QoS 1 deliveries, cuts the
// subscriber off with 4008. Nothing retained is lost: it resumes from the
// log with "after", or from its durable cursor.

// writeLoop is the connection's only writer. It owns the socket's write
// side until the reader returns; a nil frame means "close now". It also
// pings the peer: one that has not answered by the next tick is closed.
func (c *connection) writeLoop() {
	ping := time.NewTicker(c.broker.opts.PingInterval)
	defer ping.Stop()
	var buffer []byte
	for {
		select {
		case data := <-c.outbox:
			if data == nil {
				c.ws.Close(c.closeCode, c.closeWhy)
				return
			}
			closing := false
			if c.batch {
				buffer, closing = c.gather(append(buffer[:0], data...))
				data = buffer
			}
			err := c.ws.Write(context.Background(), websocket.MessageText,
				data)
			if err != nil {
				c.ws.CloseNow()
				return
			}
			c.signalRoom()
			if closing {
				c.ws.Close(c.closeCode, c.closeWhy)
				return
			}
		case <-ping.C:
			go c.keepalive()
		case <-c.done:
			return
		}
	}
}

// gather appends every frame already queued to buffer, newline-separated,
// for clients that asked for batches, and reports whether a close marker
// was among them. One write then carries many deliveries: the biggest
// single saving in CPU per delivery, because each write is a system call.
func (c *connection) gather(buffer []byte) ([]byte, bool) {
	for range len(c.outbox) {
		data := <-c.outbox
		if data == nil {
			return buffer, true
		}
		buffer = append(append(buffer, '\n'), data...)
	}
	return buffer, false
}

// keepalive pings the peer and closes the socket if no pong comes back
// within one ping interval. A peer that vanished without a FIN would
// otherwise hold its subscriptions, and its durable name, forever.
func (c *connection) keepalive() {
	ctx, cancel := context.WithTimeout(context.Background(),
		c.broker.opts.PingInterval)
	defer cancel()
	if err := c.ws.Ping(ctx); err != nil && ctx.Err() != nil {
		c.broker.logger.Info("keepalive timeout", "sub", c.sub,
			"remote", c.remote)
		c.ws.CloseNow()
	}
}

// signalRoom wakes one replayer waiting for room, if any.
func (c *connection) signalRoom() {
	select {
	case c.room <- struct{}{}:
	default:
	}
}

// reply queues r, waiting for room: the client asked for it.
func (c *connection) reply(r reply) {
	data, _ := json.Marshal(r)
	c.enqueue(data)
}

// enqueue queues data, waiting for room or for the connection to end.
func (c *connection) enqueue(data []byte) bool {
	select {
	case c.outbox <- data:
		return true
	case <-c.done:
		return false
	}
}

// offer queues data without waiting; a full outbox cuts the client off.
func (c *connection) offer(data []byte) bool {
	select {
	case c.outbox <- data:
		return true
	default:
		c.cutOff("outbox full")
		return false
	}
}

// cutOff disconnects a slow consumer with 4008. It never blocks and takes
// no lock, so it is safe to call while fanning out under a topic's lock.
func (c *connection) cutOff(why string) {
	if c.closing.Swap(true) {
		return
	}
	c.broker.logger.Warn("slow consumer cut off", "sub", c.sub,
		"remote", c.remote, "reason", why)
	go c.ws.Close(CloseSlowConsumer, "slow consumer")
}

// closeWith queues a last frame, then a close with code. The writer sends
// them in that order, so the client reads why before the socket closes.
func (c *connection) closeWith(last reply, code websocket.StatusCode,
	why string) {
	if c.closing.Swap(true) {
		return
	}
	c.closeCode, c.closeWhy = code, why
	c.reply(last)
	c.enqueue(nil)
}

// # Subscribing
//
// A subscription to an exact topic starts with a replay of the topic's
// log and then turns live. The hand-over is the subtle part: while the
// replayer reads from the log, live fan-out skips the subscription; when
// the replayer finds nothing newer, it turns the subscription live under
// the topic's lock, the same lock that orders publishes. No message can
// slip between the two, and none is sent twice. Wildcard subscriptions
// (MQTT's + and #) cannot replay, because they span logs with separate
// seq counters, so they are live only.

// subscription is one client's interest in one topic or filter.
type subscription struct {
	conn    *connection    // the subscriber
	filter  string         // the topic, or a filter with + or #
	topic   *topic         // nil for a wildcard filter
	live    bool           // guarded by topic.mu: replay is done
	cancel  chan struct{}  // closed when the subscription ends
	durable *durableCursor // nil unless subscribed with a durable name
}

// durableCursor tracks how far a durable subscription has got. All fields
// are guarded by the connection's mu.
type durableCursor struct {
	key     string   // sub, name and topic, NUL-separated
	sent    uint64   // newest seq queued to the subscriber
	unacked []uint64 // QoS 1 seqs delivered, not acked, ascending
	saved   uint64   // the last position handed to the log
}

// subscribe answers a subscribe frame.
func (c *connection) subscribe(f frame) {
	if msg := validFilter(f.Topic); msg != "" {
		c.reply(topicError("invalid_topic", msg, f.Topic))
		return
	}
	if f.After != nil && f.Last != nil {
		c.reply(topicError("bad_frame", "use after or last, not both",
			f.Topic))
		return
	}
	if !allowed(c.claims.Subscribe, f.Topic) {
		c.reply(topicError("forbidden", "token may not subscribe to "+
			f.Topic, f.Topic))
		return
	}
	if isWildcard(f.Topic) {
		c.subscribeWildcard(f)
		return
	}
	if strings.ContainsRune(f.Durable, 0) || len(f.Durable) > 256 {
		c.reply(topicError("bad_frame", "invalid durable name", f.Topic))
		return
	}
	c.subscribeTopic(f)
}

// subscribeWildcard adds a live-only filter subscription.
func (c *connection) subscribeWildcard(f frame) {
	if f.Durable != "" || f.After != nil || f.Last != nil {
		c.reply(topicError("bad_frame",
			"wildcard subscriptions are live only", f.Topic))
		return
	}
	s := c.newSubscription(f.Topic, nil, "")
	c.broker.mu.Lock()
	c.broker.wildcards[s] = struct{}{}
	c.broker.mu.Unlock()
	c.reply(reply{Type: "subscribed", Topic: f.Topic})
}

// newSubscription registers a subscription on c, replacing any earlier
// one to the same filter so that new options take effect. A non-empty
// durable name gives it a cursor, set here before anyone else can see s.
func (c *connection) newSubscription(filter string, t *topic,
	durable string) *subscription {
	s := &subscription{conn: c, filter: filter, topic: t,
		cancel: make(chan struct{})}
	if durable != "" {
		key := strings.Join([]string{c.sub, durable, filter}, "\x00")
		s.durable = &durableCursor{key: key}
	}
	c.mu.Lock()
	old := c.subscriptions[filter]
	c.subscriptions[filter] = s
	c.mu.Unlock()
	if old != nil {
		c.broker.unsubscribe(old)
	}
	return s
}

// subscribeTopic subscribes to an exact topic: reply, replay, then live.
func (c *connection) subscribeTopic(f frame) {
	b := c.broker
	t := b.topic(f.Topic)
	s := c.newSubscription(f.Topic, t, f.Durable)

	// A durable name resumes from its cursor, which wins over after.
	if s.durable != nil {
		after, err := b.claimDurable(s)
		if err != nil {
			c.reply(topicError("store_failed", err.Error(), f.Topic))
			return
		}
		if after != nil {
			f.After, f.Last = after, nil
		}
	}

	// Registering and reading the head happen under one lock, so the
	// head in the reply is exactly where live delivery will begin.
	t.mu.Lock()
	start, recovered := t.startAfter(f.After, f.Last)
	head := t.head
	t.subscribers[s] = struct{}{}
	t.mu.Unlock()

	r := reply{Type: "subscribed", Topic: f.Topic, Seq: &head}
	if !recovered {
		r.Recovered = &recovered
	}
	c.reply(r)
	go s.replay(start)
}

// startAfter turns after or last into the seq replay starts after, and
// reports whether everything asked for is still retained. The caller
// holds t.mu.
func (t *topic) startAfter(after, last *uint64) (uint64, bool) {
	first := t.firstSeq()
	switch {
	case last != nil:
		return max(t.head-min(*last, t.head), first-1), true
	case after == nil:
		return first - 1, true
	case *after > t.head:
		// The client saw a future this log never had (it was deleted
		// and started again): give it everything, and say so.
		return first - 1, false
	case *after+1 < first && *after < t.head:
		return first - 1, false
	}
	return *after, true
}

// claimDurable makes s the owner of its durable name and returns the
// stored cursor, or nil for a name never seen. An earlier owner, perhaps
// a connection that died without the broker noticing yet, is told it was
// taken over and loses the subscription.
func (b *Broker) claimDurable(s *subscription) (*uint64, error) {
	d := s.durable
	b.mu.Lock()
	old := b.durables[d.key]
	b.durables[d.key] = s
	b.mu.Unlock()
	if old != nil {
		b.takeOver(old)
	}
	position, found, err := b.log.cursor(d.key)
	if err != nil {
		return nil, fmt.Errorf("read cursor: %w", err)
	}
	s.conn.mu.Lock()
	d.sent, d.saved = position, position
	s.conn.mu.Unlock()
	if !found {
		return nil, nil
	}
	return &position, nil
}

// takeOver ends a durable subscription claimed by another connection.
// The notice is offered, not waited for: its connection may be dead.
func (b *Broker) takeOver(old *subscription) {
	c := old.conn
	c.mu.Lock()
	if c.subscriptions[old.filter] == old {
		delete(c.subscriptions, old.filter)
	}
	c.mu.Unlock()
	b.unsubscribe(old)
	data, _ := json.Marshal(reply{Type: "unsubscribed", Topic: old.filter,
		Reason: "durable subscription taken over"})
	c.offer(data)
}

// unsubscribeFrame answers an unsubscribe frame. Unsubscribing from a
// topic one is not subscribed to is not an error: the result is the same.
func (c *connection) unsubscribeFrame(f frame) {
	if msg := validFilter(f.Topic); msg != "" {
		c.reply(topicError("invalid_topic", msg, f.Topic))
		return
	}
	c.mu.Lock()
	s := c.subscriptions[f.Topic]
	delete(c.subscriptions, f.Topic)
	c.mu.Unlock()
	if s != nil {
		c.broker.unsubscribe(s)
	}
	c.reply(reply{Type: "unsubscribed", Topic: f.Topic})
}

// unsubscribe ends s: no more deliveries, and its unacked ones are no
// longer retried. A durable cursor stays on disk for the next subscribe.
func (b *Broker) unsubscribe(s *subscription) {
	if s.topic != nil {
		s.topic.mu.Lock()
		delete(s.topic.subscribers, s)
		s.topic.mu.Unlock()
	}
	b.mu.Lock()
	delete(b.wildcards, s)
	if s.durable != nil && b.durables[s.durable.key] == s {
		delete(b.durables, s.durable.key)
	}
	b.mu.Unlock()

	c := s.conn
	c.mu.Lock()
	select {
	case <-s.cancel:
	default:
		close(s.cancel)
	}
	for key, p := range c.pending {
		if p.subscription == s {
			delete(c.pending, key)
		}
	}
	c.mu.Unlock()
}

// # Publishing and fan-out
//
// The original stamped, stored and then sent each message under its one
// lock. Here a publish takes only its topic's lock, and only for work
// that touches no socket and no disk: give the message the next seq and
// hand it to the log committer. The committer writes it in a batch with
// other publishes and only then fans it out, offering one shared encoding
// to every live subscriber's outbox. Delivering before the disk write
// would be faster by one sync, but a crash could then reuse a seq that a
// subscriber already saw, and its "after" would skip the new message.
// Only a QoS 1 publisher waits for the sync, on its connection's
// confirmer, before it hears "published".

// confirm is a QoS 1 publish waiting for its batch to reach the disk.
type confirm struct {
	sync  *flush // closed when the batch holding the message is synced
	reply reply  // the published frame to send after
}

// publish answers a publish frame.
func (c *connection) publish(f frame) {
	m, problem := newMessage(f)
	switch {
	case problem.Type != "":
		c.reply(problem)
		return
	case !allowed(c.claims.Publish, m.Topic):
		c.reply(topicError("forbidden", "token may not publish to "+m.Topic,
			m.Topic))
		return
	case !c.allowPublish():
		c.reply(topicError("rate_limited", "publishing too fast", m.Topic))
		return
	}
	seq, duplicate, synced := c.broker.publish(m)
	if m.QoS == 0 {
		return
	}
	c.confirm(confirm{synced, reply{Type: "published", Topic: m.Topic,
		MessageID: m.ID, Seq: &seq, Duplicate: duplicate}})
}

// newMessage validates a publish frame and builds its message.
func newMessage(f frame) (*Message, reply) {
	switch {
	case validTopic(f.Topic) != "":
		return nil, topicError("invalid_topic", validTopic(f.Topic), f.Topic)
	case len(f.Payload) == 0:
		return nil, topicError("missing_field", "publish needs a payload",
			f.Topic)
	case f.QoS != 0 && f.QoS != 1:
		return nil, topicError("invalid_qos", "qos must be 0 or 1", f.Topic)
	case len(f.MessageID) > maxMessageIDBytes:
		return nil, topicError("invalid_message_id",
			"message_id is longer than 256 bytes", f.Topic)
	}
	var payload bytes.Buffer
	json.Compact(&payload, f.Payload)
	id := f.MessageID
	if id == "" {
		id = newID()
	}
	return &Message{Topic: f.Topic, ID: id, QoS: f.QoS,
		Payload: payload.Bytes()}, reply{}
}

// allowPublish takes one publish from the connection's token bucket,
// which refills at PublishRate per second up to one second's worth.
func (c *connection) allowPublish() bool {
	rate := c.broker.opts.PublishRate
	if rate <= 0 {
		return true
	}
	now := time.Now()
	c.tokens = min(max(rate, 1), c.tokens+now.Sub(c.refilled).Seconds()*rate)
	c.refilled = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// confirm queues c for the connection's confirmer, starting it on first
// use. Confirms leave in publish order, and many can wait on one sync.
func (c *connection) confirm(cf confirm) {
	if c.confirms == nil {
		c.confirms = make(chan confirm, 256)
		go c.confirmLoop()
	}
	select {
	case c.confirms <- cf:
	case <-c.done:
	}
}

// confirmLoop sends each confirm once its message is on disk.
func (c *connection) confirmLoop() {
	for {
		select {
		case cf := <-c.confirms:
			select {
			case <-cf.sync.done:
			case <-c.done:
				return
			}
			if cf.sync.err != nil {
				cf.reply = errorReply("store_failed",
					"message not stored: "+cf.sync.err.Error())
			}
			c.reply(cf.reply)
		case <-c.done:
			return
		}
	}
}

// publish sequences m and queues it for the log, which fans it out once
// it is on disk. It returns m's seq, whether m repeated a QoS 1
// message_id the topic still remembers, and the flush that makes it
// durable.
func (b *Broker) publish(m *Message) (uint64, bool, *flush) {
	t := b.topic(m.Topic)
	t.mu.Lock()
	defer t.mu.Unlock()

	// A publisher that lost its confirm may send again: same id, same
	// seq, nothing stored or delivered twice.
	if seq, ok := t.ids[m.ID]; ok && m.QoS == 1 {
		return seq, true, b.log.barrier()
	}

	// Seq and timestamp are given under the lock, so both only grow.
	t.head++
	m.Seq = t.head
	m.Timestamp = max(time.Now().UnixMilli(), t.lastTime)
	t.remember(m)
	synced := b.log.append(m)
	if over := len(t.index) - b.opts.MaxMessages; over > 0 {
		b.log.trim(t.name, t.forget(over))
	}
	return m.Seq, false, synced
}

// deliverCommitted fans out a committed batch, topic by topic, in seq
// order. It runs on the committer's goroutine, right after the sync.
func (b *Broker) deliverCommitted(msgs []*Message) {
	for _, group := range byTopic(msgs) {
		t := b.topic(group[0].Topic)
		t.mu.Lock()
		for _, m := range group {
			t.committed = m.Seq
			b.fanOut(t, m)
		}
		t.mu.Unlock()
	}
}

// forgetFailed undoes the index entries of a batch the store refused, so
// that a publisher's retry is not mistaken for a duplicate, and moves the
// committed mark past them so that replay does not wait for them.
func (b *Broker) forgetFailed(msgs []*Message) {
	for _, group := range byTopic(msgs) {
		t := b.topic(group[0].Topic)
		t.mu.Lock()
		for _, m := range group {
			if t.ids[m.ID] == m.Seq {
				delete(t.ids, m.ID)
			}
			t.committed = max(t.committed, m.Seq)
		}
		t.index = slices.DeleteFunc(t.index, func(e entry) bool {
			return slices.ContainsFunc(group,
				func(m *Message) bool { return m.Seq == e.seq })
		})
		t.mu.Unlock()
	}
}

// byTopic splits msgs into runs per topic, keeping each topic's order.
func byTopic(msgs []*Message) [][]*Message {
	groups := map[string]int{}
	var out [][]*Message
	for _, m := range msgs {
		i, ok := groups[m.Topic]
		if !ok {
			i = len(out)
			groups[m.Topic] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], m)
	}
	return out
}

// fanOut offers m to every live subscriber of t and every matching
// wildcard subscription. The caller holds t.mu, which keeps seq order.
func (b *Broker) fanOut(t *topic, m *Message) {
	// One encoding serves every subscriber: the bytes are never mutated.
	data := appendDelivery(nil, m, 1)
	for s := range t.subscribers {
		if s.live {
			s.conn.deliverLive(s, m, data)
		}
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for s := range b.wildcards {
		if covers(s.filter, m.Topic) {
			s.conn.deliverLive(s, m, data)
		}
	}
}

// deliverLive offers one live delivery; it never waits.
func (c *connection) deliverLive(s *subscription, m *Message, data []byte) {
	if !c.track(s, m, c.broker.opts.MaxInflight) {
		c.cutOff("too many unacknowledged messages")
		return
	}
	c.offer(data)
}

// # Acknowledgements
//
// The original kept one pending entry per message, so the first ack from
// anyone cleared it for every subscriber. Here each connection keeps its
// own pending table, keyed by topic and message_id: an ack clears the
// acking connection's entry and nobody else's. The cost is one entry per
// subscriber per QoS 1 delivery, bounded by the in-flight window; the
// gain is that "at least once" holds for every subscriber.

// pendingKey names one delivery awaiting an ack on one connection.
type pendingKey struct {
	topic string // the message's exact topic
	id    string // its message_id
}

// pending is one QoS 1 delivery the subscriber has not acknowledged.
type pending struct {
	subscription *subscription // through which it was delivered
	message      *Message      // shared, never mutated
	attempt      int           // 1 on first delivery; grows with retries
	deadline     time.Time     // when the next retry is due
}

// track records a delivery about to be queued: a pending entry for QoS 1
// and the durable cursor's progress. It reports false when the in-flight
// window (limit) is full. It takes c.mu.
func (c *connection) track(s *subscription, m *Message, limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.QoS == 1 {
		if len(c.pending) >= limit {
			return false
		}
		c.pending[pendingKey{m.Topic, m.ID}] = &pending{
			subscription: s,
			message:      m,
			attempt:      1,
			deadline:     time.Now().Add(c.broker.opts.AckTimeout),
		}
	}
	if d := s.durable; d != nil {
		d.sent = m.Seq
		if m.QoS == 1 {
			d.unacked = append(d.unacked, m.Seq)
		}
		c.saveCursor(d)
	}
	return true
}

// ack answers an ack frame. Three forms clear this connection's pending
// deliveries: one message_id (on any topic, or on "topic"), a list of
// message_ids, or everything on a topic up to "seq". The last two are
// additions: one ack frame per delivery costs a client as much as the
// delivery did.
func (c *connection) ack(f frame) {
	ids := f.MessageIDs
	if f.MessageID != "" {
		ids = append(ids, f.MessageID)
	}
	if len(ids) == 0 && (f.Seq == nil || f.Topic == "") {
		c.reply(errorReply("missing_field",
			"ack needs a message_id, message_ids, or a topic and a seq"))
		return
	}
	c.mu.Lock()
	defer c.signalRoom()
	defer c.mu.Unlock()

	// With a topic and ids, each ack is one map look-up. The other forms
	// walk the pending table, which the in-flight window keeps bounded.
	if f.Topic != "" && f.Seq == nil {
		for _, id := range ids {
			c.settle(pendingKey{f.Topic, id})
		}
		return
	}
	for key, p := range c.pending {
		if f.Topic != "" && key.topic != f.Topic {
			continue
		}
		if slices.Contains(ids, key.id) ||
			(f.Seq != nil && p.message.Seq <= *f.Seq) {
			c.settle(key)
		}
	}
}

// settle removes a pending delivery, acked or dead-lettered, and moves a
// durable cursor past it. The caller holds c.mu.
func (c *connection) settle(key pendingKey) {
	p := c.pending[key]
	if p == nil {
		return
	}
	delete(c.pending, key)
	if d := p.subscription.durable; d != nil {
		if i := slices.Index(d.unacked, p.message.Seq); i >= 0 {
			d.unacked = slices.Delete(d.unacked, i, i+1)
		}
		c.saveCursor(d)
	}
}

// saveCursor hands a durable cursor to the log if it moved. The position
// is the highest seq with everything up to it acked (or sent, for QoS 0).
// The caller holds c.mu.
func (c *connection) saveCursor(d *durableCursor) {
	position := d.sent
	if len(d.unacked) > 0 {
		position = d.unacked[0] - 1
	}
	if position != d.saved {
		d.saved = position
		c.broker.log.saveCursor(d.key, position)
	}
}

// # Retries and dead letters
//
// The original retried by sending the message to the whole topic again,
// including subscribers that had acked. Here the retry loop walks each
// connection's own pending table and sends a retry, with its attempt
// number, only to the subscriber that owes the ack. After the last retry
// the message is not dropped: it goes to the dead-letter topic
// $dead/<topic>, with the reason and the subscriber, where an operator
// can look at it. The loop wakes several times per ack timeout, so a
// retry is late by at most a fifth of the timeout.

// retryLoop redelivers overdue QoS 1 messages until Shutdown.
func (b *Broker) retryLoop() {
	defer b.loops.Done()
	tick := time.NewTicker(clamp(b.opts.AckTimeout/5, time.Millisecond,
		time.Second))
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			for _, c := range b.connectionList() {
				c.redeliver(now)
			}
		case <-b.stop:
			return
		}
	}
}

// connectionList snapshots the open connections.
func (b *Broker) connectionList() []*connection {
	b.mu.RLock()
	defer b.mu.RUnlock()
	list := make([]*connection, 0, len(b.connections))
	for c := range b.connections {
		list = append(list, c)
	}
	return list
}

// redeliver retries c's overdue deliveries and dead-letters exhausted
// ones. Frames are built under c.mu and sent after it is released.
func (c *connection) redeliver(now time.Time) {
	var retries [][]byte
	var dead []*pending
	c.mu.Lock()
	for key, p := range c.pending {
		if now.Before(p.deadline) {
			continue
		}
		if p.attempt > c.broker.opts.MaxRetries {
			c.settle(key)
			dead = append(dead, p)
			continue
		}
		p.attempt++
		p.deadline = now.Add(c.broker.opts.AckTimeout)
		retries = append(retries, appendDelivery(nil, p.message, p.attempt))
	}
	c.mu.Unlock()

	for _, data := range retries {
		if !c.offer(data) {
			break
		}
	}
	for _, p := range dead {
		c.broker.deadLetter(p, c.sub)
	}
}

// deadLetter is the payload of a message on $dead/<topic>.
type deadLetter struct {
	Topic      string          `json:"topic"`
	MessageID  string          `json:"message_id"`
	Seq        uint64          `json:"seq"`
	Payload    json.RawMessage `json:"payload"`
	Reason     string          `json:"reason"`
	Attempts   int             `json:"attempts"`
	Subscriber string          `json:"subscriber"`
}

// deadLetter publishes an exhausted delivery to $dead/<topic>. A dead
// letter that is itself never acked is logged and dropped, not nested.
func (b *Broker) deadLetter(p *pending, subscriber string) {
	m := p.message
	b.logger.Warn("dead letter", "topic", m.Topic, "message_id", m.ID,
		"seq", m.Seq, "subscriber", subscriber, "attempts", p.attempt)
	if strings.HasPrefix(m.Topic, deadPrefix) {
		return
	}
	payload, _ := json.Marshal(deadLetter{
		Topic: m.Topic, MessageID: m.ID, Seq: m.Seq, Payload: m.Payload,
		Reason: "not acknowledged", Attempts: p.attempt,
		Subscriber: subscriber,
	})
	dead := deadPrefix + m.Topic
	if len(dead) > maxTopicBytes {
		return
	}
	b.publish(&Message{Topic: dead, ID: newID(), QoS: 1, Payload: payload})
}

// # Replay
//
// The original replayed stored messages with fresh ids and no guarantee.
// Here replay is a contract: a message replays with its original
// message_id, seq, timestamp and qos, and a QoS 1 replay is tracked and
// retried like a live delivery. The hand-over to live rests on one mark,
// the topic's committed seq: the committer moves it and fans out under
// the topic's lock, and the replayer turns live under that same lock once
// it has read up to the mark. Replay waits for room rather than
// overflowing: it uses at most half the outbox and half the in-flight
// window, so a subscriber that reads and acks is never cut off by its own
// history, and live traffic on its other subscriptions still has room.

// replay sends the log after seq start, then turns s live. It runs on its
// own goroutine and ends early if s or its connection ends.
func (s *subscription) replay(after uint64) {
	b := s.conn.broker
	var stuck uint64
	for {
		msgs, err := b.readLog(s.topic, after)
		if err != nil {
			b.logger.Error("replay read", "topic", s.filter, "err", err)
			s.conn.cutOff("log unreadable")
			return
		}
		for _, m := range msgs {
			if !s.conn.deliverReplay(s, m) {
				return
			}
			after = m.Seq
		}
		if len(msgs) > 0 {
			continue
		}

		// Nothing read, yet newer messages may be committed: either a
		// moment ago (read again) or unreadably (a corrupt record).
		// Seeing the same mark twice means the second: skip past it.
		live, newest := s.goLive(after)
		if live {
			return
		}
		if newest == stuck {
			after = newest
		}
		stuck = newest
	}
}

// goLive turns s live if nothing after seq is committed; otherwise it
// returns the committed mark. Under t.mu no fan-out can run, so nothing
// falls between replay and live.
func (s *subscription) goLive(after uint64) (bool, uint64) {
	t := s.topic
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.committed > after {
		return false, t.committed
	}
	if _, subscribed := t.subscribers[s]; subscribed {
		s.live = true
	}
	return true, after
}

// deliverReplay queues one replayed message once there is room.
func (c *connection) deliverReplay(s *subscription, m *Message) bool {
	half := c.broker.opts.MaxInflight / 2
	for {
		if len(c.outbox) < cap(c.outbox)/2+1 && c.track(s, m, max(half, 1)) {
			return c.enqueue(appendDelivery(nil, m, 1))
		}

		// No room: wait for the writer or an ack to make some. The poll
		// covers a wake-up taken by another replayer on this connection.
		select {
		case <-c.room:
		case <-time.After(10 * time.Millisecond):
		case <-s.cancel:
			return false
		case <-c.done:
			return false
		}
	}
}

// readLog returns up to replayChunk committed messages of t after seq.
func (b *Broker) readLog(t *topic, after uint64) ([]*Message, error) {
	return b.store.Read(t.name, after, replayChunk)
}

// # The log and its storage seam
//
// Every message, of any QoS, is appended to its topic's log, and the log
// is the one thing that must survive a crash. The original wrote each
// message to disk on the publisher's path; one sync per message caps a
// broker near two thousand publishes a second. Here a committer goroutine
// gathers everything queued since its last sync (appends, trims, cursor
// moves) into one transaction and one sync: group commit. Then it fans
// the batch out; only QoS 1 publishers wait for it. The disk sits behind
// Store, five methods, so that a bigger engine can replace bbolt without
// touching the broker.

// Store keeps topic logs and durable cursors. Implementations must make a
// Commit durable before returning and must be safe for concurrent use.
type Store interface {
	// Commit applies a batch atomically and durably.
	Commit(batch *Batch) error
	// Read returns up to limit messages of topic with seq > after, in
	// seq order.
	Read(topic string, after uint64, limit int) ([]*Message, error)
	// Topics returns every stored topic with its head seq.
	Topics() (map[string]uint64, error)
	// Cursor returns a durable cursor's position, if one is stored.
	Cursor(key string) (uint64, bool, error)
	// Close releases the store.
	Close() error
}

// Batch is one atomic step of the log: appends first, then trims, then
// cursor moves.
type Batch struct {
	// Messages to append, in seq order within each topic.
	Messages []*Message
	// Trims maps a topic to the seq up to which its log is deleted.
	Trims map[string]uint64
	// Cursors maps a durable key to its new position.
	Cursors map[string]uint64
}

// flush is the fate of one batch: done is closed once err is set.
type flush struct {
	done chan struct{} // closed after the batch is committed or failed
	err  error         // nil when the batch is on disk
}

// committer owns the group commit: callers queue work under its mutex and
// one goroutine commits the queue. Its mutex is a leaf: nothing else is
// locked while it is held.
type committer struct {
	broker *Broker
	wake   chan struct{} // signalled when work is queued
	ended  chan struct{} // closed when the loop returns

	mu         sync.Mutex // guards the fields below
	queued     *Batch     // work not yet committing
	committing *Batch     // the batch the loop is committing now
	next       *flush     // the fate of queued
	stopped    bool       // set by stop; the loop drains and returns
}

// newCommitter starts the commit loop for b.
func newCommitter(b *Broker) *committer {
	c := &committer{broker: b, wake: make(chan struct{}, 1),
		ended: make(chan struct{})}
	c.reset()
	go c.loop()
	return c
}

// reset starts an empty queue. The caller holds c.mu (or owns c).
func (c *committer) reset() {
	c.queued = &Batch{Trims: map[string]uint64{},
		Cursors: map[string]uint64{}}
	c.next = &flush{done: make(chan struct{})}
}

// append queues m and returns the flush that will make it durable.
func (c *committer) append(m *Message) *flush {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queued.Messages = append(c.queued.Messages, m)
	c.signal()
	return c.next
}

// trim queues deleting topic's log up to seq.
func (c *committer) trim(topic string, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queued.Trims[topic] = max(c.queued.Trims[topic], seq)
	c.signal()
}

// saveCursor queues a durable cursor's new position.
func (c *committer) saveCursor(key string, position uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queued.Cursors[key] = position
	c.signal()
}

// barrier returns a flush that completes once everything queued so far
// is durable: a repeated publish is confirmed no sooner than the first.
func (c *committer) barrier() *flush {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.signal()
	return c.next
}

// cursor reads a durable cursor, newest first: the queue, the batch being
// committed, then the store.
func (c *committer) cursor(key string) (uint64, bool, error) {
	c.mu.Lock()
	for _, batch := range []*Batch{c.queued, c.committing} {
		if batch == nil {
			continue
		}
		if position, ok := batch.Cursors[key]; ok {
			c.mu.Unlock()
			return position, true, nil
		}
	}
	c.mu.Unlock()
	return c.broker.store.Cursor(key)
}

// signal wakes the loop. The caller holds c.mu.
func (c *committer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// loop commits queued batches until stop, then commits what is left.
func (c *committer) loop() {
	defer close(c.ended)
	for range c.wake {
		c.mu.Lock()
		batch, fate, stopped := c.queued, c.next, c.stopped
		c.committing = batch
		c.reset()
		c.mu.Unlock()

		fate.err = c.broker.store.Commit(batch)
		if fate.err != nil {
			c.broker.logger.Error("log commit", "err", fate.err,
				"messages", len(batch.Messages))
			c.broker.forgetFailed(batch.Messages)
		} else {
			c.broker.deliverCommitted(batch.Messages)
		}
		close(fate.done)

		c.mu.Lock()
		c.committing = nil
		c.mu.Unlock()
		if stopped {
			return
		}
	}
}

// stop commits what is queued and ends the loop.
func (c *committer) stop() {
	c.mu.Lock()
	c.stopped = true
	c.signal()
	c.mu.Unlock()
	<-c.ended
}

// retentionLoop enforces every topic's time-to-live until Shutdown. The
// count cap is applied on append; time needs a clock, so the broker
// checks it here rather than waiting for someone to read the topic.
func (b *Broker) retentionLoop() {
	defer b.loops.Done()
	tick := time.NewTicker(clamp(b.opts.TTL/10, time.Millisecond,
		time.Minute))
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			b.expire(now.Add(-b.opts.TTL).UnixMilli())
		case <-b.stop:
			return
		}
	}
}

// expire trims from every topic the messages older than cutoff (Unix ms).
func (b *Broker) expire(cutoff int64) {
	b.mu.RLock()
	topics := make([]*topic, 0, len(b.topics))
	for _, t := range b.topics {
		topics = append(topics, t)
	}
	b.mu.RUnlock()
	for _, t := range topics {
		t.mu.Lock()
		n := 0
		for n < len(t.index) && t.index[n].timestamp < cutoff {
			n++
		}
		if n > 0 {
			b.log.trim(t.name, t.forget(n))
		}
		t.mu.Unlock()
	}
}

// # bbolt, the default store
//
// bbolt is a single-file, transactional, embedded B+tree: one file beside
// the binary, no server. Each topic is a bucket of records keyed by
// big-endian seq, so a cursor walks them in seq order; the topic's head
// is kept beside them so seqs never restart after the log is trimmed
// empty. Each record carries a CRC-32 of its bytes: bbolt checks only its
// own meta pages, and a flipped bit in a payload must not be delivered as
// if it were good.

// Bucket and key names in the bbolt file.
var (
	topicsBucket  = []byte("topics")  // topic name → topic bucket
	cursorsBucket = []byte("cursors") // durable key → position
	logBucket     = []byte("log")     // in a topic bucket: seq → record
	headKey       = []byte("head")    // in a topic bucket: newest seq
)

// BoltStore is the Store kept in one bbolt file.
type BoltStore struct {
	db     *bolt.DB
	logger *slog.Logger
}

// OpenBolt opens (or creates) the bbolt file at path. It fails within a
// second if another process has the file open.
func OpenBolt(path string, logger *slog.Logger) (*BoltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open %s: database is in use by another "+
			"process", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &BoltStore{db: db, logger: logger}, nil
}

// Commit writes a batch in one transaction: one sync for all of it.
func (s *BoltStore) Commit(batch *Batch) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, m := range batch.Messages {
			if err := putMessage(tx, m); err != nil {
				return fmt.Errorf("append %q: %w", m.Topic, err)
			}
		}
		for topic, seq := range batch.Trims {
			if err := trimLog(tx, topic, seq); err != nil {
				return fmt.Errorf("trim %q: %w", topic, err)
			}
		}
		cursors, err := tx.CreateBucketIfNotExists(cursorsBucket)
		if err != nil {
			return err
		}
		for key, position := range batch.Cursors {
			if err := cursors.Put([]byte(key), seqKey(position)); err != nil {
				return fmt.Errorf("save cursor: %w", err)
			}
		}
		return nil
	})
}

// putMessage appends m to its topic's bucket and moves the head.
func putMessage(tx *bolt.Tx, m *Message) error {
	topics, err := tx.CreateBucketIfNotExists(topicsBucket)
	if err != nil {
		return err
	}
	bucket, err := topics.CreateBucketIfNotExists([]byte(m.Topic))
	if err != nil {
		return err
	}
	records, err := bucket.CreateBucketIfNotExists(logBucket)
	if err != nil {
		return err
	}
	if err := records.Put(seqKey(m.Seq), encodeRecord(m)); err != nil {
		return err
	}
	if head := bucket.Get(headKey); head == nil ||
		binary.BigEndian.Uint64(head) < m.Seq {
		return bucket.Put(headKey, seqKey(m.Seq))
	}
	return nil
}

// trimLog deletes topic's records with seq <= upTo.
func trimLog(tx *bolt.Tx, topic string, upTo uint64) error {
	records := logOf(tx, topic)
	if records == nil {
		return nil
	}
	cursor := records.Cursor()
	for k, _ := cursor.First(); k != nil &&
		binary.BigEndian.Uint64(k) <= upTo; k, _ = cursor.First() {
		if err := cursor.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// logOf returns topic's record bucket, or nil if it has none.
func logOf(tx *bolt.Tx, topic string) *bolt.Bucket {
	topics := tx.Bucket(topicsBucket)
	if topics == nil {
		return nil
	}
	bucket := topics.Bucket([]byte(topic))
	if bucket == nil {
		return nil
	}
	return bucket.Bucket(logBucket)
}

// Read returns up to limit records of topic after seq, skipping (and
// logging) any whose checksum does not match.
func (s *BoltStore) Read(topic string, after uint64,
	limit int) ([]*Message, error) {
	var msgs []*Message
	err := s.db.View(func(tx *bolt.Tx) error {
		records := logOf(tx, topic)
		if records == nil {
			return nil
		}
		cursor := records.Cursor()
		for k, v := cursor.Seek(seqKey(after + 1)); k != nil &&
			len(msgs) < limit; k, v = cursor.Next() {
			m, err := decodeRecord(v)
			if err != nil {
				s.logger.Error("corrupt record skipped", "topic", topic,
					"seq", binary.BigEndian.Uint64(k), "err", err)
				continue
			}
			msgs = append(msgs, m)
		}
		return nil
	})
	return msgs, err
}

// Topics returns every topic bucket's name and head.
func (s *BoltStore) Topics() (map[string]uint64, error) {
	heads := map[string]uint64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		topics := tx.Bucket(topicsBucket)
		if topics == nil {
			return nil
		}
		return topics.ForEachBucket(func(name []byte) error {
			head := topics.Bucket(name).Get(headKey)
			if len(head) == 8 {
				heads[string(name)] = binary.BigEndian.Uint64(head)
			}
			return nil
		})
	})
	return heads, err
}

// Cursor returns the stored position of a durable cursor.
func (s *BoltStore) Cursor(key string) (uint64, bool, error) {
	var position uint64
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		cursors := tx.Bucket(cursorsBucket)
		if cursors == nil {
			return nil
		}
		if v := cursors.Get([]byte(key)); len(v) == 8 {
			position, found = binary.BigEndian.Uint64(v), true
		}
		return nil
	})
	return position, found, err
}

// Close closes the bbolt file.
func (s *BoltStore) Close() error {
	return s.db.Close()
}

// encodeRecord is m as JSON behind a 4-byte CRC-32 (Castagnoli).
func encodeRecord(m *Message) []byte {
	body, _ := json.Marshal(m)
	record := binary.BigEndian.AppendUint32(nil, crc32.Checksum(body,
		castagnoli))
	return append(record, body...)
}

// castagnoli is the CRC-32 table for records: hardware-accelerated.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// decodeRecord checks a record's CRC and decodes it.
func decodeRecord(record []byte) (*Message, error) {
	if len(record) < 4 {
		return nil, errors.New("record too short")
	}
	body := record[4:]
	if crc32.Checksum(body, castagnoli) !=
		binary.BigEndian.Uint32(record) {
		return nil, errors.New("checksum mismatch")
	}
	m := &Message{}
	if err := json.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return m, nil
}

// seqKey is seq as an 8-byte big-endian key, which sorts numerically.
func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

// # Shutdown
//
// A graceful stop closes every client with 1001 so it knows to come back
// later, stops the loops, commits whatever the log still holds and
// closes the store. Durable cursors are written as they move, so nothing
// a client acked is forgotten; unacked deliveries replay on resume.

// Shutdown closes every connection with 1001, waits for their handlers
// (or ctx), flushes the log and closes the store. It is idempotent.
func (b *Broker) Shutdown(ctx context.Context) error {
	b.shutdown.Do(func() { b.shutdownErr = b.shutdownOnce(ctx) })
	return b.shutdownErr
}

// shutdownOnce does Shutdown's work, once.
func (b *Broker) shutdownOnce(ctx context.Context) error {
	b.mu.Lock()
	b.closing = true
	b.mu.Unlock()
	close(b.stop)
	for _, c := range b.connectionList() {
		c.closing.Store(true)
		go c.ws.Close(websocket.StatusGoingAway, "server shutting down")
	}

	handlers := make(chan struct{})
	go func() { b.closed.Wait(); close(handlers) }()
	select {
	case <-handlers:
	case <-ctx.Done():
	}
	b.loops.Wait()
	b.log.stop()
	if err := b.store.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// # Helpers
//
// Topic rules are MQTT's, because most readers already know them: levels
// separated by "/", "+" matches one level, "#" matches the rest and must
// come last, and a wildcard in the first level never matches a topic
// starting with "$", so that "#" does not drown a subscriber in the
// broker's own traffic.

// validTopic explains why name cannot be published to, or returns "".
func validTopic(name string) string {
	if msg := validFilter(name); msg != "" {
		return msg
	}
	if isWildcard(name) {
		return "wildcards are for subscriptions, not publishes"
	}
	return ""
}

// validFilter explains why filter cannot be subscribed to, or returns "".
func validFilter(filter string) string {
	switch {
	case filter == "":
		return "topic is empty"
	case len(filter) > maxTopicBytes:
		return "topic is longer than 256 bytes"
	case strings.ContainsRune(filter, 0):
		return "topic contains a NUL character"
	}
	levels := strings.Split(filter, "/")
	for i, level := range levels {
		if strings.ContainsAny(level, "+#") && len(level) > 1 {
			return "a wildcard must fill a whole level"
		}
		if level == "#" && i != len(levels)-1 {
			return "# must be the last level"
		}
	}
	return ""
}

// isWildcard reports whether filter has a + or # level.
func isWildcard(filter string) bool {
	return strings.ContainsAny(filter, "+#")
}

// covers reports whether every topic that filter matches is also matched
// by grant. For a plain topic as filter, that is "grant matches topic",
// so one function routes messages and checks permissions.
func covers(grant, filter string) bool {
	if strings.HasPrefix(filter, "$") && (strings.HasPrefix(grant, "+") ||
		strings.HasPrefix(grant, "#")) {
		return false
	}
	for {
		level, rest, more := strings.Cut(grant, "/")
		if level == "#" {
			return true
		}
		name, filterRest, filterMore := strings.Cut(filter, "/")
		if name == "#" || (level != "+" && level != name) {
			return false
		}
		if !filterMore {
			return !more || rest == "#"
		}
		if !more {
			return false
		}
		grant, filter = rest, filterRest
	}
}

// allowed reports whether grants permit filter. No grants at all (nil)
// means every ordinary topic; $-topics always need an explicit grant.
func allowed(grants []string, filter string) bool {
	if grants == nil {
		return !strings.HasPrefix(filter, "$")
	}
	return slices.ContainsFunc(grants, func(grant string) bool {
		return covers(grant, filter)
	})
}

// topicError is an error frame about one topic.
func topicError(code, text, topic string) reply {
	r := errorReply(code, text)
	r.Topic = topic
	return r
}

// jsonError shortens a decoding error for an error frame.
func jsonError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return "field " + typeErr.Field + " has the wrong type"
	}
	return err.Error()
}

// appendDelivery appends the message frame for m at attempt. It is
// written by hand because it runs once per publish and once per retry,
// and encoding/json costs several times as much.
func appendDelivery(buf []byte, m *Message, attempt int) []byte {
	buf = append(buf, `{"type":"message","topic":`...)
	buf = appendString(buf, m.Topic)
	buf = append(buf, `,"payload":`...)
	buf = append(buf, m.Payload...)
	buf = append(buf, `,"timestamp":`...)
	buf = strconv.AppendInt(buf, m.Timestamp, 10)
	buf = append(buf, `,"message_id":`...)
	buf = appendString(buf, m.ID)
	buf = append(buf, `,"qos":`...)
	buf = strconv.AppendInt(buf, int64(m.QoS), 10)
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendUint(buf, m.Seq, 10)
	buf = append(buf, `,"attempt":`...)
	buf = strconv.AppendInt(buf, int64(attempt), 10)
	return append(buf, '}')
}

// appendString appends s as a JSON string. s is valid UTF-8: every frame
// is checked on arrival.
func appendString(buf []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20:
			buf = append(buf, '\\', 'u', '0', '0', hexDigits[c>>4],
				hexDigits[c&0xf])
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}

// newID returns a random 128-bit message id in hex.
func newID() string {
	var raw [16]byte
	rand.Read(raw[:])
	return hex.EncodeToString(raw[:])
}

// orDefault returns v, or fallback when v is zero.
func orDefault[T comparable](v, fallback T) T {
	var zero T
	if v == zero {
		return fallback
	}
	return v
}

// clamp returns d limited to [low, high].
func clamp(d, low, high time.Duration) time.Duration {
	return min(max(d, low), high)
}
