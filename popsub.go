// Package popsub is a small publish/subscribe broker that speaks JSON over
// WebSocket: the article's PopSub (written in Rust) done right, careful
// enough to run for demos and small deployments at the edge.
//
// # What it promises
//
//   - QoS 0 is at most once; QoS 1 is at least once per subscriber while
//     it stays connected, and across reconnects and restarts with a
//     durable name. Subscribers must tolerate duplicates.
//   - Within a topic every subscriber sees messages in seq order, replay
//     first and live after, with no gap or duplicate at the hand-over.
//   - A QoS 1 publish is confirmed once it is on disk, so it survives
//     kill -9 and power loss. No seq is reused after a crash.
//   - Memory is bounded under any burst. A subscriber is cut off (4008)
//     only when its socket takes nothing for a write timeout; one
//     overtaken by the log is told what it missed ("skipped").
//
// It does not replicate, order across topics, or speak TLS. Several
// brokers can share one log on NATS JetStream (SharedLog).
//
// # Reading path
//
// This file is the broker's behaviour, about 2,900 lines of code, 1,000
// of them on the first reading, which takes about 3.5 hours at 150 words
// of prose and 8 lines of code a minute, 5 where the code locks, starts
// a goroutine or selects. It follows a message from the options to
// shutdown. Sections marked "(detail)" may be skipped: the first reading
// reaches each through a hook it declares, or names what it calls.
//
// # Goroutines
//
// Per connection: the reader while its client speaks (serve); a writer
// while frames are queued; a confirmer once it publishes at QoS 1; a
// replayer per subscription while it catches up; a timer's work while it
// runs; a wait for each dead letter's sync; a close handshake while it
// waits for its peer. Per broker: the delayed-delivery and retention
// loops, the x-ray's loop, the committer, and up to 64 writers'
// goroutines kept a second for the next writer (queue.Workers).
//
// # A session
//
//	$ popsub serve
//	popsub listening on http://127.0.0.1:8080 (playground at /, …)
//	$ popsub client pub chat '"hello"' --qos 1
//	{"type":"published","topic":"chat","message_id":"…","seq":1}
//	$ popsub client sub chat
//	{"type":"message","topic":"chat","payload":"hello",…,"seq":1,…}
package popsub

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub/groupcommit"
	"github.com/popsub/popsub/login"
	"github.com/popsub/popsub/queue"
	"github.com/popsub/popsub/socket"
	"github.com/popsub/popsub/wire"
	"github.com/popsub/popsub/xray"
	"golang.org/x/time/rate"
)

// # Options, messages and frames
//
// First, the configuration and the wire. Every limit is an option with a
// named default. The protocol is the original's, one JSON object per text
// frame with a "type"; PopSub adds fields and frames, never changes one.
// Package wire declares it.

// Limits that are not options: they protect the broker, not a policy.
const (
	authReadLimit     = 8 << 10  // bytes a frame may have before auth
	maxMessageIDBytes = 256      // the longest message_id, in bytes
	replayChunk       = 256      // messages read from the log at a time
	maxQueueMessages  = 8192     // messages waiting for the log
	maxQueueBytes     = 2 << 20  // their bytes; see b.log.Admit
	deadPrefix        = "$dead/" // dead letters of T go to $dead/T
	// commitLinger is the longest a batch nobody waits for waits for
	// company (groupcommit): QoS 0's crash window.
	commitLinger = 100 * time.Millisecond
)

// Close codes the broker uses, beside the WebSocket standard ones (1001
// going away, 1003 binary frame, 1007 invalid UTF-8, 1009 too large).
const (
	// CloseAuthFailed: authentication failed, missing or too late.
	CloseAuthFailed websocket.StatusCode = 4001
	// CloseTokenExpired: the token expired and no fresh one came.
	CloseTokenExpired websocket.StatusCode = 4003
	// CloseSlowConsumer: the subscriber did not drain what it was sent,
	// or its replay could not read the log; it may reconnect and resume.
	CloseSlowConsumer websocket.StatusCode = 4008
)

// Errors the broker returns to its Go callers.
var (
	// ErrClosed is returned by Publish after Shutdown.
	ErrClosed = errors.New("popsub: broker closed")
	// ErrNoSecret is returned by New when Options.Secret is empty.
	ErrNoSecret = errors.New("popsub: no token secret configured")
)

// Options configure a Broker; only Secret and Store are required. For
// every limit, zero asks for its default and a negative value is refused
// by New, but for MaxRetries, where a negative means no retries.
type Options struct {
	// Secret signs and verifies the HS256 tokens clients authenticate with.
	Secret []byte
	// Store keeps topic logs and durable cursors; boltstore.Open opens one.
	Store Store
	// AckTimeout is how long a QoS 1 delivery waits for its ack before it
	// is sent again. Zero: DefaultAckTimeout, 5 s.
	AckTimeout time.Duration
	// MaxRetries is how many retries follow the first delivery before it
	// is dead-lettered. Zero: DefaultMaxRetries, 5.
	MaxRetries int
	// MaxMessages is how many messages each topic's log keeps. Zero:
	// DefaultMaxMessages, 1,000.
	MaxMessages int
	// MaxLogBytes bounds each topic's log, as Message.size counts. Zero:
	// DefaultMaxLogBytes, 64 MiB.
	MaxLogBytes int
	// TTL is how long a message stays in its topic's log. Zero:
	// DefaultTTL, an hour.
	TTL time.Duration
	// MaxFrameBytes caps an incoming frame after auth; larger ones close
	// with 1009. Zero: DefaultMaxFrameBytes, 1 MiB.
	MaxFrameBytes int64
	// OutboxBytes bounds the frames queued for one connection's writer.
	// Zero: DefaultOutboxBytes, 4 MiB.
	OutboxBytes int
	// MaxInflight is how many unacked QoS 1 deliveries a connection may
	// hold. Zero: DefaultMaxInflight, 1,000.
	MaxInflight int
	// MaxInflightBytes bounds their sizes. Zero: DefaultMaxInflightBytes,
	// 16 MiB.
	MaxInflightBytes int
	// WriteTimeout is how long a socket write may wait for a peer that
	// takes none of it. Zero: DefaultWriteTimeout, 10 s.
	WriteTimeout time.Duration
	// AuthTimeout is how long a new connection has to authenticate.
	// Zero: DefaultAuthTimeout, 5 s.
	AuthTimeout time.Duration
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// FeatureOptions configure the features beyond the article's broker
	// (Defaults and start-up, a detail).
	FeatureOptions
}

// Message is one published message, as stored in its topic's log. Once
// it has a seq it is shared by every goroutine that delivers it, and
// never changed.
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
	// ExpiresAt is when it stops being delivered (ttl_ms), DeliverAt when
	// it is due (delay_ms): Unix ms, or 0.
	ExpiresAt int64 `json:"expires_at,omitempty"`
	DeliverAt int64 `json:"deliver_at,omitempty"`

	// delivery is its message frame at attempt 1, made once: every
	// subscriber is sent these bytes, and the log stores them.
	delivery []byte
	// publisher is the publisher's token subject ("" in process): a
	// message_id repeats only from the same publisher, as in Kafka.
	publisher string
	// released is the seq in $delayed/<Topic> it was released from, or 0.
	released uint64
}

// key is what makes m a duplicate: its publisher and its message_id.
func (m *Message) key() messageKey { return messageKey{m.publisher, m.ID} }

// messageKey is a QoS 1 message's identity for idempotent publishes.
type messageKey struct{ publisher, id string }

// expired reports whether m's ttl_ms has run out: then it is not
// delivered, replayed or retried (Naks, backoff and expiry).
func (m *Message) expired() bool { return wire.Past(m.ExpiresAt) }

// size is roughly what m costs in memory, its payload twice (as itself
// and in its frame): the log's queue and the window count these bytes.
func (m *Message) size() int {
	return 2*(len(m.Payload)+len(m.ID)+len(m.Topic)) + 128
}

// frame is any frame a client sends (wire.Frame). A pointer field's
// absence means something its zero does not: "after":0 asks for
// everything after seq 0, a missing "after" for nothing special.
type frame = wire.Frame

// reply is any frame the broker sends but a delivery (wire.Reply), which
// has its own hand-written encoder, appendDelivery: the hot path.
type reply = wire.Reply

// errorReply builds the error frame for code, with a human message.
func errorReply(code, text string) reply {
	return reply{Type: "error", Code: code, Message: text}
}

// topicError is an error frame about one topic.
func topicError(code, text, topic string) reply {
	return reply{Type: "error", Code: code, Message: text, Topic: topic}
}

// # The broker and its topics
//
// The original kept all its state behind one mutex, so a slow operation
// anywhere held up every client. Here the state is a few tables, each
// behind its own lock:
//
//	Broker.topics      name → topic: head seq, index of the log, subscribers
//	Broker.durables    durable key → the subscription that owns it
//	connection.unacked topic → the QoS 1 deliveries it owes acks for
//	connection.outbox  the frames its writer has yet to send
//
// The broker's lock guards its maps, never across I/O; a topic's guards
// its seq counter and subscribers, a connection's the acks it owes, so
// publishers to different topics never wait for each other. Lock order:
// topic, then broker or connection, then the committer's.

// Broker routes messages between WebSocket clients. Create one with New,
// serve it as an http.Handler, and stop it with Shutdown.
type Broker struct {
	// opts are the options with defaults applied; read-only after New.
	opts   Options
	logger *slog.Logger
	// store is the durable log and the cursors (Store).
	store Store
	// appendShared, if set, hands a publish to a log other brokers share
	// and returns the outcome that brings its seq (a detail).
	appendShared func(*Message) *outcome
	// log is the committer, the one goroutine that writes to store.
	log *commitLog

	// mu guards the tables below.
	mu sync.RWMutex
	// topics maps each exact topic name to its topic, made on first use;
	// connections are the registered ones, for Shutdown and the x-ray.
	topics      map[string]*topic
	connections map[*connection]struct{}
	// durables maps a durable key to the one subscription that owns it.
	durables map[string]*subscription
	// closing is set by Shutdown; no connection registers after it.
	closing bool

	// stop is closed by Shutdown; loops waits for the broker's loops to
	// return, registered for the connections to leave.
	stop       chan struct{}
	loops      sync.WaitGroup
	registered sync.WaitGroup
	// writers runs each connection's writer while it has frames queued.
	writers *workers
	// shutdown makes Shutdown idempotent, returning shutdownErr.
	shutdown    sync.Once
	shutdownErr error
	// open counts connections for MaxConnections.
	open atomic.Int64
	// xray is told of every transition; leaf holds the hooks to the
	// details; features is what the features keep (all below).
	xray observer
	leaf leaves
	features
}

// observer is told of each transition, in the protocol's words
// ("delivered", "acked", "connected", …): the x-ray, a detail, publishes
// them on $sys/events. No call blocks.
type observer interface {
	// message: m published (c nil), or delivered, acked, retried… to c,
	// with its pending entry p (nil for QoS 0).
	message(kind string, c *connection, m *Message, p *pending)
	// connection: c connected, disconnected or was cut off, and why.
	connection(kind string, c *connection, why string)
	// subscription: s subscribed or unsubscribed.
	subscription(kind string, s *subscription)
}

// leaves are the hooks by which the first reading calls the details;
// b.startFeatures sets each to the detail's function of its name.
type leaves struct {
	// overCapacity counts a new connection, and answers 503 and reports
	// true past MaxConnections.
	overCapacity func(w http.ResponseWriter) bool
	// acceptSocket upgrades r to a WebSocket; beforeRead runs before
	// each read.
	acceptSocket func(w http.ResponseWriter, r *http.Request,
		beforeRead func()) (Socket, error)
	// authenticate reports whether c's auth frame started a session
	// (c.claims set); if not, c is closed with 4001.
	authenticate func(c *connection) bool
	// recoverPanic, deferred by c's reader, logs a panic and takes c
	// apart; endSession stops the timers c's session started.
	recoverPanic, endSession func(c *connection)
	// retain indexes m, just sequenced, and trims the log to its caps,
	// under t.mu.
	retain func(t *topic, m *Message)
	// pinTopic returns the topic called name, made on first use and kept
	// while a subscription holds it; lockTopic returns it locked. letGo
	// lets go of what the details keep for s, ended with left unacked.
	pinTopic, lockTopic func(name string) *topic
	letGo               func(s *subscription, left []pending)
	// fanOutWildcards offers m, as fanOut does, to the wildcard
	// subscriptions that cover t, and cuts off any without room.
	fanOutWildcards func(t *topic, m *Message, deadline time.Time,
		wake *wakeups)
	// overtaken reports whether the log dropped seqs after *from, a
	// replay's place, given what a read from there found; if so it moves
	// *from past them and tells s, which had all up to after.
	overtaken func(s *subscription, after uint64, from *uint64,
		read []*Message) bool
	// waitForSeq waits, releasing t.mu, until t's next seq is reserved
	// on disk: false, with a nil or failed outcome, if done closed first
	// or the disk failed. seal gives back unused seqs at Shutdown.
	waitForSeq func(t *topic, done <-chan struct{}) (*outcome, bool)
	seal       func()
	// retryDelay is how long p, at its attempt, waits for its ack.
	retryDelay func(p *pending) time.Duration
	// ackMany settles what f acks many at a time, a list of ids or all
	// on a topic up to a seq, and reports whether f was such an ack.
	ackMany func(c *connection, f frame) bool
}

// topic is one exact topic: its log's in-memory index, without payloads,
// and its subscribers.
type topic struct {
	name string

	// mu guards the fields below, and orders sequencing, fan-out and
	// replay's hand-over.
	mu sync.Mutex
	// head is the newest seq given out, and fanned out; unsynced holds
	// the messages not on disk yet, in seq order, for replay.
	head     uint64
	unsynced []*Message
	// lastTime is the newest timestamp given, in Unix milliseconds.
	lastTime int64
	// index lists the retained messages in seq order (index.Live).
	index fifo[entry]
	// ids maps the key of each retained QoS 1 message to its seq.
	ids map[messageKey]uint64
	// subscribers are the exact-topic subscriptions, replaying or live.
	subscribers map[*subscription]struct{}
	// topicFeatures is what the features keep in a topic.
	topicFeatures
}

// entry is a retained message without its payload: enough to apply
// retention and to recognise a repeated id.
type entry struct {
	seq       uint64
	timestamp int64 // Unix ms, for the time-to-live
	key       messageKey
	size      int // Message.size, for the byte cap
}

// New starts a broker over opts.Store, loading every topic's index
// first, so that seqs go on where they stopped and a publisher's retry
// of a message stored before a crash is still recognised. Shutdown
// closes the store.
func New(opts Options) (*Broker, error) {
	// Give zero fields their defaults (opts.ready, Defaults and start-up).
	opts, err := opts.ready()
	if err != nil {
		return nil, err
	}
	b := &Broker{opts: opts, logger: opts.Logger, store: opts.Store,
		topics: map[string]*topic{}, durables: map[string]*subscription{},
		stop: make(chan struct{}), writers: &workers{},
		connections: map[*connection]struct{}{}}

	// Index, committer, loops (b.loadTopics, b.startLog, b.startFeatures).
	if err = b.loadTopics(); err != nil {
		return nil, err
	}
	b.log = b.startLog()
	b.startFeatures()
	return b, nil
}

// firstSeq is the oldest retained seq, or head+1 when the log is empty.
// The caller holds t.mu.
func (t *topic) firstSeq() uint64 {
	// Seqs never restart: after a trim to nothing, first is head+1.
	live := t.index.Live()
	if len(live) == 0 {
		return t.head + 1
	}
	return live[0].seq
}

// connectionList snapshots the open connections, so that the broker's
// lock is not held while each one is visited.
func (b *Broker) connectionList() []*connection {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Keys(b.connections))
}

// # The log: seq first, sync second
//
// Every message, of any QoS, is appended to its topic's log, the one
// thing that must survive a crash. The original synced each message on
// the publisher's path, which caps a broker near two thousand publishes a
// second. Here one goroutine, the committer, gathers everything queued
// since its last sync into one transaction and one sync: group commit. A
// batch nobody waits for (no QoS 1 confirm, no barrier) waits up to 100
// ms for company, so a trickle of QoS 0 costs some ten syncs a second.
//
// A message is delivered once it has its seq and confirmed once its batch
// is synced, so a crash can cost a subscriber only messages nobody
// confirmed. What a crash must never do is give one seq to two messages,
// or a subscriber's "after" would skip the second: seqs are reserved on
// disk in blocks before they are used, and after a crash a topic starts
// past its last block (a detail, behind two hooks).
//
// Delivering after the sync put a millisecond or two on every delivery; a
// write-ahead file of our own would survive kill -9 but not a power
// loss; bbolt's NoSync with a later sync is unsafe, as its pages may
// reach the disk in any order.

// # The machine room
//
// The machinery under the behaviour lives in packages, as the original
// split transport, broker and persistence into crates: the disk
// (boltstore; jetstream for a shared log), group commit (groupcommit),
// the WebSocket (socket), logins (login), the x-ray's queue (xray) and
// our tables' queues (queue). The first reading reaches them only
// through the declarations below. This file imports no storage engine,
// and builds for a browser (GOOS=js).

// Store keeps topic logs and durable cursors, safe for concurrent use;
// a Commit is durable when it returns.
type Store interface {
	// Commit applies a batch atomically and durably.
	Commit(batch *Batch) error
	// Read returns up to limit messages of topic with seq > after, in
	// seq order, stopping once their payloads pass maxBytes.
	Read(topic string, after uint64, limit, maxBytes int) ([]*Message, error)
	// Topics returns every stored topic with its head, the greatest seq
	// appended or set by Batch.Heads; it survives a trim to empty.
	Topics() (map[string]uint64, error)
	// Cursor returns a durable cursor's position, if one is stored.
	Cursor(key string) (uint64, bool, error)
	// Close releases the store.
	Close() error
}

// Batch is one atomic step of the log (groupcommit.Batch): forgets, then
// appends, then trims and deletes, then heads and the reserve, then
// cursor moves.
type Batch = groupcommit.Batch[*Message]

// outcome is what became of one batch: Done is closed once Err says
// whether it is on disk; on a shared log Seq and Duplicate bring the
// log's answer for its one message.
type outcome = groupcommit.Outcome

// Socket is one client's WebSocket, framed by package socket, or kept
// another way by a test or a page.
type Socket interface {
	// Read returns the next text frame, valid until the next Read, or nil
	// once the client is quiet (Idle). An error means the socket is done,
	// and has sent any close it needs (1003, 1007, 1009).
	Read() ([]byte, error)
	// SetReadLimit caps the frames Read returns, in bytes.
	SetReadLimit(n int64)
	// Send writes frames in order, each a WebSocket frame or, if joined,
	// runs of them joined by newlines; it fails once the peer took none
	// of it for WriteTimeout, and drops a message frame whose expires_at
	// has passed.
	Send(frames [][]byte, joined bool) error
	// Ping pings the peer and waits for its pong (any frame from the
	// peer may stand for it), or for ctx to end.
	Ping(ctx context.Context) error
	// Close sends a close frame and closes; CloseNow closes without one.
	Close(code websocket.StatusCode, reason string) error
	CloseNow() error
	// Idle makes a quiet socket's Read return nil, and calls resume when
	// the client speaks or the socket closes.
	Idle(resume func())
}

// wakeups are the writers a connection's reader owes a start
// (queue.Wakeups): Owe(outbox) owes one (a nil wakeups starts it at
// once), and Start, called before the reader reads, starts them all, so
// a burst of publishes reaches each subscriber in one write.
type wakeups = queue.Wakeups

// outbox is a connection's frames for its writer, at most a bound of
// bytes (queue.Outbox). Push queues frames, all or none, and starts the
// writer if none runs; PushWithin queues within a lower bound and owes
// the start to a wakeups; Take hands the writer every frame queued.
type outbox = queue.Outbox

// newOutbox(limit, write, b.writers) makes an outbox whose writer, write,
// runs on b.writers; recycle takes back a writer's array.
var newOutbox, recycle = queue.NewOutbox, queue.Recycle

// workers keeps finished writers' goroutines a second, for the next
// (queue.Workers); Stop ends them.
type workers = queue.Workers

// fifo is a queue of Ts (queue.Queue): Live lists the items, oldest
// first; Insert puts one at a place; Remove drops a run, Drop those that
// match.
type fifo[T any] = queue.Queue[T]

// notify signals ch, of capacity one, without waiting (queue.Notify).
var notify = queue.Notify

// commitLog is the committer, b.log (groupcommit.Log). Admit(size,
// urgent, done, beforeWait) waits for room in its queue, 8,192 messages
// and 2 MiB (an eighth more if urgent), and GiveBack returns unused room;
// Append(m) queues m and returns the outcome of its batch; Barrier()
// returns that of everything queued; Stop() commits the rest and ends.
type commitLog = groupcommit.Log[*Message]

// # Connecting and authenticating
//
// Now a client arrives. It proves who it is with a signed token in its
// first frame, as in the original: browsers cannot set headers on a
// WebSocket, so a frame is the one way every client can. Until then the
// connection gets a small read limit and a deadline, so a stranger cannot
// hold memory or a socket for long. A cookie would have been simpler for
// browsers, and would let any page a user visits ride their session.

// connection is one WebSocket client, from its upgrade until it leaves.
// Fields above mu are set before the writer starts, or belong to one
// goroutine; those below are guarded by mu.
type connection struct {
	broker *Broker
	ws     Socket
	// wake owes the writers that this reader's publishes filled a start.
	wake wakeups
	// remote is the peer's address; id numbers the connection for the
	// x-ray; bearer is a token from the Authorization header, standing
	// for the auth frame.
	remote string
	id     uint64
	bearer string
	// connectionFeatures is what the features keep in a connection.
	connectionFeatures

	// subject is the token's subject and client the name the auth frame
	// gave, set at auth under mu; claims are the token's grants (Claims).
	subject, client string
	claims          *Claims
	// retries fires at retryAt, when the earliest unacked delivery is
	// due; guarded by mu.
	retries *time.Timer
	retryAt time.Time
	// batch is set once the client opted into several objects a frame.
	batch bool
	// outbox queues frames for the writer. A nil frame tells the writer
	// to close with 4003, the token expired (Tokens).
	outbox *outbox
	// room is signalled when the writer takes frames or an ack frees part
	// of the window.
	room chan struct{}
	// done is closed, by end, when the reader returns or the writer
	// fails: every goroutine working for the connection ends with it.
	done  chan struct{}
	ended sync.Once
	// closing is set by the first close: its reason wins.
	closing atomic.Bool

	// mu guards the tables below, never while writing.
	mu sync.Mutex
	// subscriptions maps each filter to the connection's subscription.
	subscriptions map[string]*subscription
	// unacked holds the QoS 1 deliveries owed acks, by topic, in seq
	// order; inflight counts them and inflightBytes their sizes, for the
	// window.
	unacked                 map[string]*pendingQueue
	inflight, inflightBytes int
}

// connectionIDs numbers connections for events, from 1.
var connectionIDs atomic.Uint64

// ServeHTTP upgrades a request to a WebSocket and returns, the connection
// running on a goroutine of its own. Blocking here for the connection's
// life would keep the HTTP server's request and stack alive with it, a
// quarter of an idle connection's memory.
func (b *Broker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.leaf.overCapacity(w) {
		return
	}

	// Before each read, start the writers c's publishes filled (wakeups).
	var c *connection
	ws, err := b.leaf.acceptSocket(w, r, func() { c.wake.Start() })
	if err != nil {
		b.open.Add(-1)
		b.logger.Debug("upgrade refused", "remote", r.RemoteAddr, "err", err)
		return
	}
	// Register before auth: Shutdown sees c from its first moment.
	c = b.newConnection(ws, r.RemoteAddr)
	c.bearer = wire.BearerToken(r.Header.Get("Authorization"))
	if !b.register(c) {
		b.open.Add(-1)
		c.closeSocket(websocket.StatusGoingAway, "server shutting down")
		return
	}
	go c.serve()
}

// newConnection prepares a freshly upgraded connection. Its frames may
// have 8 KiB until the session raises the limit.
func (b *Broker) newConnection(ws Socket, remote string) *connection {
	c := &connection{broker: b, ws: ws, remote: remote,
		id:   connectionIDs.Add(1),
		room: make(chan struct{}, 1), done: make(chan struct{}),
		subscriptions: map[string]*subscription{},
		unacked:       map[string]*pendingQueue{}}
	c.outbox = newOutbox(b.opts.OutboxBytes, c.writeLoop, b.writers)
	ws.SetReadLimit(authReadLimit)
	return c
}

// register adds c to the broker's table, and reports whether it did: not
// once the broker is closing.
func (b *Broker) register(c *connection) bool {
	// One lock: Shutdown sees c, or c sees Shutdown.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.connections[c] = struct{}{}
	b.registered.Add(1)
	return true
}

// unregister takes c apart once its client has left: its subscriptions,
// its entry and its socket. Its unacked deliveries go with it: a durable
// subscription replays them on resume. Closing done first stops the
// confirmer before the subscriptions it works for are taken apart.
func (b *Broker) unregister(c *connection) {
	// Start the writers c owes; stop its timers, which hold c alive.
	c.wake.Start()
	c.end()
	b.leaf.endSession(c)
	c.mu.Lock()
	subs := slices.Collect(maps.Values(c.subscriptions))
	if c.retries != nil {
		c.retries.Stop()
	}
	c.mu.Unlock()
	for _, s := range subs {
		b.unsubscribe(s)
	}

	b.mu.Lock()
	delete(b.connections, c)
	b.mu.Unlock()
	b.logger.Info("disconnected", "sub", c.subject, "remote", c.remote)
	b.xray.connection("disconnected", c, "")
	b.open.Add(-1)
	b.registered.Done()
	// Close the socket, or a peer gone mid-frame keeps its descriptor.
	c.closeSocket(0, "")
}

// end closes c.done, once.
func (c *connection) end() { c.ended.Do(func() { close(c.done) }) }

// closeSocket closes c's socket with code and why, or at once with code
// 0: a peer that does not read never takes a close frame.
func (c *connection) closeSocket(code websocket.StatusCode, why string) {
	if code == 0 {
		c.ws.CloseNow()
		return
	}
	c.ws.Close(code, why)
}

// serve authenticates the client and reads its frames, as the only
// reader, until it leaves. A client quiet for a second holds no
// goroutine, a third of an idle connection's memory: Read returns nil,
// serve returns, and Idle starts serve again when the client speaks.
func (c *connection) serve() {
	defer c.broker.leaf.recoverPanic(c)
	if c.claims == nil && !c.broker.leaf.authenticate(c) {
		c.broker.unregister(c)
		return
	}

	// Handle frames in order: a pong proves all before it was handled.
	c.ws.Idle(c.serve)
	for {
		// A failed read ends the connection; nil, only this goroutine.
		data, err := c.ws.Read()
		if err != nil {
			c.broker.unregister(c)
		}
		if data == nil {
			return
		}
		// Split a batch (wire.Objects; Keepalives, limits and batches).
		for object := range wire.Objects(data, c.batch) {
			c.handle(object)
		}
	}
}

// handle decodes one frame and answers it. A bad frame costs an error
// frame, never the connection.
func (c *connection) handle(data []byte) {
	f, problem := decodeFrame(data)
	if problem.Type != "" {
		c.reply(problem)
		return
	}
	handlers[f.Type](c, f)
}

// handlers answer each frame type; each validates its own fields, so that
// its error names what was wrong. A feature adds its frames in its
// section (auth, login, nak).
var handlers = map[string]func(*connection, frame){
	"subscribe":   (*connection).subscribe,
	"unsubscribe": (*connection).unsubscribeFrame,
	"publish":     (*connection).publish,
	"ack":         (*connection).ack,

	"ping": func(c *connection, _ frame) { c.reply(reply{Type: "pong"}) },
}

// decodeFrame parses one frame of a known type, or explains what is wrong
// with it. data is not kept.
func decodeFrame(data []byte) (frame, reply) {
	f, err := wire.Decode(data)
	switch {
	case err != nil:
		return f, errorReply("bad_frame", "malformed frame: "+err.Error())
	case f.Type == "":
		return f, errorReply("missing_field", "frame has no type")
	case handlers[f.Type] == nil:
		return f, errorReply("unknown_type", "unknown frame type: "+f.Type)
	}
	return f, reply{}
}

// # Subscribing
//
// A subscription to an exact topic replays the topic's log and then turns
// live (Replay). Wildcard subscriptions (MQTT's + and #) span logs with
// separate seq counters, so they are live only: merging logs would need a
// global order the broker does not keep. A durable name ties a
// subscription to a cursor on disk, so that a client can resume where it
// stopped, on another connection or after a restart (a detail).

// subscription is one client's interest in one topic or filter.
type subscription struct {
	// conn is the subscriber, which owes the acks; to is where fan-out
	// and replay hand its messages: conn, or the receiver a detail puts
	// in its place.
	conn *connection
	to   receiver
	// filter is the topic, or a filter with + or #.
	filter string
	// topic is the exact topic, or nil for a wildcard filter.
	topic *topic
	// live is set once replay has caught up; from then on fan-out
	// delivers to it. Guarded by topic.mu.
	live bool
	// cancel is closed, under conn.mu, when the subscription ends.
	cancel chan struct{}
	// cursor keeps how far s has got on disk, or is nil.
	cursor cursor
	// shares is set when s shares its messages with others, each to one
	// of them (sharing); owed counts s's unacked deliveries, and window,
	// if not 0, caps them. Guarded by conn.mu.
	shares       sharing
	owed, window int
	// notice is a skipped frame that goes out with the next delivery, or
	// nil (Replay). Guarded by conn.mu.
	notice []byte
}

// A receiver takes a subscription's messages: the subscriber's connection
// (connection.deliver), or a detail's that hands them on. Fan-out and
// replay know only this.
type receiver interface {
	// deliver queues m to s if there is room, and reports whether s is
	// done with m.
	deliver(s *subscription, m *Message, delivery []byte, split int,
		deadline time.Time, wake *wakeups) bool
	// roomMade is signalled when deliver may find room it did not; a nil
	// channel: the caller polls.
	roomMade() <-chan struct{}
	// cutOff disconnects whoever receives, with 4008 and why.
	cutOff(why string)
}

// A cursor keeps on disk how far a subscription has got (Durable
// subscriptions, a detail). It guards itself: fan-out, acks and dead
// letters call it from their own goroutines.
type cursor interface {
	// delivered notes m, just queued to the subscriber.
	delivered(b *Broker, m *Message)
	// settled notes that the delivery of seq was acked or dead-lettered.
	settled(b *Broker, seq uint64)
	// deadID is the message_id of seq's dead letter, the same each time,
	// so that $dead stores it once.
	deadID(seq uint64) string
}

// sharing is the hook of a subscription that shares its messages (a
// work queue's member, a detail).
type sharing interface {
	// handOn gives list, deliveries s's connection will not finish, to
	// the others as their next attempts, to any but avoid, if set.
	handOn(list []pending, avoid *connection)
}

// subscribeKinds answer the subscribe frames of kinds beyond a topic's (a
// filter, a group; details): each reports whether f was its kind.
var subscribeKinds []func(c *connection, f frame) bool

// subscribeRules rule on each subscribe frame (a detail): each refuses f
// with a reply, or passes it with a zero one.
var subscribeRules []func(c *connection, f frame) reply

// subscribe answers a subscribe frame.
func (c *connection) subscribe(f frame) {
	for _, rule := range subscribeRules {
		if problem := rule(c, f); problem.Type != "" {
			c.reply(problem)
			return
		}
	}
	for _, kind := range subscribeKinds {
		if kind(c, f) {
			return
		}
	}
	c.subscribeTopic(f)
}

// newSubscription registers a subscription on c, replacing any to the
// same filter. A durable name gives it a cursor before anyone else can
// see s.
func (c *connection) newSubscription(filter string, t *topic,
	durable string) *subscription {
	s := &subscription{conn: c, to: c, filter: filter, topic: t,
		cancel: make(chan struct{})}
	if durable != "" {
		// newDurableCursor keys it (Durable subscriptions).
		s.cursor = newDurableCursor(c.subject, durable, filter)
	}
	// End the old one outside c.mu: its topic's lock comes first.
	c.mu.Lock()
	old := c.subscriptions[filter]
	c.subscriptions[filter] = s
	c.mu.Unlock()
	if old != nil {
		c.broker.unsubscribe(old)
	}
	return s
}

// ended reports whether s was unsubscribed: its cancel is closed.
func (s *subscription) ended() bool {
	select {
	case <-s.cancel:
		return true
	default:
		return false
	}
}

// subscribeTopic subscribes to an exact topic, pinned until s ends
// (leaves.pinTopic): reply, replay, then live. The client hears
// "subscribed" before any message; with nothing to replay, s turns live
// before the reader reads on, so the connection's next publish reaches it
// before its confirm. A durable name's stored position wins over after
// (c.resume; false: the store failed, and the client was told).
func (c *connection) subscribeTopic(f frame) {
	b, t := c.broker, c.broker.leaf.pinTopic(f.Topic)
	s := c.newSubscription(f.Topic, t, f.Durable)

	if f.Durable != "" && !c.resume(s, &f) {
		return
	}
	// One lock: the head in the reply is where live delivery begins.
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
	b.xray.subscription("subscribed", s)
	if finished, _ := s.finishReplay(start, nil, nil, time.Time{}); !finished {
		go s.replay(b, start, false)
	}
}

// startAfter turns after or last into the seq replay starts after, and
// reports whether all asked for is still retained: if not, the client
// gets what there is and "recovered":false. The caller holds t.mu.
func (t *topic) startAfter(after, last *uint64) (uint64, bool) {
	first := t.firstSeq()
	switch {
	case last != nil:
		// Counted in the index, not in seqs: seqs jump after a crash.
		live := t.index.Live()
		if n := int(min(*last, uint64(len(live)))); n > 0 {
			return live[len(live)-n].seq - 1, true
		}
		return t.head, true
	case after == nil:
		return first - 1, true
	case *after > t.head:
		// A future this log never had: it was deleted and begun again.
		return first - 1, false
	case *after+1 < first && *after < t.head:
		return first - 1, false
	}
	return *after, true
}

// dropSubscription removes s from c's table, if it is still there, and
// ends it.
func (c *connection) dropSubscription(s *subscription) {
	c.mu.Lock()
	if c.subscriptions[s.filter] == s {
		delete(c.subscriptions, s.filter)
	}
	c.mu.Unlock()
	c.broker.unsubscribe(s)
}

// unsubscribeFrame answers an unsubscribe frame, also for a topic the
// client is not subscribed to: the result is the same.
func (c *connection) unsubscribeFrame(f frame) {
	if msg := wire.ValidFilter(f.Topic); msg != "" {
		c.reply(topicError("invalid_topic", msg, f.Topic))
		return
	}
	// Reply once s is gone: nothing of it follows "unsubscribed".
	c.mu.Lock()
	s := c.subscriptions[f.Topic]
	c.mu.Unlock()
	if s != nil {
		c.dropSubscription(s)
	}
	c.reply(reply{Type: "unsubscribed", Topic: f.Topic})
}

// unsubscribe ends s: no more deliveries or retries; a durable cursor
// stays on disk. Each step is idempotent, so a takeover may race a
// disconnect. The details let go of s last (leaves.letGo).
func (b *Broker) unsubscribe(s *subscription) {
	// First no new deliveries from fan-out.
	if s.topic != nil {
		s.topic.mu.Lock()
		delete(s.topic.subscribers, s)
		s.topic.mu.Unlock()
	}

	// Then no retries: cancel s; drop its entries under c.mu, as record.
	c := s.conn
	var left []pending
	c.mu.Lock()
	first := !s.ended()
	if first {
		close(s.cancel)
		b.xray.subscription("unsubscribed", s)
	}
	// An emptied table stays, for overdue to drop, as settle's.
	for _, q := range c.unacked {
		c.inflight -= q.Drop(func(p pending) bool {
			if p.subscription != s {
				return false
			}
			c.inflightBytes -= p.message.size()
			left = append(left, p)
			return true
		})
	}
	c.mu.Unlock()
	if first {
		b.leaf.letGo(s, left)
	}
}

// # Publishing and fan-out
//
// This is the heart of the broker. The original stamped, stored and then
// sent each message under its one lock. Here a publish waits for room in
// the log's queue, then takes only its topic's lock, for work that
// touches no socket and no disk: give the message the next seq, encode
// its delivery frame once, hand it to the committer, and offer that frame
// to every live subscriber's outbox. Only a QoS 1 publisher waits for the
// sync, on its connection's confirmer, before it hears "published".

// publishRules rule on each well-formed publish (details): each refuses m
// with a reply, or passes it with a zero one, and may set until when m is
// delivered, and from when: a delayed m moves to wait in $delayed/<topic>.
var publishRules []func(c *connection, m *Message, f frame) reply

// publish answers a publish frame. A refusal names the publisher's
// message_id, so a client with many publishes in flight knows which. It
// does not wait for the disk: c.confirm hands the confirm to the
// confirmer (a detail), so one connection's publishes in flight share one
// sync.
func (c *connection) publish(f frame) {
	m, problem := newMessage(f, c.subject)
	for _, rule := range publishRules {
		if problem.Type == "" {
			problem = rule(c, m, f)
		}
	}
	if problem.Type != "" {
		if problem.Code != "invalid_message_id" {
			problem.MessageID = f.MessageID
		}
		c.reply(problem)
		return
	}
	seq, duplicate, stored := c.broker.publish(m, c.done, &c.wake)
	if m.QoS == 0 || stored == nil {
		return
	}
	c.confirm(m, seq, duplicate, stored)
}

// newMessage validates a publish frame and builds its message, from
// publisher, a token's subject.
func newMessage(f frame, publisher string) (*Message, reply) {
	switch problem := wire.ValidTopic(f.Topic); {
	case problem != "":
		return nil, topicError("invalid_topic", problem, f.Topic)
	case len(f.Payload) == 0:
		return nil, topicError("missing_field", "publish needs a payload",
			f.Topic)
	case f.QoS != 0 && f.QoS != 1:
		return nil, topicError("invalid_qos", "qos must be 0 or 1", f.Topic)
	case len(f.MessageID) > maxMessageIDBytes:
		return nil, topicError("invalid_message_id",
			"message_id is longer than 256 bytes", f.Topic)
	}
	return &Message{Topic: f.Topic, ID: f.MessageID, QoS: f.QoS,
		Payload: f.Payload, publisher: publisher}, reply{}
}

// publish waits for room in the log's queue, then sequences m, queues it
// for the log and fans it out. It returns m's seq, whether m repeated a
// QoS 1 message_id the topic remembers (same seq, nothing stored twice),
// and the outcome that says when m is durable: nil if done closed or the
// log stopped first, and nothing happened. On a shared log b.appendShared
// takes m instead, and its outcome brings the seq. wake is the publishing
// reader's (nil in process).
func (b *Broker) publish(m *Message, done <-chan struct{},
	wake *wakeups) (uint64, bool, *outcome) {
	m.ID = cmp.Or(m.ID, wire.NewMessageID())
	// The x-ray's events are this broker's own, even on a shared log.
	if b.appendShared != nil && !strings.HasPrefix(m.Topic, "$sys/") {
		return 0, false, b.appendShared(m)
	}
	// Wait before taking t.mu: the committer needs it to make room.
	if !b.log.Admit(m.size(), m.QoS == 1, done, wake.Start) {
		return 0, false, nil
	}
	t := b.leaf.lockTopic(m.Topic)
	defer t.mu.Unlock()

	// The stored head must cover the next seq (leaves.waitForSeq).
	if fate, ok := b.leaf.waitForSeq(t, done); !ok {
		b.log.GiveBack(m.size())
		return 0, false, fate
	}

	// A repeat gets the first copy's seq, and waits for its sync.
	if seq, ok := t.ids[m.key()]; ok && m.QoS == 1 {
		b.log.GiveBack(m.size())
		return seq, true, b.log.Barrier()
	}

	// Under the lock, seq and timestamp only grow.
	t.head++
	m.Seq = t.head
	m.Timestamp = max(time.Now().UnixMilli(), t.lastTime)
	m.delivery = appendDelivery(nil, m, 1)
	stored := b.log.Append(m)
	t.unsynced = append(t.unsynced, m)
	b.sequenced(t, m, wake)
	return m.Seq, false, stored
}

// sequenced indexes m, trimming the log to its caps (leaves.retain), and
// fans it out. The caller holds t.mu.
func (b *Broker) sequenced(t *topic, m *Message, wake *wakeups) {
	b.leaf.retain(t, m)
	b.xray.message("published", nil, m, nil)
	b.fanOut(t, m, wake)
}

// fanOut offers a new message to every live subscriber of t, and through
// leaves.fanOutWildcards to the wildcards that cover t. Replaying
// subscriptions read it from the log. The caller holds t.mu, which keeps
// seq order.
func (b *Broker) fanOut(t *topic, m *Message, wake *wakeups) {
	var deadline time.Time
	if m.QoS == 1 {
		deadline = time.Now().Add(b.opts.AckTimeout)
	}
	for s := range t.subscribers {
		if s.live && !s.to.deliver(s, m, m.delivery, 1, deadline, wake) {
			s.fallBehind(b, m.Seq-1)
		}
	}
	b.leaf.fanOutWildcards(t, m, deadline, wake)
}

// fallBehind turns a live subscription that had no room for the newest
// message back into a replaying one, which reads on from the log after
// seq. The caller holds s.topic.mu.
func (s *subscription) fallBehind(b *Broker, after uint64) {
	// In seq order, s has all up to after, nothing past it.
	s.live = false
	go s.replay(b, after, true)
}

// appendDelivery makes m's message frame at attempt, by hand
// (wire.AppendMessage): encoding/json cost several times as much.
func appendDelivery(buf []byte, m *Message, attempt int) []byte {
	return wire.AppendMessage(buf, m.Topic, m.ID, m.Payload, m.Timestamp,
		m.QoS, m.Seq, attempt, m.ExpiresAt, m.DeliverAt)
}

// # The outbox and back-pressure
//
// The original had no back-pressure: a slow subscriber's channel simply
// filled. Here every queue has a bound, in bytes and in count, and each
// bound says who waits when it is reached:
//
//   - the log's queue (b.log.Admit): a publisher's reader waits, so TCP
//     pushes back on that publisher alone;
//   - each connection's outbox: a reply to the client's own request
//     waits; a live delivery never does, as a publisher must not stall
//     for one slow subscriber: the subscription falls back to the log;
//   - the socket: a write waits for its peer, WriteTimeout at most.
//
// A subscriber is cut off with 4008 only when its socket took nothing for
// WriteTimeout, or a wildcard, which has no log to fall back on, found no
// room. Cutting off whoever filled a fixed queue cut off fast readers
// too, at any burst bigger than the queue.

// writeLoop is the connection's only writer while frames are queued; it
// exits once the outbox is empty, as a writer waiting for the next frame
// would cost every idle connection a parked goroutine. After a failed
// write no writer starts again: the reader sees the socket closed.
func (c *connection) writeLoop() {
	var frames [][]byte
	defer func() { recycle(frames) }()
	for ok := true; ok; {
		frames = c.outbox.Take(frames[:0])
		if len(frames) == 0 {
			return
		}
		notify(c.room)
		ok = c.writeFrames(frames)
	}
}

// writeFrames writes the frames one Take handed over, joined if the
// client opted into batches, and reports false once the socket is done
// with: a write failed, or a nil frame asked for the close (4003: only
// an expired token queues one).
func (c *connection) writeFrames(frames [][]byte) bool {
	// What came before a close leaves first.
	end := slices.IndexFunc(frames, func(f []byte) bool { return f == nil })
	if end >= 0 {
		frames = frames[:end]
	}
	if err := c.ws.Send(frames, c.batch); err != nil {
		c.writeFailed(err)
		return false
	}
	if end >= 0 {
		c.closeSocket(CloseTokenExpired, "token expired")
	}
	return end < 0
}

// writeFailed ends a connection whose socket refused a write. A write
// that timed out means a peer that stopped reading, cut off as a slow
// consumer.
func (c *connection) writeFailed(err error) {
	// end wakes a reader waiting for room this writer will not make.
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.cutOff("not reading")
	}
	c.end()
	c.closeSocket(0, "")
}

// reply queues r, waiting for room: the client asked for it.
func (c *connection) reply(r reply) {
	data, _ := json.Marshal(r)
	c.enqueue(data)
}

// enqueue queues frames, waiting for room, and reports whether it did:
// false, the connection ended first. Before it waits it starts the
// writers the reader owes, perhaps its own: nothing waits for a writer
// nobody started.
func (c *connection) enqueue(frames ...[]byte) bool {
	for !c.outbox.Push(frames...) {
		c.wake.Start()
		if !waitForRoom(c.room, c.done) {
			return false
		}
	}
	return true
}

// waitForRoom waits for a signal on room, or 10 ms, as one signal wakes
// one waiter and a receiver may have no channel. It reports false if stop
// closed first.
func waitForRoom(room, stop <-chan struct{}) bool {
	select {
	case <-room:
	case <-time.After(10 * time.Millisecond):
	case <-stop:
		return false
	}
	return true
}

// cutOff disconnects a slow consumer with 4008, saying why in the close's
// reason: a client that reads but never acks needs telling. It never
// blocks and takes no lock, so fan-out may call it under a topic's lock:
// the close handshake, which may wait seconds for a stuck peer, runs on a
// goroutine of its own.
func (c *connection) cutOff(why string) {
	// One closing already keeps its reason.
	if c.closing.Swap(true) {
		return
	}
	c.broker.logger.Warn("slow consumer cut off", "sub", c.subject,
		"remote", c.remote, "reason", why)
	c.broker.xray.connection("disconnected_slow", c, why)
	go c.closeSocket(CloseSlowConsumer, "slow consumer: "+why)
}

// # Acknowledgements
//
// The original kept one pending entry per message, so the first ack from
// anyone cleared it for every subscriber. Here each connection keeps its
// own pending deliveries, and an ack clears the acking connection's
// alone: one entry per subscriber per QoS 1 delivery, bounded by the
// in-flight window, buys "at least once" for every subscriber. A message
// that reaches a connection through two subscriptions (a topic and a
// wildcard) has an entry for each, and one ack clears both: one entry for
// the two left a durable cursor behind.
//
// The entries are kept per topic, in seq order: deliveries mostly come in
// order and are acked in it, so adding one is an append, and finding one,
// or all up to a seq (an ack of many at once, a detail), a binary search.
// A map keyed by message id made each ack up to a seq walk the table:
// QoS 1 to 100 subscribers cost 3.8 times QoS 0.

// pending is one QoS 1 delivery the subscriber has not acknowledged.
type pending struct {
	// subscription is the one it was delivered through: unsubscribing
	// drops its entries, and a durable one's cursor waits for them.
	subscription *subscription
	// message is shared with the log and other subscribers; read only.
	message *Message
	// attempt is 1 on first delivery and grows with each retry; past
	// 1+MaxRetries the delivery is dead-lettered. deadline is when the
	// next retry is due.
	attempt  int
	deadline time.Time
}

// pendingQueue is one topic's pending deliveries on one connection, in
// seq order.
type pendingQueue struct {
	fifo[pending]
}

// bySeq compares a pending delivery with a seq, for binary searches.
func bySeq(p pending, seq uint64) int {
	return cmp.Compare(p.message.Seq, seq)
}

// find returns where q holds p's message for p's subscription, or -1
// (also for no q).
func (q *pendingQueue) find(p pending) int {
	if q == nil {
		return -1
	}
	live := q.Live()
	i, _ := slices.BinarySearchFunc(live, p.message.Seq, bySeq)
	for ; i < len(live) && live[i].message.Seq == p.message.Seq; i++ {
		if live[i].subscription == p.subscription {
			return i
		}
	}
	return -1
}

// deliver queues m's delivery frame to s if there is room, and records it
// under c.mu, so an ack cannot miss the entry. It never waits. split
// divides each bound: 1 for live traffic, 2 for replay. It reports true
// when s is done with m: queued, expired, or s ended; false, having
// changed nothing, when there is no room (or s ended and shares its
// messages, so that another takes them).
func (c *connection) deliver(s *subscription, m *Message, delivery []byte,
	split int, deadline time.Time, wake *wakeups) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.ended() {
		return s.shares == nil
	}
	if m.expired() {
		return true
	}
	if !c.windowHas(s, m, split) || !c.push(s, delivery, split, wake) {
		return false
	}
	c.record(s, m, deadline)
	return true
}

// roomMade returns c.room.
func (c *connection) roomMade() <-chan struct{} { return c.room }

// push queues delivery within 1/split of the outbox, with s.notice, the
// skipped frame, before it if the log overtook s: both or neither, so the
// subscriber hears of a gap as the next message comes. It reports whether
// it queued them. The caller holds c.mu.
func (c *connection) push(s *subscription, delivery []byte, split int,
	wake *wakeups) bool {
	limit := c.broker.opts.OutboxBytes / split
	if s.notice == nil {
		return c.outbox.PushWithin(limit, wake, delivery)
	}
	if !c.outbox.PushWithin(limit, wake, s.notice, delivery) {
		return false
	}
	s.notice = nil
	return true
}

// windowHas reports whether 1/split of the in-flight window has room for
// m, if it is QoS 1, and s may owe one more (s.window). An empty window
// takes one message, however large. The caller holds c.mu.
func (c *connection) windowHas(s *subscription, m *Message, split int) bool {
	o := c.broker.opts
	if m.QoS == 0 || s.window > 0 && s.owed >= s.window {
		return m.QoS == 0
	}
	return c.inflight == 0 || c.inflight < max(o.MaxInflight/split, 1) &&
		c.inflightBytes+m.size() <= o.MaxInflightBytes/split
}

// record notes a delivery just queued to s: a pending entry if m is QoS
// 1, and its cursor's progress. The caller holds c.mu.
func (c *connection) record(s *subscription, m *Message, deadline time.Time) {
	var p *pending
	if m.QoS == 1 {
		p = c.addPending(pending{subscription: s, message: m, attempt: 1,
			deadline: deadline})
	}
	c.broker.xray.message("delivered", c, m, p)
	if d := s.cursor; d != nil {
		d.delivered(c.broker, m)
	}
}

// addPending adds p after those of its seq, mostly at the back, replacing
// the same subscription's entry for the message, and returns where it
// went. The caller holds c.mu.
func (c *connection) addPending(p pending) *pending {
	q := c.unacked[p.message.Topic]
	if q == nil {
		q = &pendingQueue{}
		c.unacked[p.message.Topic] = q
	}
	live, seq := q.Live(), p.message.Seq
	c.retryBy(p.deadline)
	if at := q.find(p); at >= 0 {
		live[at] = p
		return &live[at]
	}
	i, _ := slices.BinarySearchFunc(live, seq+1, bySeq)
	q.Insert(i, p)
	c.inflight++
	c.inflightBytes += p.message.size()
	p.subscription.owed++
	return &q.Live()[i]
}

// ack answers an ack frame, which clears this connection's deliveries of
// one message_id, on "topic" or on any: two topics may hold one id. A
// frame that acks many at once, a busy client's, is a detail's
// (leaves.ackMany).
func (c *connection) ack(f frame) {
	if many := c.broker.leaf.ackMany(c, f); f.MessageID == "" {
		if !many {
			c.reply(errorReply("missing_field",
				"ack needs a message_id, message_ids, or a topic and a seq"))
		}
		return
	}
	c.mu.Lock()
	defer notify(c.room)
	defer c.mu.Unlock()
	for _, p := range c.pendingOf(f.Topic, nil, f.MessageID) {
		c.settleOne(p, "acked")
	}
}

// pendingOf returns copies of c's pending deliveries on topic ("": any)
// of the message with seq (if not nil) or id. The caller holds c.mu.
func (c *connection) pendingOf(topic string, seq *uint64,
	id string) []pending {
	var found []pending
	for name, q := range c.unacked {
		if topic != "" && name != topic {
			continue
		}
		for _, p := range q.Live() {
			if seq != nil && p.message.Seq == *seq ||
				seq == nil && p.message.ID == id {
				found = append(found, p)
			}
		}
	}
	return found
}

// settleOne settles p, a copy of a pending delivery, if still pending.
// The caller holds c.mu.
func (c *connection) settleOne(p pending, kind string) {
	q := c.unacked[p.message.Topic]
	if i := q.find(p); i >= 0 {
		c.settle(q, i, i+1, kind)
	}
}

// settle removes q's entries i to j, acked, dead_lettered or moved (the
// kind). An ack moves their cursors and tells the x-ray; a dead letter
// does both once on disk; a move neither. An emptied table stays, for
// overdue to drop. The caller holds c.mu.
func (c *connection) settle(q *pendingQueue, i, j int, kind string) {
	live := q.Live()
	for k := i; k < j; k++ {
		p := &live[k]
		c.inflightBytes -= p.message.size()
		p.subscription.owed--
		if kind != "acked" {
			continue
		}
		c.broker.xray.message(kind, c, p.message, p)
		if d := p.subscription.cursor; d != nil {
			d.settled(c.broker, p.message.Seq)
		}
	}
	c.inflight -= j - i
	q.Remove(i, j)
}

// # Retries and dead letters
//
// The original retried by sending the message to the whole topic again,
// subscribers that had acked included. Here a retry goes only to the
// subscriber that owes the ack, and after the last one the message goes
// to $dead/<topic> with the reason, not away. Each connection has one
// timer, set for its earliest deadline, so a connection owing nothing
// holds none: a loop over every connection was up to a second late, and a
// timer per delivery costs memory per message. Backoff, naks and expiry
// are a detail.

// RetryWindow is how late a retry may be: a connection's timer fires at
// most once a RetryWindow.
const RetryWindow = 5 * time.Millisecond

// retryBy makes c's timer fire by deadline, or a RetryWindow from now if
// later, to run c.redeliver. The caller holds c.mu.
func (c *connection) retryBy(deadline time.Time) {
	// Never sooner than a RetryWindow: the timer fires at most that
	// often.
	if soonest := time.Now().Add(RetryWindow); deadline.Before(soonest) {
		deadline = soonest
	}
	switch {
	case !c.retryAt.IsZero() && !deadline.Before(c.retryAt):
		return
	case c.retries == nil:
		c.retries = time.AfterFunc(time.Until(deadline),
			func() { c.redeliver(time.Now()) })
	default:
		c.retries.Reset(time.Until(deadline))
	}
	c.retryAt = deadline
}

// redeliver retries c's overdue deliveries and dead-letters exhausted
// ones. A retry never waits: one that finds the outbox full counts as an
// attempt all the same, as a subscriber that has not drained it for an
// ack timeout is not reading. A delivery whose subscription shares its
// messages goes to another (s.shares.handOn).
func (c *connection) redeliver(now time.Time) {
	// Collect under c.mu, act after: a dead letter takes a topic's lock.
	c.mu.Lock()
	retries, dead, moves := c.overdue(now)
	c.mu.Unlock()

	// A full outbox drops a retry: the next attempt sends it again.
	for _, data := range retries {
		c.outbox.Push(data)
	}
	for _, p := range moves {
		p.subscription.shares.handOn([]pending{p}, c)
	}
	for i := range dead {
		c.broker.deadLetter(dead[i], c, dead[i].message.deadReason())
	}
}

// deadReason is the reason a delivery dead-lettered by overdue gives.
func (m *Message) deadReason() string {
	if m.expired() {
		return "expired"
	}
	return "not acknowledged"
}

// overdue walks c's pending deliveries once. Each overdue one gets its
// next attempt and a retry frame; or, past its last retry or expiry, goes
// among dead; or, if its subscription shares its messages, among moves.
// It drops emptied tables and sets c's timer for the earliest deadline
// left. The caller holds c.mu.
func (c *connection) overdue(now time.Time) (retries [][]byte,
	dead, moves []pending) {
	next := int64(math.MaxInt64) // the earliest deadline left, Unix ns
	for topic, q := range c.unacked {
		live := q.Live()
		if len(live) == 0 {
			delete(c.unacked, topic)
		}
		for i := range live {
			switch p := &live[i]; {
			case now.Before(p.deadline):
				next = min(next, p.deadline.UnixNano())
			case p.attempt > c.broker.opts.MaxRetries || p.message.expired():
				dead = append(dead, *p)
			case p.subscription.shares != nil:
				moves = append(moves, *p)
			default:
				p.attempt++
				p.deadline = now.Add(c.broker.leaf.retryDelay(p))
				next = min(next, p.deadline.UnixNano())
				c.broker.xray.message("redelivered", c, p.message, p)
				retries = append(retries,
					appendDelivery(nil, p.message, p.attempt))
			}
		}
	}
	// Set the timer for the earliest deadline left, if any.
	c.retryAt = time.Time{}
	if next < math.MaxInt64 {
		c.retryBy(time.Unix(0, next))
	}
	// Settle after the walk, as settling removes entries.
	for _, p := range dead {
		c.settleOne(p, "dead_lettered")
	}
	for _, p := range moves {
		c.settleOne(p, "moved")
	}
	return retries, dead, moves
}

// deadLetter publishes an exhausted delivery to $dead/<topic> at QoS 1,
// so that whoever watches gets it at least once; a dead letter's own is
// logged, not nested. The reason is a nak's, or m.deadReason. Every
// topic has room for its dead letters' (wire.MaxTopicBytes).
func (b *Broker) deadLetter(p pending, c *connection, reason string) {
	m := p.message
	b.logger.Warn("dead letter", "topic", m.Topic, "message_id", m.ID,
		"seq", m.Seq, "subscriber", c.subject, "attempts", p.attempt,
		"reason", reason)
	if strings.HasPrefix(m.Topic, deadPrefix) {
		b.deadLettered(p, c, true)
		return
	}
	// A cursor names its dead letter (cursor.deadID), to store it once.
	id := wire.NewMessageID()
	if d := p.subscription.cursor; d != nil {
		id = d.deadID(m.Seq)
	}
	// The letter carries the message whole, and who failed it, and why.
	payload, _ := json.Marshal(wire.DeadLetter{
		Topic: m.Topic, MessageID: m.ID, Seq: m.Seq, Payload: m.Payload,
		Reason: reason, Attempts: p.attempt,
		Subscriber: c.subject, Client: c.client,
	})
	_, duplicate, stored := b.publish(&Message{Topic: deadPrefix + m.Topic,
		ID: id, QoS: 1, Payload: payload}, b.stop, nil)

	// The delivery is done with once its letter is on disk: a goroutine
	// waits for it (b.deadLetterStored, in Confirms), not the caller. A
	// broker stopping leaves a durable cursor behind the delivery.
	if stored != nil {
		b.deadLetterStored(p, c, stored, duplicate)
	}
}

// deadLettered moves p's cursor past it, its dead letter on disk, and
// tells the x-ray if said (false: the letter was made before).
func (b *Broker) deadLettered(p pending, c *connection, said bool) {
	if d := p.subscription.cursor; d != nil {
		d.settled(b, p.message.Seq)
	}
	if said {
		b.xray.message("dead_lettered", c, p.message, &p)
	}
}

// # Replay
//
// The original replayed stored messages with fresh ids and no guarantee.
// Here a message replays with its original message_id, seq, timestamp and
// qos, and a QoS 1 replay is tracked and retried like a live delivery.
// The replayer reads the store, then the messages not synced yet. The
// hand-over rests on the topic's head: fan-out happens under the topic's
// lock as each seq is given, and the replayer turns live under that lock
// once it has sent up to the head, so nothing falls between the two and
// nothing comes twice. Replay waits for room in half the outbox and half
// the window, so a subscriber that reads and acks is never cut off by its
// own history.
//
// The same replay serves a live subscription that fell behind. There a
// message the log no longer keeps is a loss the subscriber hears of, not
// a cut-off: a "skipped" frame says up to which seq messages are gone and
// how many, and it goes on from the oldest kept. Such a message is gone,
// payload and all, so it cannot be dead-lettered.

// replay sends the log after seq after, then turns s live, on its own
// goroutine, ending early if s ends. behind says that s was live, and
// hears what the log dropped (leaves.overtaken). A log that cannot be
// read cuts the subscriber off. An empty read while newer seqs exist is a
// seq given a moment ago (read again), or one with nothing to read,
// skipped after a crash or a failed commit: the same synced seq seen
// twice (stuck). A shared log reads nothing until its feed catches up.
func (s *subscription) replay(b *Broker, after uint64, behind bool) {
	var stuck uint64
	from := after
	for {
		// The store first; past its end, the messages not on disk yet.
		msgs, err := b.store.Read(s.topic.name, from, replayChunk,
			b.opts.OutboxBytes/2)
		if err != nil {
			b.logger.Error("replay read", "topic", s.filter, "err", err)
			s.to.cutOff("log unreadable")
			return
		}
		if len(msgs) == 0 {
			msgs = s.topic.unsyncedAfter(from)
		}
		// The index leaves a message before the store: a gap shows here.
		if behind && b.leaf.overtaken(s, after, &from, msgs) {
			continue
		}
		for i, m := range msgs {
			sent, stop := s.deliverReplay(b, m, behind, i == len(msgs)-1)
			if stop {
				return
			}
			if !sent {
				break // it left the log meanwhile: the next turn says so
			}
			after, from = m.Seq, m.Seq
		}
		if len(msgs) > 0 {
			continue
		}

		// Nothing read: live, or wait, or skip a seq read twice.
		finished, newest := s.finishReplay(from, nil, nil, time.Time{})
		switch {
		case finished:
			return
		case b.appendShared != nil:
			time.Sleep(time.Millisecond)
		case newest == stuck:
			from = newest
		}
		stuck = newest
	}
}

// firstKept is the oldest seq the log keeps, or will after its next
// commit.
func (t *topic) firstKept() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.firstSeq()
}

// unsyncedAfter returns up to a chunk of the messages after seq not on
// disk yet, or none if the disk holds some after seq.
func (t *topic) unsyncedAfter(seq uint64) []*Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.synced() > seq {
		return nil
	}
	// Their seqs follow each other: a failed batch leaves from the front.
	i := min(int(seq-t.synced()), len(t.unsynced))
	return slices.Clone(t.unsynced[i:min(len(t.unsynced), i+replayChunk)])
}

// synced is the newest seq on disk. The caller holds t.mu.
func (t *topic) synced() uint64 {
	if len(t.unsynced) > 0 {
		return t.unsynced[0].Seq - 1
	}
	return t.head
}

// finishReplay turns s live if nothing after seq was given out, and
// reports whether the replay is finished (s live, or ended); if not, it
// returns the newest seq on disk. m, seq's message if not nil, goes out
// first as live traffic, if it has room.
func (s *subscription) finishReplay(after uint64, m *Message, delivery []byte,
	deadline time.Time) (finished bool, synced uint64) {
	t := s.topic
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head > after {
		return false, t.synced()
	}

	// One that ended meanwhile has left t, and stays gone.
	_, subscribed := t.subscribers[s]
	s.live = subscribed &&
		(m == nil || s.to.deliver(s, m, delivery, 1, deadline, nil))
	return s.live || !subscribed, after
}

// deliverReplay queues one replayed message once there is room, and
// reports whether it sent it, and whether the replay should stop: m, the
// newest, turned s live, or s ended. For a subscription behind, m is
// skipped if it left the log while it waited. Only the last of a read may
// be the newest, so only it takes the topic's lock.
func (s *subscription) deliverReplay(b *Broker, m *Message,
	behind, last bool) (sent, stop bool) {
	delivery := appendDelivery(nil, m, 1)
	for {
		if s.ended() {
			return false, true
		}
		if behind && m.Seq < s.topic.firstKept() {
			return false, false
		}
		deadline := time.Now().Add(b.opts.AckTimeout)
		if last {
			finished, _ := s.finishReplay(m.Seq, m, delivery, deadline)
			if finished {
				return false, true
			}
		}
		if s.to.deliver(s, m, delivery, 2, deadline, nil) {
			return true, false
		}
		if !waitForRoom(s.to.roomMade(), s.cancel) {
			return false, true
		}
	}
}

// # Shutdown
//
// A graceful stop closes every client with 1001 so it knows to come back
// later, stops the loops, gives back unused seqs, commits what the log
// still holds and closes the store. A crash skips all of this and loses
// nothing confirmed: confirms and cursors never run ahead of the disk.
// Draining every outbox first would let one stuck client hold the broker
// open; the context bounds the wait instead.

// Shutdown closes every connection with 1001, waits for them to leave (or
// ctx), flushes the log and closes the store. It is idempotent.
func (b *Broker) Shutdown(ctx context.Context) error {
	// A signal handler and a test's cleanup may both call it.
	b.shutdown.Do(func() { b.shutdownErr = b.shutdownOnce(ctx) })
	return b.shutdownErr
}

// shutdownOnce does Shutdown's work, once.
func (b *Broker) shutdownOnce(ctx context.Context) error {
	// No connection registers, and no loop goes round, after this.
	b.mu.Lock()
	b.closing = true
	b.mu.Unlock()
	close(b.stop)

	// Each close handshake waits for its peer, so they run side by side.
	for _, c := range b.connectionList() {
		c.closing.Store(true)
		go c.closeSocket(websocket.StatusGoingAway, "server shutting down")
	}
	left := make(chan struct{})
	go func() { b.registered.Wait(); close(left) }()
	select {
	case <-left:
	case <-ctx.Done():
	}
	b.writers.Stop()

	// The committer goes last, giving back unused seqs (leaves.seal).
	b.loops.Wait()
	b.leaf.seal()
	b.log.Stop()
	if err := b.store.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// # Defaults and start-up (detail)
//
// The first reading ends here. After it come the details it only named,
// in the order it reached them, from the defaults, tokens and logins to
// retention, the seqs reserved on disk, what a commit changes and the
// shared log; /source shows the machinery's packages after this file.
//
// Every limit is a named default with its unit and its reason, so that a
// zero Options works and the command's flags change each one. The timing
// defaults are the original PopSub's, so its users see the same
// behaviour; the size limits are ours, so that one misbehaving client
// costs a bounded amount of memory. Then what New starts for the
// features, each of which the first reading skips: a feature's loop is
// started here and explained in its own section.

// features is what the features beyond the article's broker keep in the
// Broker, each readied by b.startFeatures, or ready at its zero value.
type features struct {
	// groups maps a work queue's cursor key to the group (Work queues).
	groups map[string]*group
	// logins rations password hashes and remembers recent failures by
	// user and by address (b.startLogins, in Logins and passwords).
	logins *login.Gate
	// delays are the delayed messages waiting for their time (Delayed
	// delivery); a restart fills it as it loads the logs.
	delays delays
	// wildcards holds the live-only subscriptions with + or # (Topic
	// rules), guarded by the broker's mu, as its other tables are.
	wildcards map[*subscription]struct{}
	// largeFrames holds a token per frame over 64 KiB being read or
	// handled, as many as largeFramesBytes holds frames of the full
	// limit: 64 with the defaults (Keepalives, limits and batches).
	largeFrames chan struct{}
	// floor is the highest head of a topic forgotten, past which a topic
	// made again starts its seqs; forgets says whether the store forgets
	// topics whole, a Forgetter; cursored holds the topics a durable name
	// or a group ever had a cursor on, which are never forgotten. floor
	// and cursored are guarded by the broker's mu (Retention).
	floor    uint64
	forgets  bool
	cursored map[string]bool
	// topicCount is len(b.topics), stored wherever the table changes,
	// so that the cap's check takes no lock (b.topicLimit, Retention).
	topicCount atomic.Int64
	// reserve is the store's reserve on disk, the seqs a topic with no
	// head on disk may be lent, and reserveAsked the highest handed to
	// the log; shadowed holds the names a head may be on disk for while
	// their topic has none stored, which are lent nothing. All three are
	// guarded by the broker's mu (Seqs reserved on disk).
	reserve, reserveAsked uint64
	shadowed              map[string]bool
	// want has a shared log feed this broker the topics a filter covers
	// (b.pinTopic and subscribeWildcard call it), and forget undoes want
	// (SharedLog.Forget, from b.unpin and b.forgetIfIdle): no-ops on the
	// broker's own log.
	want, forget func(filter string)
}

// topicFeatures is what the features keep in a topic, guarded by its mu
// but where noted.
type topicFeatures struct {
	// reserved is the stored head, and lent the end of the seqs lent on
	// the store's reserve to a topic with no head on disk (0 once its
	// head is stored): no seq past the higher of the two is given out.
	// asked is the highest head handed to the log, on disk or not.
	// sealed is set at Shutdown: no seq is given out after it (Seqs
	// reserved on disk).
	reserved, asked, lent uint64
	sealed                bool
	// gone is set once the broker forgot the topic: whoever finds it so
	// looks the name up again (b.lockTopic). pins counts the subscriptions
	// that hold it, subscribed or on their way (Retention); it is guarded
	// by the broker's lock. reserving counts the publishers that wait
	// for its next seq's reservation, which hold it too (b.waitForSeq).
	gone      bool
	pins      int
	reserving int
	// bytes adds up the sizes in the topic's index, against MaxLogBytes
	// (Retention).
	bytes int
}

// connectionFeatures is what the features keep in a connection. The
// reader goroutine sets its fields; the timers, set once at auth, may
// then be reset or stopped from any goroutine, as time.Timer allows.
type connectionFeatures struct {
	// expiry closes the connection when the token runs out; a fresh auth
	// frame resets it. pings pings the peer an interval after each pong
	// (Keepalives, limits and batches). Both are set at auth.
	expiry, pings *time.Timer
	// loginFailed is set once a login on the connection failed (Logins
	// and passwords).
	loginFailed bool
	// limiter holds publishes to PublishRate (withinRate, a publish
	// rule); nil until the first publish, or with no cap.
	limiter *rate.Limiter
	// confirms carries QoS 1 confirms, in publish order, to the
	// confirmer (Confirms); nil until the first.
	confirms chan confirm
}

// FeatureOptions configure the features beyond the article's broker,
// each group of fields naming its section; Options embeds them, and the
// same rules hold: zero asks for the default, a negative is refused.
type FeatureOptions struct {
	// RetryBackoff (1 or more) multiplies AckTimeout at each retry, up
	// to MaxRetryDelay (Naks, backoff and expiry). Zero: 2, and a minute.
	RetryBackoff  float64
	MaxRetryDelay time.Duration
	// MaxSubscriptions caps the subscriptions one connection holds at
	// once; past it a subscribe is refused (Topic rules). Zero:
	// DefaultMaxSubscriptions, 1,000.
	MaxSubscriptions int
	// MaxTopics caps the topics the broker holds; past it a client's
	// publish or subscribe to a topic it does not hold is refused
	// (Retention). Zero: DefaultMaxTopics, 50,000.
	MaxTopics int
	// GroupWindow is how many unacked QoS 1 jobs one member of a group
	// may hold; the group offers more to the others (Work queues). Zero:
	// DefaultGroupWindow, 32.
	GroupWindow int
	// MaxDelayed and MaxDelayedBytes bound the delayed messages waiting
	// for one topic, and for one token's subject, in messages and in
	// bytes as Message.size counts them; past either a delayed publish is
	// refused (Delayed delivery). Zero: DefaultMaxDelayed, 10,000, and
	// DefaultMaxDelayedBytes, 64 MiB.
	MaxDelayed, MaxDelayedBytes int
	// OriginPatterns lists foreign origins allowed to open a WebSocket;
	// same-origin and non-browser clients are always allowed (Keepalives,
	// limits and batches, as the next three). Nil: none.
	OriginPatterns []string
	// MaxConnections caps open connections; more are refused with HTTP
	// 503 before the upgrade. Zero: no cap.
	MaxConnections int
	// PublishRate caps publishes per second per connection, with a burst
	// of one second's worth. Zero: no cap.
	PublishRate float64
	// PingInterval is how often each connection is pinged; one silent
	// until the next ping is closed. Zero: DefaultPingInterval, 20 s.
	PingInterval time.Duration
	// Issuer and Audience, when set, must match a token's iss and aud
	// (Tokens).
	Issuer, Audience string
	// Users may log in with a password (User, in Logins and passwords).
	Users map[string]User
	// LoginTokenTTL is how long a token from login is valid. Zero:
	// DefaultLoginTokenTTL, an hour.
	LoginTokenTTL time.Duration
	// OnEvent, if set, sees every x-ray event (those Counted counts only
	// while the x-ray is watched) and a "commit" event per batch synced,
	// for /metrics (The x-ray). It runs under the broker's locks: it must
	// only count.
	OnEvent func(wire.Event)
}

// Defaults for Options. A zero field in Options takes these values.
const (
	// DefaultAckTimeout is how long a QoS 1 delivery waits for its ack
	// before it is sent again: the original PopSub's five seconds.
	DefaultAckTimeout = 5 * time.Second
	// DefaultMaxRetries is how many times a delivery is retried after the
	// first attempt before it is dead-lettered: the original's five.
	DefaultMaxRetries = 5
	// DefaultRetryBackoff doubles the wait at each retry, as RabbitMQ's
	// and LavinMQ's delayed retries do by default: a subscriber that is
	// down is asked less and less often.
	DefaultRetryBackoff = 2
	// DefaultMaxRetryDelay caps that wait, so a retry comes at least once
	// a minute however many came before.
	DefaultMaxRetryDelay = time.Minute
	// DefaultMaxMessages is how many messages a topic's log keeps: enough
	// to cover a subscriber's reconnect, small enough to load at start.
	DefaultMaxMessages = 1000
	// DefaultMaxLogBytes bounds the same log in bytes: a thousand 512 KiB
	// messages would keep half a gigabyte on disk and in the file's
	// memory map, for one topic.
	DefaultMaxLogBytes = 64 << 20
	// DefaultTTL is how long a message stays in a topic's log.
	DefaultTTL = time.Hour
	// DefaultMaxFrameBytes caps one incoming frame after authentication.
	DefaultMaxFrameBytes = 1 << 20
	// DefaultOutboxBytes bounds the frames waiting for one connection's
	// writer. NATS lets a connection have 64 MB pending, centrifuge 1 MB
	// queued. Here a subscriber that fills its outbox loses nothing (it
	// reads on from the log), so the outbox need only keep the writer
	// busy: a full commit batch (maxQueueBytes) and change. A subscriber
	// that reads nothing costs at most this much.
	DefaultOutboxBytes = 4 << 20
	// DefaultMaxInflight is how many QoS 1 deliveries one connection may
	// owe acks for; more wait in the log until acks make room.
	DefaultMaxInflight = 1000
	// DefaultMaxInflightBytes bounds the same window in payload bytes:
	// a thousand deliveries of 512 KiB would otherwise pin 512 MiB.
	DefaultMaxInflightBytes = 16 << 20
	// DefaultMaxSubscriptions is how many subscriptions one connection
	// may hold: each costs the broker about 800 bytes with its topic, so
	// that a connection holds at most 800 KB of them, where 200,000 held
	// 160 MB. A client that watches more topics than that wants a
	// wildcard.
	DefaultMaxSubscriptions = 1000
	// DefaultMaxTopics is how many topics the broker holds at once. A
	// topic with a message costs the file a page of 4 KiB, a start a
	// read and a clean stop a write: without a cap, one connection
	// publishing to new names grew the file by 1.6 GB in 10 s, and the
	// clean stop of its 400,000 topics ran past the 20 s serve waits. At
	// the cap the file holds 226.5 MB and a clean stop takes seconds.
	DefaultMaxTopics = 50000
	// DefaultGroupWindow is how many QoS 1 jobs one member of a work
	// queue may hold unacked: a worker that acks within a millisecond
	// still does 32,000 jobs a second, and one that never acks holds 32
	// jobs an ack timeout, not its share of the queue.
	DefaultGroupWindow = 32
	// DefaultMaxDelayed and DefaultMaxDelayedBytes bound the delayed
	// messages waiting for one topic or one token, as a topic's log is
	// bounded: without them, a token publishing delayed messages as fast
	// as it can grows the disk by 4 GB a minute, and a broker restarted
	// on that takes 24 s to read it back. At the bounds a start reads 64
	// MiB more.
	DefaultMaxDelayed      = 10000
	DefaultMaxDelayedBytes = 64 << 20
	// DefaultWriteTimeout is how long one write to a socket may wait for
	// a peer that does not read before the peer is cut off: NATS's
	// write deadline. Shorter would cut off a phone on a slow network.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultAuthTimeout is how long a new connection has to authenticate.
	DefaultAuthTimeout = 5 * time.Second
	// DefaultPingInterval is how often the broker pings each connection.
	// A peer that misses one ping is closed, so a dead one is noticed
	// within two intervals, well before a NAT forgets the flow.
	DefaultPingInterval = 20 * time.Second
	// DefaultLoginTokenTTL is how long a token from login is valid.
	DefaultLoginTokenTTL = time.Hour
)

// ready returns a copy of o with every zero field set to its default,
// and what o.check (Keepalives, limits and batches) finds wrong with it.
func (o Options) ready() (Options, error) {
	// Options is a value, so the caller's copy keeps its zeros.
	o.AckTimeout = cmp.Or(o.AckTimeout, DefaultAckTimeout)
	o.MaxRetries = cmp.Or(o.MaxRetries, DefaultMaxRetries)
	o.RetryBackoff = cmp.Or(o.RetryBackoff, DefaultRetryBackoff)
	o.MaxRetryDelay = cmp.Or(o.MaxRetryDelay, DefaultMaxRetryDelay)
	o.MaxMessages = cmp.Or(o.MaxMessages, DefaultMaxMessages)
	o.MaxLogBytes = cmp.Or(o.MaxLogBytes, DefaultMaxLogBytes)
	o.TTL = cmp.Or(o.TTL, DefaultTTL)
	o.MaxFrameBytes = cmp.Or(o.MaxFrameBytes, DefaultMaxFrameBytes)
	o.OutboxBytes = cmp.Or(o.OutboxBytes, DefaultOutboxBytes)
	o.MaxInflight = cmp.Or(o.MaxInflight, DefaultMaxInflight)
	o.MaxInflightBytes = cmp.Or(o.MaxInflightBytes, DefaultMaxInflightBytes)
	o.MaxSubscriptions = cmp.Or(o.MaxSubscriptions, DefaultMaxSubscriptions)
	o.MaxTopics = cmp.Or(o.MaxTopics, DefaultMaxTopics)
	o.GroupWindow = cmp.Or(o.GroupWindow, DefaultGroupWindow)
	o.MaxDelayed = cmp.Or(o.MaxDelayed, DefaultMaxDelayed)
	o.MaxDelayedBytes = cmp.Or(o.MaxDelayedBytes, DefaultMaxDelayedBytes)
	o.WriteTimeout = cmp.Or(o.WriteTimeout, DefaultWriteTimeout)
	o.AuthTimeout = cmp.Or(o.AuthTimeout, DefaultAuthTimeout)
	o.PingInterval = cmp.Or(o.PingInterval, DefaultPingInterval)
	o.LoginTokenTTL = cmp.Or(o.LoginTokenTTL, DefaultLoginTokenTTL)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	return o, o.check()
}

// init puts the publish rules in the order they are asked: a token's
// grants (mayPublish, Topic rules), then room for a topic the broker does
// not hold (roomForTopic, Retention), then ttl_ms and a delay, and no
// publish to a $delayed log (times, Delayed delivery), then a payload's
// lines joined (oneLine, Keepalives, limits and batches), so that the
// bound on what waits (waitingRoom) counts the bytes it will keep, and
// last the publisher's rate (withinRate), so that a refused publish
// costs none of it; the subscribe rules; and the subscribe kinds, a
// wildcard's (which may have no group) first.
func init() {
	publishRules = append(publishRules, mayPublish, roomForTopic, times,
		oneLine, waitingRoom, withinRate)
	subscribeRules = append(subscribeRules, (*connection).subscribeProblem)
	subscribeKinds = append(subscribeKinds, subscribeWildcard, subscribeGroup)
}

// startFeatures readies the tables and starts the goroutines the
// features beyond the article's broker need, once the log is loaded: the
// hooks the first reading calls them by (b.leaf, each set to the
// function of its name); the x-ray, the broker's observer (events, The
// x-ray); the table of work queues (Work queues); the places of large
// frames (b.largeFrames, Keepalives, limits and batches); the password
// checks (b.startLogins, Logins and passwords); a shared log's hooks,
// and its feed of what any broker committed, to fan out here (b.feed,
// A log shared by several brokers), if the store is one; the signal
// that wakes the release loop sooner (Delayed delivery); and three loops
// of the broker's own, which end at Shutdown: the x-ray's publisher
// (b.publishEvent), the trim of what outlived the TTL (b.trimExpired,
// each tick of b.every, Retention) and the release of each delayed
// message when it falls due (b.releaseLoop).
func (b *Broker) startFeatures() {
	b.leaf = leaves{
		overCapacity:    b.overCapacity,
		acceptSocket:    b.acceptSocket,
		authenticate:    (*connection).authenticate,
		recoverPanic:    (*connection).recoverPanic,
		endSession:      (*connection).endSession,
		retain:          b.retain,
		pinTopic:        b.pinTopic,
		lockTopic:       b.lockTopic,
		letGo:           b.letGo,
		fanOutWildcards: b.fanOutWildcards,
		overtaken:       b.overtaken,
		waitForSeq:      b.waitForSeq,
		seal:            b.seal,
		retryDelay:      b.retryDelay,
		ackMany:         (*connection).ackMany,
	}
	b.xray = &events{xray.NewFeed(b.opts.OnEvent, b.logger)}
	b.groups = map[string]*group{}
	b.wildcards = map[*subscription]struct{}{}
	b.largeFrames = make(chan struct{},
		max(1, largeFramesBytes/b.opts.MaxFrameBytes))
	b.startLogins()
	b.want, b.forget = func(string) {}, func(string) {}
	if shared, ok := b.store.(SharedLog); ok {
		b.appendShared, b.want, b.forget = b.appendTo(shared), shared.Want,
			shared.Forget
		shared.Follow(b.feed)
	}
	b.delays.mu.Lock()
	b.delays.sooner = make(chan struct{}, 1)
	b.delays.mu.Unlock()
	b.loops.Add(3)
	go func() {
		defer b.loops.Done()
		b.xray.(*events).Run(b.stop, b.publishEvent)
	}()
	go b.every(min(max(b.opts.TTL/10, time.Millisecond), time.Minute),
		b.trimExpired)
	go b.releaseLoop()
}

// # Tokens (detail)
//
// A token is an HS256 JWT: the broker and whoever issues tokens share a
// secret, and nothing else is stored. Verify checks one and returns its
// Claims: who (sub), until when (exp), and which topics its holder may
// publish and subscribe to. A session lasts as long as its token: at its
// expiry the connection is closed (4003) unless a fresh auth frame came
// first, and a fresh token for the same subject takes its grants at
// once, ending any subscription they no longer allow. A client that can
// set headers may send its token with the upgrade (Authorization:
// Bearer) instead of an auth frame. Public keys (RS256) would let others
// verify tokens without being able to sign them, for a key distribution
// a small broker does not need.

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

// endSession stops the session's timers, if auth started them, so that
// neither keeps a departed connection alive until it fires.
func (c *connection) endSession() {
	if c.expiry != nil {
		c.expiry.Stop()
		c.pings.Stop()
	}
}

// tokenLeeway is the clock skew allowed on a token's exp.
const tokenLeeway = 5 * time.Second

// tokenExpired closes a connection whose token ran out without a fresh
// auth: a token_expired error frame, then the close marker, a nil frame,
// which the writer takes as a close with 4003. The writer sends them in
// that order, so the client reads why before the socket closes. It runs
// on the timer's goroutine.
func (c *connection) tokenExpired() {
	if c.closing.Swap(true) {
		return
	}
	c.reply(errorReply("token_expired", "token expired"))
	c.enqueue(nil)
}

// authenticate reads frames until a valid auth frame, and reports whether
// the session started (c.claims set, "authenticated" sent). Login frames
// may come first, to trade a password for a token; anything else, or
// nothing within AuthTimeout, closes c with 4001. Replies here are
// written directly: the writer has not started yet.
// The deadline is a timer, not a context: a cancelled Read drops the socket
// without a close frame, and the client deserves to hear 4001. c.authTimer
// starts it; c.login answers a login frame, pausing the timer while the
// broker hashes the password (both in Logins, a detail). A client that can
// set headers may send its token with the upgrade (Authorization: Bearer),
// as on every HTTP path; it is then answered as if its first frame had been
// auth. Anything but login and auth, even a malformed frame, ends the
// connection: a stranger gets no second chance to probe the protocol.
// c.refuse sends the error frame, then closes with 4001; c.writeNow writes a
// reply straight to the socket (both below).
func (c *connection) authenticate() bool {
	if c.bearer != "" {
		return c.accept(frame{Token: c.bearer})
	}
	deadline, stop := c.authTimer()
	defer stop()
	for {
		data, err := c.ws.Read()
		if err != nil {
			return false
		}
		f, problem := decodeFrame(data)
		switch {
		case problem.Type == "" && f.Type == "login":
			c.writeNow(c.login(f, deadline))
		case problem.Type == "" && f.Type == "auth":
			return c.accept(f)
		default:
			c.refuse("unauthenticated", "must authenticate first")
			return false
		}
	}
}

// accept checks the auth frame's token and, if it is good, starts the
// session: the subject, the grants, its timers, and frames up to
// MaxFrameBytes. It reports whether it did.
// c.broker.Verify checks the token (below); c.startTimers ends the session
// when the token runs out, plus the leeway Verify allowed, so that a token
// accepted is never closed at once, and pings the peer every interval
// (Keepalives, limits and batches).
func (c *connection) accept(f frame) bool {
	claims, err := c.broker.Verify(f.Token)
	if err != nil {
		// The parser's error says what was wrong, never the token.
		c.broker.logger.Info("auth failed", "remote", c.remote, "err", err)
		c.refuse("auth_failed", "authentication failed")
		return false
	}
	c.mu.Lock()
	c.subject, c.client = claims.Subject, f.Client
	c.mu.Unlock()
	c.claims, c.batch = claims, f.Batch
	c.ws.SetReadLimit(c.broker.opts.MaxFrameBytes)
	c.startTimers(claims)
	c.broker.logger.Info("connected", "sub", c.subject, "remote", c.remote)
	c.broker.xray.connection("connected", c, "")
	c.writeNow(reply{Type: "authenticated", Sub: c.subject, Conn: c.id})
	return true
}

// refuse writes an error frame and closes with 4001.
func (c *connection) refuse(code, text string) {
	// The error frame first, so the client learns why before the close.
	c.writeNow(errorReply(code, text))
	c.closeSocket(CloseAuthFailed, text)
}

// writeNow encodes r and writes it straight to the socket. Only used before
// the writer goroutine starts, so it races with nothing.
// A stranger who never reads the reply is bounded by the socket's write
// timeout (Socket), like every other write.
func (c *connection) writeNow(r reply) {
	data, _ := json.Marshal(r)
	c.ws.Send([][]byte{data}, false)
}

// init adds the auth frame of a session under way to the handlers.
func init() { handlers["auth"] = (*connection).reauthenticate }

// reauthenticate accepts a fresh token for the same subject, as the
// original allowed: the session is extended and takes the new grants at
// once. A subscription the new grants no longer allow ends at once,
// with an unsubscribed frame that says why: a refresh to fewer grants is
// how an application takes access away. A client refreshes its token
// this way before it expires, without reconnecting.
// A bad token, or another subject's, is refused and changes nothing: the
// session goes on with the token it has.
func (c *connection) reauthenticate(f frame) {
	// One identity a connection, or durable keys would mix.
	claims, err := c.broker.Verify(f.Token)
	if err != nil || claims.Subject != c.subject {
		c.reply(errorReply("auth_failed", "token refused (invalid, or "+
			"another subject's): the connection keeps its own"))
		return
	}
	c.claims = claims
	c.expiry.Reset(untilExpiry(claims))
	c.reply(reply{Type: "authenticated", Sub: c.subject, Conn: c.id})
	c.revokeBeyond(claims.Subscribe)
}

// revokeBeyond ends each of c's subscriptions that grants do not allow,
// telling the client which, and why.
func (c *connection) revokeBeyond(grants []string) {
	c.mu.Lock()
	var revoked []*subscription
	for filter, s := range c.subscriptions {
		if !Allowed(grants, filter) {
			revoked = append(revoked, s)
		}
	}
	c.mu.Unlock()
	for _, s := range revoked {
		c.dropSubscription(s)
		c.reply(reply{Type: "unsubscribed", Topic: s.filter,
			Reason: "the new token does not allow it"})
	}
}

// Verify checks a token (login.Verify says how: at most 4 KiB, HS256
// only, exp required, iss and aud when the broker is configured with
// them, and a sub).
func (b *Broker) Verify(token string) (*Claims, error) {
	claims := &Claims{}
	if err := login.Verify(token, claims, b.opts.Secret, b.opts.Issuer,
		b.opts.Audience, tokenLeeway); err != nil {
		return nil, err
	}
	return claims, nil
}

// Sign signs the claims with secret, HS256.
func (c Claims) Sign(secret []byte) (string, error) {
	return login.Sign(c, secret)
}

// UnmarshalJSON decodes claims, refusing an exp that is a string
// (login.Decode says why).
func (c *Claims) UnmarshalJSON(data []byte) error {
	type plain Claims // without this method, so no recursion
	return login.Decode(data, (*plain)(c))
}

// untilExpiry is how long a verified token has left, leeway included.
// The leeway is added to the date, not to the duration: time.Until saturates
// for an exp centuries away, and a sum would overflow and close the session
// at once.
func untilExpiry(claims *Claims) time.Duration {
	return time.Until(claims.ExpiresAt.Add(tokenLeeway))
}

// NewToken signs a token for subject sub that expires after ttl and may
// use every ordinary topic (Claims.Sign signs any claims, HS256).
func NewToken(secret []byte, sub string, ttl time.Duration) (string, error) {
	return Claims{RegisteredClaims: login.Registered(sub, "", "", ttl)}.
		Sign(secret)
}

// # Keepalives, limits and batches (detail)
//
// Once a client is in, the broker pings it every PingInterval, and a peer
// from which nothing came by the next ping is closed, so a client that
// vanished without a word does not hold its subscriptions, or its
// durable name, for ever (c.startTimers). Any frame answers, as the
// pong of a client flooding publishes is read only after them.
//
// Limits keep one client from taking more than its share: a cap on
// connections, refused before the upgrade; a publish rate per
// connection, a token bucket with a second's burst; a place among
// b.largeFrames for each frame over 64 KiB until it has been handled,
// because a thousand publishers of 1 MiB frames held gigabytes; and New
// refuses a negative limit, which would otherwise read as "none". A
// client may also opt into batches: several objects a frame, one per
// line, each way, so that a burst of publishes costs one frame and one
// system call; and one ack frame may ack many deliveries, a list of ids
// or all on a topic up to a seq (c.ackMany), a frame a burst, not one a
// delivery.
//
// The first reading also assumed a client that means well and a broker
// without bugs. Small defences cover the rest, each in one place rather
// than at every call. A panic on a connection's reader costs that client
// its connection and nobody else anything (recoverPanic). A token's exp
// that is a JSON string is refused, where the JWT library would take it
// (Claims.UnmarshalJSON): RFC 7519 makes it a number, and a client's
// mistake is not to be read as a date. And a frame that does not decode
// is answered in the protocol's words, "field seq must be a whole
// number, 0 or more", not Go's (wire.Explain).

// largeFramesBytes bounds the frames over 64 KiB read or handled at
// once, together.
const largeFramesBytes = 64 << 20

// overCapacity counts a new connection, and refuses it with HTTP 503 if
// it is one past MaxConnections, reporting true: refusing before the
// upgrade costs one HTTP response, not a socket and two goroutines.
func (b *Broker) overCapacity(w http.ResponseWriter) bool {
	if n := b.open.Add(1); b.opts.MaxConnections > 0 &&
		n > int64(b.opts.MaxConnections) {
		b.open.Add(-1)
		http.Error(w, "too many connections", http.StatusServiceUnavailable)
		return true
	}
	return false
}

// oneLine is a publish rule that refuses nothing: it compacts a payload
// that spans lines onto one, so that a batch splits on newlines.
func oneLine(_ *connection, m *Message, _ frame) reply {
	if bytes.ContainsAny(m.Payload, "\n\r") {
		var compact bytes.Buffer
		json.Compact(&compact, m.Payload)
		m.Payload = compact.Bytes()
	}
	return reply{}
}

// withinRate refuses a publish past PublishRate: a token bucket per
// connection, with a second's burst (golang.org/x/time/rate), made at
// the connection's first publish.
func withinRate(c *connection, _ *Message, f frame) reply {
	r := c.broker.opts.PublishRate
	if r <= 0 {
		return reply{}
	}
	if c.limiter == nil {
		c.limiter = rate.NewLimiter(rate.Limit(r), int(max(r, 1)))
	}
	if !c.limiter.Allow() {
		return topicError("rate_limited", "publishing too fast", f.Topic)
	}
	return reply{}
}

// ackMany settles the deliveries an ack frame names many at a time, and
// reports whether it named them so: a list in message_ids, or all on a
// topic up to "seq". Either saves a busy client a frame per delivery; up
// to seq is one binary search, as each topic's entries are in seq order.
// The frame's message_id, if it has one too, is the first reading's.
func (c *connection) ackMany(f frame) bool {
	upTo := f.Seq != nil && f.Topic != ""
	if len(f.MessageIDs) == 0 && !upTo {
		return false
	}
	c.mu.Lock()
	defer notify(c.room)
	defer c.mu.Unlock()

	// Up to seq: everything before the first entry past it.
	if q := c.unacked[f.Topic]; q != nil && upTo {
		live := q.Live()
		n := sort.Search(len(live), func(i int) bool {
			return live[i].message.Seq > *f.Seq
		})
		c.settle(q, 0, n, "acked")
	}
	// By id: on f.Topic, or on any, as one message_id is.
	for _, id := range f.MessageIDs {
		for _, p := range c.pendingOf(f.Topic, nil, id) {
			c.settleOne(p, "acked")
		}
	}
	return true
}

// check refuses, in options with their defaults, a missing Secret or
// Store, a RetryBackoff below 1, and a negative limit: MaxRetries is the
// one whose negative means something. Every number in Options is a
// limit, so a new one is checked without a line of its own.
func (o Options) check() error {
	switch {
	case len(o.Secret) == 0:
		return ErrNoSecret
	case o.Store == nil:
		return errors.New("popsub: Options.Store is required")
	case o.RetryBackoff < 1:
		return errors.New("popsub: Options.RetryBackoff is below 1")
	}
	// The fields of FeatureOptions too, as Options embeds them.
	for _, field := range reflect.VisibleFields(reflect.TypeFor[Options]()) {
		name, v := field.Name, reflect.ValueOf(o).FieldByIndex(field.Index)
		if name != "MaxRetries" && (v.CanInt() && v.Int() < 0 ||
			v.CanFloat() && v.Float() < 0) {
			return fmt.Errorf("popsub: Options.%s is negative", name)
		}
	}
	return nil
}

// startTimers starts a session's two timers: c.expiry ends it when the
// token runs out (c.tokenExpired), and c.pings pings the peer an interval
// after it authenticated and an interval after each answer (c.keepalive).
// A timer for each connection, not a loop for the broker, and no
// goroutine either until it fires: a loop that pinged every connection
// at once held, for a moment, ten thousand goroutines waiting for pongs
// and woke ten thousand readers for them, a third more memory per idle
// connection. So pings fall as their connections came.
func (c *connection) startTimers(claims *Claims) {
	c.expiry = time.AfterFunc(untilExpiry(claims), c.tokenExpired)
	// Made stopped, then started: c.pings is set before it can fire.
	c.pings = time.AfterFunc(1<<63-1, c.keepalive)
	c.pings.Reset(c.broker.opts.PingInterval)
}

// keepalive pings the peer, and closes the socket if no pong, nor any
// other frame, comes within one ping interval; else it sets the next
// ping. A peer that vanished without a FIN would otherwise hold its
// subscriptions, and its durable name, forever. The socket closes nothing
// on a ping timeout, so the broker does, without a close frame: a peer
// that does not read will not read it. A socket closed already answers
// at once, and sets no next ping.
func (c *connection) keepalive() {
	ctx, cancel := context.WithTimeout(context.Background(),
		c.broker.opts.PingInterval)
	defer cancel()
	if err := c.ws.Ping(ctx); err == nil {
		c.pings.Reset(c.broker.opts.PingInterval)
	} else if ctx.Err() != nil {
		c.broker.logger.Info("keepalive timeout", "sub", c.subject,
			"remote", c.remote)
		c.closeSocket(0, "")
	}
}

// recoverPanic logs a panic on the reader's goroutine and takes the
// connection apart, as net/http did when this ran inside the handler: a
// bug met by one client costs that client its connection, and every
// other client keeps theirs. It must be deferred directly.
func (c *connection) recoverPanic() {
	if v := recover(); v != nil {
		c.broker.logger.Error("panic serving a connection", "sub", c.subject,
			"remote", c.remote, "panic", v, "stack", string(debug.Stack()))
		c.broker.unregister(c)
	}
}

// # Logins and passwords (detail)
//
// The original let a client trade a username and a password for a token
// with a login frame, and PopSub keeps the frame. Passwords are stored
// as PBKDF2-SHA256 hashes (package login makes and checks them), slow on
// purpose: a quarter of a second of a core here. So guesses are rationed
// four ways:
//
//   - A wrong guess is answered late, a right password at once. The
//     answers to one user's or one address's failures leave one at a
//     time, each held twice as long as the one before, up to four
//     seconds, however many sockets ask (login.Throttle).
//   - A connection's first login is always hashed, and before the
//     guesses of connections that failed already: of those, one at a
//     time waits for a hash (login.Gate). So a user who logs in
//     while strangers guess her password, from her own address even,
//     waits for the hashes under way and one more, not for the flood.
//   - A further guess, on a connection that failed before, whose wrong
//     answer would leave after its auth timeout, behind the answers
//     still held for its address, is not hashed at all: nobody would
//     hear the answer.
//   - Hashes take turns, half the cores at most (login.Gate), so a
//     flood from many addresses costs the broker part of the machine,
//     never all of it. The time a hash takes is the broker's, not the
//     client's: the auth timeout stops while it runs.
//
// A lockout, or a delay before every attempt, was simpler, and let a
// stranger lock a user out with a few wrong passwords.

// User is an account that may log in with a password (login.User):
// PasswordHash is what login.Hash made of the password, and Publish and
// Subscribe are the grants of its tokens, nil for every ordinary topic.
type User = login.User

// authTimer starts the auth timeout (a login.Deadline, which a hash
// pauses) and returns it with the function that stops it: at its end
// the connection is closed with 4001. Only its reader touches it.
func (c *connection) authTimer() (*login.Deadline, func() bool) {
	d := login.NewDeadline(c.broker.opts.AuthTimeout, func() {
		c.end()
		c.closeSocket(CloseAuthFailed, "authentication timeout")
	})
	return d, d.Stop
}

// init adds the login frame, after auth, to the handlers.
func init() {
	handlers["login"] = func(c *connection, f frame) {
		c.reply(c.login(f, nil))
	}
}

// login answers a login frame with a token, as the original did.
// deadline is the connection's auth timeout, or nil once it has
// authenticated. b.logins.Login checks the password when the gate gives
// it a turn, and holds a wrong answer for its turn; a connection that
// ends meanwhile gets none.
func (c *connection) login(f frame, deadline *login.Deadline) reply {
	b := c.broker
	if len(b.opts.Users) == 0 {
		return errorReply("login_unavailable", "no users are configured")
	}
	user, ok := b.logins.Login(c.done, f.Username, f.Password, c.remote,
		&c.loginFailed, deadline)
	if !ok {
		b.logger.Info("login refused", "user", f.Username, "remote", c.remote)
		return errorReply("invalid_credentials", "invalid credentials")
	}
	token, err := b.loginToken(f.Username, user)
	if err != nil {
		return errorReply("internal", "could not sign a token")
	}
	return reply{Type: "login_response", Token: token}
}

// loginToken signs a token for a user who logged in, with the user's
// grants and the broker's issuer and audience, so Verify accepts it.
func (b *Broker) loginToken(name string, user User) (string, error) {
	return Claims{RegisteredClaims: login.Registered(name, b.opts.Issuer,
		b.opts.Audience, b.opts.LoginTokenTTL), Publish: user.Publish,
		Subscribe: user.Subscribe}.Sign(b.opts.Secret)
}

// startLogins sets up what logins need: a gate that lets half the cores
// hash at once, and checks unknown users against a hash as costly as
// the costliest user's (login.Dummy).
func (b *Broker) startLogins() {
	b.logins = login.NewGate(max(runtime.GOMAXPROCS(0)/2, 1), b.stop,
		b.opts.Users)
}

// # Topic rules (detail)
//
// Topic rules are MQTT's, because most readers already know them: levels
// separated by "/", "+" matches one level, "#" matches the rest and must
// come last, and a wildcard in the first level never matches a topic
// starting with "$", so that "#" does not drown a subscriber in the
// broker's own traffic. They are the protocol's, so package wire holds
// them for every client too: wire.ValidTopic and wire.ValidFilter say
// what is wrong with a name, and wire.Covers whether a filter covers
// another. The same matcher routes messages and checks permissions, so
// the two can never disagree about what a filter means.

// subscribeProblem checks a subscribe frame, from the cheapest check
// to the most specific, and returns the first failure's error frame, or
// a zero reply. wire.ValidFilter explains what is wrong with a filter,
// Allowed whether the token's grants cover it, and b.topicLimit whether
// the broker has room for an exact topic it does not hold.
func (c *connection) subscribeProblem(f frame) reply {
	switch {
	case wire.ValidFilter(f.Topic) != "":
		return topicError("invalid_topic", wire.ValidFilter(f.Topic), f.Topic)
	case f.After != nil && f.Last != nil || f.Durable != "" && f.Group != "":
		return topicError("bad_frame",
			"use after or last, and durable or group, not both", f.Topic)
	case !Allowed(c.claims.Subscribe, f.Topic):
		return topicError("forbidden", "token may not subscribe to "+
			f.Topic, f.Topic)
	case strings.ContainsRune(f.Durable+f.Group, 0) ||
		max(len(f.Durable), len(f.Group)) > 256:
		// A NUL separates a cursor key's parts, so no name may hold one.
		return topicError("bad_frame", "invalid durable or group name", f.Topic)
	case c.subscriptionsFull(f.Topic):
		return topicError("subscription_limit", fmt.Sprintf("this "+
			"connection holds %d subscriptions, the most "+
			"--max-subscriptions allows: unsubscribe from one first",
			c.broker.opts.MaxSubscriptions), f.Topic)
	case wire.IsWildcard(f.Topic) || strings.HasPrefix(f.Topic, "$"):
		return reply{} // no topic, or one of the broker's own (Retention)
	}
	return c.broker.topicLimit(f.Topic)
}

// subscriptionsFull reports whether c holds MaxSubscriptions
// subscriptions, none of them to filter, which a subscribe would replace.
func (c *connection) subscriptionsFull(filter string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, replaces := c.subscriptions[filter]
	return len(c.subscriptions) >= c.broker.opts.MaxSubscriptions && !replaces
}

// subscribeWildcard is a subscribe kind: a filter with + or #, which it
// subscribes to live only.
// It has no replay, so it is live at once and its reply carries no seq:
// there is no single head to report. b.want tells a shared log to feed this
// broker the filter's topics. The reply is queued and the filter registered
// under the lock fan-out reads the filters under: the client hears
// "subscribed" before any message of it, and gets every one published after.
// An outbox too full for the reply is one that no delivery fits either.
func subscribeWildcard(c *connection, f frame) bool {
	switch {
	case !wire.IsWildcard(f.Topic):
		return false
	case f.Durable != "" || f.Group != "" || f.After != nil || f.Last != nil:
		c.reply(topicError("bad_frame",
			"wildcard subscriptions are live only", f.Topic))
		return true
	}
	// Want before the subscription replaced, if any, lets go (b.want).
	c.broker.want(f.Topic)
	s := c.newSubscription(f.Topic, nil, "")
	data, _ := json.Marshal(reply{Type: "subscribed", Topic: f.Topic})
	c.broker.mu.Lock()
	queued := c.outbox.Push(data)
	c.broker.wildcards[s] = struct{}{}
	c.broker.mu.Unlock()
	if !queued {
		c.enqueue(data)
	}
	c.broker.xray.subscription("subscribed", s)
	return true
}

// fanOutWildcards offers m to every wildcard subscription that covers
// t, as fanOut does to t's own (wire.Covers(filter, topic) is the
// match). Wildcards live in one table, read-locked: subscribing to a
// filter is rare, publishing is not. A wildcard spans logs, so it has
// none to fall back on: without room, it is cut off, and one cut off
// gets nothing more.
func (b *Broker) fanOutWildcards(t *topic, m *Message, deadline time.Time,
	wake *wakeups) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for s := range b.wildcards {
		if wire.Covers(s.filter, t.name) && !s.conn.closing.Load() &&
			!s.conn.deliver(s, m, m.delivery, 1, deadline, wake) {
			s.conn.cutOff("no room for a wildcard's delivery " +
				"(acks owed, or the outbox full)")
		}
	}
}

// mayPublish is a publish rule: it refuses a topic c's token may not
// publish to.
func mayPublish(c *connection, _ *Message, f frame) reply {
	if !Allowed(c.claims.Publish, f.Topic) {
		return topicError("forbidden", "token may not publish to "+f.Topic,
			f.Topic)
	}
	return reply{}
}

// Allowed reports whether grants permit filter. No grants at all (nil)
// means every ordinary topic; $-topics always need an explicit grant.
func Allowed(grants []string, filter string) bool {
	if grants == nil {
		return !strings.HasPrefix(filter, "$")
	}
	return slices.ContainsFunc(grants, func(grant string) bool {
		return wire.Covers(grant, filter)
	})
}

// # Durable subscriptions (detail)
//
// A durable name ties a subscription to a cursor on disk, keyed by the
// token's subject, the name and the topic, so that a client can resume
// where it stopped, on another connection or after a restart. The cursor
// is the highest seq with everything up to it acked (or sent, for QoS 0):
// an ack out of order moves nothing until the gap below it closes, so a
// resumed subscription may see an acked message again, and never misses
// an unacked one. Cursor moves go through the log's committer, which
// keeps only the newest position per cursor: a thousand acks cost one
// write. One connection at a time owns a durable name: the newest claim
// wins, because the older one is most likely a connection that died
// without the broker noticing yet.

// durableCursor tracks how far a durable subscription has got. Its fields
// other than key are guarded by the connection's mu.
type durableCursor struct {
	// key is the token's sub, the durable name and the topic, separated
	// by NUL (which topics may not contain); immutable. A work queue's
	// members share their group's cursor (Work queues), so mu guards it
	// too, inside their connections' locks.
	key string
	mu  sync.Mutex
	// sent is the newest seq queued to the subscriber.
	sent uint64
	// unacked lists the QoS 1 seqs delivered and not yet acked, in
	// ascending order: its first element holds the cursor back.
	unacked []uint64
	// saved is the last position handed to the log.
	saved uint64
}

// newDurableCursor returns the cursor of subject's durable subscription
// name to filter.
func newDurableCursor(subject, name, filter string) *durableCursor {
	return &durableCursor{key: strings.Join([]string{subject, name, filter},
		"\x00")}
}

// releaseDurable gives s's durable name up, if s holds it. The caller
// holds b.mu.
func (b *Broker) releaseDurable(s *subscription) {
	if d, ok := s.cursor.(*durableCursor); ok && b.durables[d.key] == s {
		delete(b.durables, d.key)
	}
}

// resume claims s's durable name and points f.After at its stored
// cursor; a name never seen begins where f asks (firstCursor). It
// reports false if the store failed: then s is dropped and the client
// hears store_failed.
func (c *connection) resume(s *subscription, f *frame) bool {
	after, err := c.broker.claimDurable(s)
	if err != nil {
		c.dropSubscription(s)
		c.reply(topicError("store_failed", err.Error(), f.Topic))
		return false
	}
	if after == nil {
		after = c.broker.firstCursor(s, *f)
	}
	if after != nil {
		f.After, f.Last = after, nil
	}
	return true
}

// firstCursor saves the cursor of a durable name never seen, at once, at
// the seq its replay starts after, as f asks: resumed before its first
// delivery, the name would otherwise replay the whole log, what it was
// subscribed to skip too, and miss without a word what retention removed
// meanwhile. It returns the position, or nil when something f names is
// gone already, so that subscribeTopic finds the same and says so.
func (b *Broker) firstCursor(s *subscription, f frame) *uint64 {
	d, t := s.cursor.(*durableCursor), s.topic
	t.mu.Lock()
	start, recovered := t.startAfter(f.After, f.Last)
	t.mu.Unlock()
	s.conn.mu.Lock()
	d.begin(b, start)
	s.conn.mu.Unlock()
	if !recovered {
		return nil
	}
	return &start
}

// claimDurable makes s the owner of its durable name and returns the
// stored cursor, or nil for a name never seen.
// The cursor is read after the old owner is gone, so that its last acks are
// counted, and through the committer, which knows moves that have not
// reached the disk yet.
func (b *Broker) claimDurable(s *subscription) (*uint64, error) {
	// The newest claim wins: the older owner most likely died unnoticed.
	d := s.cursor.(*durableCursor)
	b.mu.Lock()
	old := b.durables[d.key]
	b.durables[d.key], b.cursored[s.topic.name] = s, true
	b.mu.Unlock()
	if old != nil {
		b.takeOver(old)
	}

	position, found, err := b.log.Cursor(d.key)
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
// Its unacked deliveries go with it; the new owner replays them from the
// cursor, which they hold back.
func (b *Broker) takeOver(old *subscription) {
	old.conn.dropSubscription(old)
	data, _ := json.Marshal(reply{Type: "unsubscribed", Topic: old.filter,
		Reason: "durable subscription taken over"})
	old.conn.outbox.Push(data)
}

// delivered notes m, just queued to the subscriber: the cursor moves
// past it at QoS 0, and waits for its ack at QoS 1. A durable
// subscription's deliveries come in seq order (replay, then live), so
// appending keeps unacked sorted.
func (d *durableCursor) delivered(b *Broker, m *Message) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent = m.Seq
	if m.QoS == 1 {
		d.unacked = append(d.unacked, m.Seq)
	}
	d.save(b)
}

// settled notes that seq was acked or dead-lettered. Acks mostly come in
// order, so the seq is usually first in unacked and the search stops at
// once.
func (d *durableCursor) settled(b *Broker, seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if at := slices.Index(d.unacked, seq); at >= 0 {
		d.unacked = slices.Delete(d.unacked, at, at+1)
	}
	d.save(b)
}

// deadID is the message_id of seq's dead letter: the same each time
// this cursor (a durable subscription's, or a work queue's) gives up on
// seq, so a dead letter made again, after a crash lost the cursor's move
// past it, is a duplicate that the $dead log stores once (its idempotent
// publish): a job reaches $dead once, restart or not.
func (d *durableCursor) deadID(seq uint64) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", d.key, seq))
	return fmt.Sprintf("dead-%x", sum[:16])
}

// begin places a cursor never stored at start, and stores it there at
// once: a durable name (firstCursor) or a group (b.prepareJoin) exists
// from its first subscribe, not from its first delivery. The caller
// holds what guards d's fields.
func (d *durableCursor) begin(b *Broker, start uint64) {
	d.sent, d.saved = start, start
	b.log.SaveCursor(d.key, start)
}

// save hands a durable cursor to the log if it moved. The position is
// the highest seq with everything up to it acked (or sent, for QoS 0):
// an ack out of order moves nothing until the gap below it closes, so a
// resumed subscription may see some acked messages again, never miss an
// unacked one. The caller holds d.mu.
func (d *durableCursor) save(b *Broker) {
	position := d.sent
	if len(d.unacked) > 0 {
		position = d.unacked[0] - 1
	}
	if position != d.saved {
		d.saved = position
		b.log.SaveCursor(d.key, position)
	}
}

// # Publishing from Go (detail)
//
// A program that embeds the broker publishes with Broker.Publish, with no
// socket: the same checks, sequencing and fan-out as a client's publish
// frame, and at QoS 1 a return once the message is on disk. A WebSocket
// to itself was the alternative, and would cost a process that only
// wants to publish an encoding and a goroutine per message. A program
// with clients of its own that no WebSocket can reach (the lab's, in a
// browser tab) hands the broker their sockets with WithSocket, which
// ServeHTTP serves as it would an upgraded one (b.acceptSocket).

// acceptSocket upgrades r to a WebSocket (socket.Accept), refusing a
// page from another site unless its origin is allowed, and runs
// beforeRead before each read of the socket; or it opens the socket r
// carries under socketKey (WithSocket, the lab's way in).
func (b *Broker) acceptSocket(w http.ResponseWriter, r *http.Request,
	beforeRead func()) (Socket, error) {
	opts := socket.Options{BeforeRead: beforeRead,
		OriginPatterns: b.opts.OriginPatterns, Stop: b.stop,
		WriteTimeout: b.opts.WriteTimeout, LargeFrames: b.largeFrames}
	if open, ok := r.Context().Value(socketKey{}).(func(
		socket.Options) Socket); ok {
		return open(opts), nil
	}
	conn, err := socket.Accept(w, r, opts)
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// socketKey is the request context's key for a socket kept another way.
type socketKey struct{}

// WithSocket returns r carrying a socket kept another way, which
// ServeHTTP serves in place of upgrading r: open makes it, given the
// options a WebSocket would be accepted with (acceptSocket).
func WithSocket(r *http.Request,
	open func(socket.Options) Socket) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), socketKey{}, open))
}

// Publish publishes payload to topic from inside the process, as a
// client's publish frame would, and returns the message's seq. For QoS 1
// it returns once the message is on disk (or ctx ends), as does any
// publish to a shared log, whose seq comes from the log.
func (b *Broker) Publish(ctx context.Context, topic string, payload any,
	qos int) (uint64, error) {
	// Validate as a client's: store nothing a client could not.
	raw, err := json.Marshal(payload)
	if err != nil {
		return 0, fmt.Errorf("publish: encode payload: %w", err)
	}
	m, problem := newMessage(frame{Topic: topic, Payload: raw, QoS: qos}, "")
	if problem.Type != "" {
		return 0, fmt.Errorf("publish: %s", problem.Message)
	}
	// After Shutdown no outcome comes back: ErrClosed.
	seq, _, stored := b.publish(m, ctx.Done(), nil)
	switch {
	case stored == nil:
		return 0, cmp.Or(ctx.Err(), ErrClosed)
	case qos == 0 && seq > 0:
		return seq, nil
	}
	select {
	case <-stored.Done():
		return max(seq, stored.Seq()), stored.Err()
	case <-ctx.Done():
		return seq, ctx.Err()
	}
}

// # Confirms (detail)
//
// A QoS 1 publisher hears "published" once its message is on disk. The
// reader must not wait for the disk itself: it would then read one
// publish per sync, and a connection could never have two in flight. So
// a confirmer goroutine, started on a connection's first QoS 1 publish,
// waits for each message's batch in publish order and queues its
// confirm once the batch is synced. A confirm is a reply, so it
// waits for room in the outbox; a publisher that never reads its confirms
// fills its outbox, then its confirm queue, and then its reader stops
// reading: it is pushed back like any publisher.
//
// The broker waits for its own dead letters the same way, on a goroutine
// for each: a delivery dead-lettered is done with, its durable cursor
// moved and the x-ray told, only once its letter is on disk. A letter
// the disk refused leaves the delivery pending, to be retried and
// dead-lettered again; moving the cursor first would lose the message
// to a crash between the two.

// confirm is a QoS 1 publish waiting for its batch to reach the disk.
type confirm struct {
	stored    *outcome // done once the batch holding the message is synced
	message   *Message // what was published
	seq       uint64   // its seq, or the first copy's for a duplicate
	duplicate bool     // the message_id was already in the log
}

// confirm queues the confirm of m, published as seq (a duplicate if
// so), for the connection's confirmer, starting it on first use; stored
// is done once m's batch is synced. Confirms leave in publish order, and
// many can wait on one sync. A connection that never publishes at QoS 1
// never pays for the goroutine.
func (c *connection) confirm(m *Message, seq uint64, duplicate bool,
	stored *outcome) {
	// Only the reader calls confirm: starting it lazily needs no lock.
	if c.confirms == nil {
		c.confirms = make(chan confirm, 256)
		go c.confirmLoop()
	}
	select {
	case c.confirms <- confirm{stored, m, seq, duplicate}:
	case <-c.done:
	}
}

// confirmLoop sends each confirm once its message is on disk. Confirms
// wait in order: a later publish's batch is never synced before an
// earlier one's, so none waits needlessly, and those one sync made ready
// reach the outbox before its writer wakes. It ends with the connection;
// confirms still waiting are then moot.
func (c *connection) confirmLoop() {
	for {
		var cf confirm
		select {
		case cf = <-c.confirms:
		case <-c.done:
			return
		}
		select {
		case <-cf.stored.Done():
		case <-c.done:
			return
		}
		if !c.enqueue(cf.answer()) {
			return
		}
	}
}

// answer is the reply a confirm sends: published, or store_failed. A
// shared log's answer brings the seq (see SharedLog).
func (cf confirm) answer() []byte {
	seq := max(cf.seq, cf.stored.Seq())
	r := reply{Type: "published", Topic: cf.message.Topic,
		MessageID: cf.message.ID, Seq: &seq,
		Duplicate: cf.duplicate || cf.stored.Duplicate()}
	if err := cf.stored.Err(); err != nil {
		r = errorReply("store_failed", "message not stored: "+err.Error())
		r.Topic, r.MessageID = cf.message.Topic, cf.message.ID
	}
	data, _ := json.Marshal(r)
	return data
}

// deadLetterStored waits, on a goroutine of its own, for p's dead letter
// to reach the disk: only then is the delivery done with. After a crash
// the cursor's id makes the letter made again a duplicate, stored and
// said once. A refused letter leaves the delivery pending.
func (b *Broker) deadLetterStored(p pending, c *connection, stored *outcome,
	duplicate bool) {
	go func() {
		<-stored.Done()
		if err := stored.Err(); err != nil {
			b.logger.Error("dead letter not stored", "topic", p.message.Topic,
				"seq", p.message.Seq, "err", err)
			c.keepPending(p)
			return
		}
		b.deadLettered(p, c, !duplicate && !stored.Duplicate())
	}()
}

// keepPending puts p back among c's pending deliveries, due after its
// backoff, unless its subscription ended.
func (c *connection) keepPending(p pending) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !p.subscription.ended() {
		p.deadline = time.Now().Add(c.broker.retryDelay(&p))
		c.addPending(p)
	}
}

// # The queues (detail)
//
// The broker keeps three queues, each appended to at the back and taken
// from at the front: each connection's outbox, its pending deliveries (a
// pendingQueue per topic), and each topic's index of retained messages.
// All must cost nothing for an idle connection or a quiet topic: a
// channel or a ring sized up front would cost its whole size for each of
// the ten thousand idle connections a small server may hold. So the
// outbox hands its array to the writer and takes the written one back,
// and gives it to a pool once drained; a fifo copies nothing as it is
// taken from the front, and one that stays about as long allocates
// nothing.

// # Work queues (detail)
//
// A subscribe frame with a group name makes the connection a member of
// that group on the topic: each message goes to one member, not to all,
// as NATS queue groups and MQTT's shared subscriptions do. The group
// reads the topic through a subscription of its own, g.sub, which replays
// and turns live as any does, so everything above holds for it: the
// hand-over, falling back to the log, retention. Where a plain
// subscription's receiver is its connection, g.sub's is the group, which
// offers each message to the members in turn, starting after the one that
// took the last message, and the first with room takes it. Round-robin
// among members with room, rather than least-loaded: it needs no count
// kept per member, and a member without room (its in-flight window is
// full because it does not ack) is skipped anyway, so the slow get less
// without anyone measuring them.
//
// The member that took a QoS 1 message owes its ack, at most GroupWindow
// of them (its subscription's window). Each member's subscription has the
// group as its sharing, which the first reading hands what the member
// will not finish: a retry goes to another member with room, as the next
// attempt. A member that leaves, or is cut off, hands its unacked
// deliveries to the others at once (b.letGo). The group keeps one
// cursor on disk, not one per member: the highest seq with everything up
// to it acked, by whichever member, as a durable subscription's. A
// cursor per member would have a restarted member redo what another
// acked. Groups need the broker's own log: on a shared log each broker
// would hand the same message to a member of its own.

// group is a work queue: one topic's messages shared by its members. It
// is its own subscription's receiver, and each member's sharing.
type group struct {
	broker *Broker
	// sub is the group's own subscription to the topic: its receiver is
	// the group, and it has no conn.
	sub *subscription
	// members are the member subscriptions, replaced whole under
	// broker.mu and read without a lock; turn is where the next offer
	// starts, after the member that took the last message.
	// joining counts subscriptions between their reply and their join,
	// under broker.mu: while any is, the group goes on with no members.
	members atomic.Pointer[[]*subscription]
	turn    atomic.Uint64
	joining int
	// kept are unacked deliveries that found no member, for the next to
	// join, under broker.mu (g.keep).
	kept []pending

	// cursor is the group's place in the log, which every member's
	// subscription shares as its durable cursor: deliveries and acks move
	// it as they move a durable subscription's. Its key is NUL, the
	// group's name, NUL, the topic, which no durable key can be (they
	// start with a token's subject).
	cursor durableCursor
}

// subscribeGroup is a subscribe kind: a frame with a group, which it
// answers. The reply is queued before s joins, so that it comes before
// any delivery.
func subscribeGroup(c *connection, f frame) bool {
	switch {
	case f.Group == "":
		return false
	case c.broker.appendShared != nil:
		c.reply(topicError("bad_frame",
			"groups need the broker's own log, not a shared one", f.Topic))
		return true
	}
	// A failed join joins too, and leaves at once: none left joining.
	s := c.newSubscription(f.Topic, c.broker.pinTopic(f.Topic), "")
	g, r, start, ok := c.broker.prepareJoin(s, f)
	c.reply(r)
	g.join(s, start)
	if !ok {
		c.dropSubscription(s)
		return true
	}
	c.broker.xray.subscription("subscribed", s)
	return true
}

// prepareJoin finds or starts s's group and returns it and the subscribed
// reply. A new group's subscription is registered, not live: it will
// start after the stored cursor, or where f asks (new messages only, by
// default), and start is where, or nil for a group already under way. A
// cursor that cannot be read makes the reply an error, and the last
// result false.
func (b *Broker) prepareJoin(s *subscription,
	f frame) (*group, reply, *uint64, bool) {
	t := s.topic
	key := strings.Join([]string{"", f.Group, t.name}, "\x00")
	b.mu.Lock()
	g, known := b.groups[key]
	if !known {
		g = &group{broker: b, cursor: durableCursor{key: key}}
		g.sub = &subscription{filter: t.name, topic: t, to: g,
			cancel: make(chan struct{})}
		t.pins++ // s's pin keeps t meanwhile
		g.members.Store(&[]*subscription{})
		b.groups[key], b.cursored[t.name] = g, true
	}
	g.joining++
	s.shares, s.cursor, s.window = g, &g.cursor, b.opts.GroupWindow
	b.mu.Unlock()

	// The cursor, read through the committer, wins over after and last.
	after, last, position, found, err := f.After, f.Last, uint64(0), false,
		error(nil)
	if !known {
		if position, found, err = b.log.Cursor(key); found {
			after, last = &position, nil
		} else if after == nil {
			last = cmp.Or(last, new(uint64))
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	head := t.head
	r := reply{Type: "subscribed", Topic: t.name, Seq: &head}
	if err != nil {
		return g, topicError("store_failed", err.Error(), t.name), nil, false
	}
	if known {
		return g, r, nil, true
	}
	start, recovered := t.startAfter(after, last)
	if !recovered {
		r.Recovered = &recovered
	}
	// Saved now: members all gone before a delivery resume here.
	g.cursor.begin(b, start)
	t.subscribers[g.sub] = struct{}{}
	return g, r, &start, true
}

// join makes s a member, and the first member starts g.sub at start.
// A subscription ended meanwhile leaves at once.
func (g *group) join(s *subscription, start *uint64) {
	g.broker.mu.Lock()
	members, kept := append(slices.Clone(g.list()), s), g.kept
	g.members.Store(&members)
	g.joining, g.kept = g.joining-1, nil
	g.broker.mu.Unlock()
	g.handOn(kept, nil)
	if start != nil {
		go g.sub.replay(g.broker, *start, false)
	}
	if s.ended() {
		g.leave(s)
	}
}

// list returns the group's members.
func (g *group) list() []*subscription { return *g.members.Load() }

// leave takes s out of its group. The last member's leaving, with nobody
// joining, ends g.sub; its cursor stays on disk for the next
// member.
func (g *group) leave(s *subscription) {
	b := g.broker
	b.mu.Lock()
	members := slices.DeleteFunc(slices.Clone(g.list()),
		func(m *subscription) bool { return m == s })
	g.members.Store(&members)
	last := len(members) == 0 && g.joining == 0 && b.groups[g.cursor.key] == g
	if last {
		delete(b.groups, g.cursor.key)
	}
	b.mu.Unlock()
	if last {
		g.sub.topic.mu.Lock()
		delete(g.sub.topic.subscribers, g.sub)
		g.sub.topic.mu.Unlock()
		close(g.sub.cancel)
		b.unpin(g.sub)
	}
}

// deliver queues m, for the group's own subscription s, to the first
// member with room, starting at g.turn, and reports whether one took it.
// wake is as for connection.deliver.
func (g *group) deliver(s *subscription, m *Message, delivery []byte,
	split int, deadline time.Time, wake *wakeups) bool {
	members, start := g.list(), g.turn.Load()
	for i := range uint64(len(members)) {
		member := members[(start+i)%uint64(len(members))]
		if member.conn.deliver(member, m, delivery, split, deadline, wake) {
			g.turn.Store(start + i + 1)
			return true
		}
	}
	return false
}

// roomMade is nil: g.sub's replayer polls the members for room.
func (g *group) roomMade() <-chan struct{} { return nil }

// cutOff cuts off the group's members.
func (g *group) cutOff(why string) {
	for _, member := range g.list() {
		member.conn.cutOff(why)
	}
}

// handOn gives each of list, as its next attempt, to another member than
// avoid with room, in turn, due for its retry after the backoff;
// the x-ray hears that it moved from the member that owed it. When none
// has room, the member whose turn it is takes it over its bounds: the
// deliveries moved were a departed member's, or avoid's, whose window
// they leave, so the group's memory stays within its members' windows
// together. With no member, the group keeps them for the next to join
// (g.keep): a group may live on with nobody in it while one is joining,
// and nothing else would send them.
func (g *group) handOn(list []pending, avoid *connection) {
	for i := 0; i < len(list); {
		p, members := list[i], g.list()
		if len(members) == 0 {
			if members = g.keep(list[i:]); len(members) == 0 {
				return
			}
		}
		g.broker.xray.message("moved", p.subscription.conn, p.message, &p)
		p.attempt++
		p.deadline = time.Now().Add(g.broker.retryDelay(&p))
		at := int(g.turn.Add(1)) % len(members)
		turn := append(slices.Clone(members[at:]), members[:at]...)
		// A member that took nothing had just left: try the others again.
		if slices.ContainsFunc(turn, func(s *subscription) bool {
			return s.conn != avoid && s.conn.assign(s, p, false)
		}) || turn[0].conn.assign(turn[0], p, true) {
			i++
		}
	}
}

// keep holds list for the next member to join if the group has none;
// if one joined meanwhile, it returns the members, to take them.
func (g *group) keep(list []pending) []*subscription {
	g.broker.mu.Lock()
	defer g.broker.mu.Unlock()
	if members := g.list(); len(members) > 0 {
		return members
	}
	g.kept = append(g.kept, list...)
	return nil
}

// assign queues p's message to member s as attempt p.attempt, if it has
// room or must take it anyway, makes the delivery s's to ack, and reports
// whether it did. Forced
// into a full outbox the frame is dropped, as a retry's is, and the
// retry timer sends it again.
func (c *connection) assign(s *subscription, p pending, must bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	delivery := appendDelivery(nil, p.message, p.attempt)
	if s.ended() || !must && !c.windowHas(s, p.message, 1) ||
		!c.outbox.Push(delivery) && !must {
		return false
	}
	p.subscription = s
	c.broker.xray.message("redelivered", c, p.message, c.addPending(p))
	return true
}

// # Naks, backoff and expiry (detail)
//
// The first reading's retry is an ack timeout and a number of tries.
// Three refinements change the table or the timer a little each.
//
// Backoff. A subscriber that is down, asked again at the same pace,
// would get every retry due at once when it came back: a retry storm.
// So each retry waits RetryBackoff times longer than the one before,
// AckTimeout × RetryBackoff^(attempt−1), up to MaxRetryDelay, less up to
// a fifth. That jitter spreads out retries that fell due together; it
// comes from the message's seq and attempt, not from a random source, so
// a run (and a test) repeats exactly.
//
// A negative ack. A subscriber that cannot handle a message yet says so
// with a nak, rather than wait out the ack timeout: the delivery is
// retried after delay_ms (in a group, to another member), and the retry
// counts as an attempt. A nak without delay_ms waits the backoff, never
// zero: a nak retried at once burns through the retries in milliseconds,
// as users of brokers without a delay found. "dead":true sends it to
// $dead/<topic> at once, with the nak's reason.
//
// Expiry. A publish with ttl_ms is delivered only until then: after it,
// the message is not delivered, replayed or retried, and a delivery still
// owed an ack goes to $dead with the reason "expired" when its retry
// falls due. The instant is a field of the message (expires_at), so it is
// in the log and survives a restart on either engine; an expired message
// stays in the log until retention takes it, as any other does.

// maxDelayMS is the longest delay_ms or ttl_ms: a year.
const maxDelayMS = 365 * 24 * 3600 * 1000

// retryDelay is how long p, at its attempt, waits for its ack before the
// next attempt: AckTimeout, times RetryBackoff for each attempt before,
// up to MaxRetryDelay, less a jitter of up to a fifth.
func (b *Broker) retryDelay(p *pending) time.Duration {
	wait := min(float64(b.opts.AckTimeout)*
		math.Pow(b.opts.RetryBackoff, float64(p.attempt-1)),
		float64(max(b.opts.MaxRetryDelay, b.opts.AckTimeout)))
	// Fibonacci hashing: neighbouring seqs far apart in [0, 1).
	mix := p.message.Seq*0x9E3779B97F4A7C15 +
		uint64(p.attempt)*0xBF58476D1CE4E5B9
	return time.Duration(wait * (1 - float64(mix>>11)/(1<<53)/5))
}

// init adds the nak frame to the handlers.
func init() { handlers["nak"] = (*connection).nak }

// nak answers a nak frame: the deliveries it names (by message_id, on
// any topic or on "topic", or by topic and seq) are retried after
// delay_ms or the backoff, or dead-lettered at once. It names what an
// ack would clear: every entry of the message, as the connection got it
// through each of its subscriptions. A nak for a delivery this
// connection does not owe is an error: the client believes it holds one
// it does not (acked already, dead-lettered, or never sent here).
func (c *connection) nak(f frame) {
	c.mu.Lock()
	naked := c.pendingOf(f.Topic, f.Seq, f.MessageID)
	code, problem := "", ""
	switch {
	case f.Seq != nil && f.Topic == "" || f.Seq == nil && f.MessageID == "":
		code, problem = "missing_field", "nak needs a message_id, or a topic "+
			"and a seq"
	case f.DelayMS != nil && (*f.DelayMS < 0 || *f.DelayMS > maxDelayMS ||
		f.Dead):
		code, problem = "invalid_delay", "delay_ms must be from 0 to "+
			"31536000000 (a year), and absent with \"dead\":true"
	case len(f.Reason) > maxMessageIDBytes:
		code, problem = "invalid_reason", "reason is longer than 256 bytes"
	case len(naked) == 0:
		code, problem = "not_pending", "no unacked delivery of it on this "+
			"connection: acked, dead-lettered, or never sent here"
	}
	if code != "" {
		c.mu.Unlock()
		c.reply(reply{Type: "error", Code: code, Message: problem,
			Topic: f.Topic, MessageID: f.MessageID})
		return
	}
	if f.Dead {
		for _, p := range naked {
			c.settleOne(p, "dead_lettered")
		}
		c.mu.Unlock()
		notify(c.room)
		for i := range naked {
			c.broker.deadLetter(naked[i], c, cmp.Or(f.Reason, "rejected"))
		}
		return
	}
	for _, p := range naked {
		q := c.unacked[p.message.Topic]
		at := &q.Live()[q.find(p)]
		at.deadline = time.Now().Add(c.broker.retryDelay(at))
		if f.DelayMS != nil {
			at.deadline = time.Now().Add(
				time.Duration(*f.DelayMS) * time.Millisecond)
		}
		c.retryBy(at.deadline)
		c.broker.xray.message("nakked", c, at.message, at)
	}
	c.mu.Unlock()
}

// # Delayed delivery (detail)
//
// A publish with delay_ms, or deliver_at (Unix ms), is confirmed once
// stored and delivered when due. It gets its seq when due, not when
// stored: a seq says everything before it was offered, and a message
// given seq 8 at publish and delivered after seq 20 would land behind
// durable cursors that had passed it, in a stretch of the log a replay
// had read already. Giving it its place at the end is what a client
// expects of a message that arrives later. So until then it waits in a
// log of its own, $delayed/<topic>, and the publisher's confirm names
// that topic and the seq there. It waits in the log, not in a timer in
// memory, so that a crash does not lose it: a restart reads it back with
// the rest of the log (loadTopics), due time and all.
//
// The broker keeps the waiting messages in a heap by due time, without
// their payloads, from when each record is on disk, and one goroutine
// sleeps until the earliest is due (b.releaseLoop): a message is sent
// within a millisecond or two of its time, or of its record's sync if
// that comes later, and messages not due cost no work until they are. A
// loop that looked every retry tick sent them up to a second late, and
// walked every waiting message each time. On bbolt they cost no memory
// either until they are near due: the store indexes them by due time and
// by message_id on disk, in the transactions that write and delete their
// records (a DueIndex), and the heap holds only what falls due within
// the next minute, at most 1,024 at a time, read from that index as the
// minute passes. A shared log keeps no such index: there the broker's
// heap holds them all, and the $delayed logs' index their ids, about
// 190 bytes each. The heap hands back those due at the same time in the
// order it got them: as a rule, the order their records synced. When one
// falls due, it is published to its topic, under its own message_id and
// publisher, with its deliver_at, which its deliveries carry. That
// message names its record in the $delayed log (Message.Releases), and
// the store deletes the record as it stores the message: in the same
// transaction, on the broker's own log, so that a crash or a restart can
// never send it twice; on a shared log right after, where the log's
// dedup of its message_id covers a crash between the two. Trimming the
// $delayed log from its front, as others are, left every message sent
// out of order behind one due later, to be sent again at the next start.
// A release reads its records a span of the log at a time (readSpan),
// not one by one: on a shared log each read is a round trip, and records
// published together sit side by side.
//
// What waits is bounded, by MaxDelayed messages and MaxDelayedBytes for
// each topic and for each token's subject: past either a delayed
// publish is refused with delayed_limit, which names the limit, and
// nothing already confirmed is touched. A broker that refuses a publish
// it cannot keep loses nothing; one that fills the disk loses
// everything. A delay is at most the log's TTL, and a $delayed log is
// not trimmed by the caps or the TTL, only by sending; once nothing
// waits in it, it is forgotten as an emptied topic is (Retention).
//
// On a shared log every broker that knows a $delayed log (its
// publisher's, and any started since) sends what fell due; the log's
// dedup keeps one copy, and a broker that finds the record gone forgets
// it. JetStream's own message schedules (NATS 2.12) would give the
// schedule a seq in the topic's stream: a gap in its seqs, which a
// subscriber would hear of as messages lost.

// DelayedPrefix names the log a delayed message waits in: $delayed/T.
// A shared log must keep such a log's messages until they are due.
const DelayedPrefix = "$delayed/"

// times is a publish rule: it sets m.ExpiresAt from f's ttl_ms (Naks,
// backoff and expiry) and, for a delayed publish, m.DeliverAt, moving m
// to wait in $delayed/<topic>; or it explains what is wrong with them. A
// ttl_ms of 0 or less has passed already: refused, not published to be
// dropped; a delayed message's counts from when it is due. A time
// already past is no delay. Only the broker writes to a $delayed log: a
// message put there by hand, even by a token granted it, would have no
// due time to be found by.
func times(c *connection, m *Message, f frame) reply {
	if strings.HasPrefix(f.Topic, DelayedPrefix) {
		return topicError("invalid_topic", "only the broker publishes to "+
			"$delayed/: give delay_ms or deliver_at instead", f.Topic)
	}
	if f.TTLMS == nil && f.DelayMS == nil && f.DeliverAt == nil {
		return reply{} // most publishes: no clock read
	}
	now := time.Now().UnixMilli()
	due := now + *cmp.Or(f.DelayMS, new(int64(0))) // or deliver_at:
	if f.DeliverAt != nil {
		due = *f.DeliverAt
	}
	problem := ""
	switch {
	case f.TTLMS != nil && (*f.TTLMS < 1 || *f.TTLMS > maxDelayMS):
		return topicError("invalid_ttl",
			"ttl_ms must be from 1 to 31536000000 (a year)", f.Topic)
	case f.DelayMS == nil && f.DeliverAt == nil:
	case f.DelayMS != nil && (f.DeliverAt != nil || *f.DelayMS < 0):
		problem = "give delay_ms, 0 or more, or deliver_at, not both"
	case due-now > c.broker.opts.TTL.Milliseconds():
		problem = "a delay may be at most the log's TTL, " +
			c.broker.opts.TTL.String()
	case f.QoS != 1:
		problem = "a delayed publish needs qos 1: it is confirmed once stored"
	}
	if problem != "" {
		return topicError("invalid_delay", problem, f.Topic)
	}
	if due > now {
		m.Topic, m.DeliverAt = DelayedPrefix+m.Topic, due
	}
	if f.TTLMS != nil {
		m.ExpiresAt = max(now, m.DeliverAt) + *f.TTLMS
	}
	return reply{}
}

// Releases names the record of the $delayed log that m was sent from
// when it fell due, or returns "" and 0: a Store that stores m deletes
// that record, in the same transaction if it can.
func (m *Message) Releases() (log string, seq uint64) {
	if m.released == 0 {
		return "", 0
	}
	return DelayedPrefix + m.Topic, m.released
}

// delays are the delayed messages waiting in the broker's $delayed logs,
// in a queue.Schedule by due time, and how many, and how many bytes,
// each $delayed log and each token has waiting. The zero value is
// empty: a restart schedules what it loads (on a DueIndex, nothing)
// before b.startFeatures makes sooner, and the release loop's first turn
// finds it, or reads it from the DueIndex.
type delays struct {
	// mu guards the fields below; nothing is locked under it.
	mu     sync.Mutex
	due    queue.Schedule[waiting]
	logs   map[*topic]load
	tokens map[string]load
	// sooner is signalled when none is due sooner than a new message: the
	// release loop sets its timer again. b.startFeatures makes it.
	sooner chan struct{}
	// disk is the store's DueIndex, or nil: then due holds every waiting
	// message from its sync until it is sent. With one, due holds those
	// due by horizon (Unix ms) alone, which the release loop moves on
	// (b.nearDue), and held marks them, so that a read of the disk that
	// finds one again adds nothing. b.loadTopics sets disk.
	disk    DueIndex
	horizon int64
	held    map[waiting]bool
}

// A DueIndex is a Store that keeps its $delayed logs' due times and
// message_ids on disk, written and deleted with their records, so that
// a delayed message costs the broker memory only once it is near due:
// package boltstore keeps one. On any other store (a shared log) the
// broker's own index and schedule hold what waits.
type DueIndex interface {
	// Due calls found for each record of a $delayed log due by until
	// (Unix ms), earliest first, at most n of them.
	Due(until int64, n int, found func(log string, seq uint64,
		at int64)) error
	// Waiting returns the seq of the record in $delayed log that
	// publisher sent with message_id id, if the log holds one.
	Waiting(log, publisher, id string) (uint64, bool, error)
}

// What the release loop reads of a DueIndex at a time: what falls due
// within lookAhead, at most lookAheadMax records. Variables, so that a
// test can make a minute a second, and the reads many.
var (
	lookAhead    = time.Minute
	lookAheadMax = 1024
)

// waiting is one delayed message: its $delayed log, and its seq there.
type waiting struct {
	log *topic
	seq uint64
}

// load is what waits for one topic or one token: messages, and bytes as
// Message.size counts them.
type load struct{ messages, bytes int }

// waitingRoom is a publish rule: it explains why m, a delayed publish,
// would pass a bound on what waits for its topic or its publisher, or
// returns a zero reply; a repeat of one waiting (b.recall) takes no
// room, and passes. Delayed publishes to one topic at the same moment
// may pass it by one each; on a shared log, those of brokers that have
// not yet heard of each other's, by what each has in flight (appendTo).
func waitingRoom(c *connection, m *Message, _ frame) reply {
	if m.DeliverAt == 0 {
		return reply{}
	}
	b := c.broker
	t := b.topic(m.Topic)
	if b.recall(t, m) {
		return reply{} // a repeat, which b.publish answers as one
	}
	b.delays.mu.Lock()
	topic, token := b.delays.logs[t], b.delays.tokens[m.publisher]
	b.delays.mu.Unlock()
	name := strings.TrimPrefix(m.Topic, DelayedPrefix)
	for what, l := range map[string]load{"topic " + name: topic,
		"token " + m.publisher: token} {
		switch {
		case l.messages >= b.opts.MaxDelayed:
			return topicError("delayed_limit", fmt.Sprintf("%s has %d "+
				"delayed messages waiting, the most --max-delayed allows",
				what, l.messages), name)
		case l.bytes+m.size() > b.opts.MaxDelayedBytes:
			return topicError("delayed_limit", fmt.Sprintf("%s has %d "+
				"bytes of delayed messages waiting, and --max-delayed-bytes "+
				"allows %d", what, l.bytes, b.opts.MaxDelayedBytes), name)
		}
	}
	return reply{}
}

// recall reports whether m, a delayed publish, repeats one waiting in
// its $delayed log t, which b.publish then answers as the repeat it is.
// t remembers the ids of what waits, or, on a DueIndex, of what is not
// on disk yet; one found on disk t remembers until it is sent. A repeat
// sent while its first copy's batch is being synced may miss both: it
// is stored again, and dropped when due as a repeat in its topic is.
// A record sent on between the first read and remembering its id would leave
// the id in t for good (b.unpark found nothing to forget): a second read,
// after it, finds the record gone, and the repeat is a new message then.
func (b *Broker) recall(t *topic, m *Message) bool {
	if m.ID == "" {
		return false
	}
	t.mu.Lock()
	_, known := t.ids[m.key()]
	t.mu.Unlock()
	if known || b.delays.disk == nil {
		return known
	}
	seq, ok, err := b.delays.disk.Waiting(t.name, m.publisher, m.ID)
	if err != nil || !ok {
		return false
	}
	t.mu.Lock()
	t.ids[m.key()] = seq
	t.mu.Unlock()
	_, ok, err = b.delays.disk.Waiting(t.name, m.publisher, m.ID)
	if !ok && err == nil {
		t.mu.Lock()
		t.forgetID(m.key(), seq)
		t.mu.Unlock()
	}
	return ok || err != nil
}

// park counts m, just stored in $delayed log t or loaded from it,
// against t and its token, and has it wait for its time once it is on
// disk. It reports whether the store's DueIndex keeps it: then t's index
// does not, and t remembers m's id only until m is on disk, where a
// repeat finds it (b.recall). The caller holds t.mu (or owns t).
// One just published waits for its batch's sync (b.onDisk), as its
// confirm does: sent on before its record was stored, it could reach
// subscribers and then be lost in a crash, confirmed to nobody.
func (b *Broker) park(t *topic, m *Message) bool {
	d := &b.delays
	d.count(t, m.publisher, 1, m.size())
	if t.synced() >= m.Seq {
		d.schedule(waiting{t, m.Seq}, m.DeliverAt)
	} else if d.disk != nil {
		t.ids[m.key()] = m.Seq
	}
	return d.disk != nil
}

// onDisk has msgs, just synced to $delayed log t, wait for their time;
// on a DueIndex t forgets their ids, which a repeat finds on disk now.
// The caller holds t.mu.
func (b *Broker) onDisk(t *topic, msgs []*Message) {
	for _, m := range msgs {
		if b.delays.disk != nil {
			t.forgetID(m.key(), m.Seq)
		}
		b.delays.schedule(waiting{t, m.Seq}, m.DeliverAt)
	}
}

// unpark takes m, which waited in $delayed log t on a DueIndex, off what
// t and its token have waiting, with any id t remembers for it: m was
// sent, or its batch failed. The caller holds t.mu.
func (b *Broker) unpark(t *topic, m *Message) {
	b.delays.count(t, m.publisher, -1, -m.size())
	t.forgetID(m.key(), m.Seq)
}

// schedule has w, on disk in its $delayed log, wait until due, in Unix
// ms, and wakes the release loop if none is due sooner. On a
// DueIndex, w is left on disk if it is due past the horizon, and held
// otherwise.
func (d *delays) schedule(w waiting, due int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hold(w, due)
}

// hold is schedule for a caller that holds d.mu.
func (d *delays) hold(w waiting, due int64) {
	if d.disk != nil {
		if due > d.horizon || d.held[w] {
			return
		}
		if d.held == nil {
			d.held = map[waiting]bool{}
		}
		d.held[w] = true
	}
	if d.due.Add(due, w) {
		notify(d.sooner)
	}
}

// count adds n messages of size bytes to what log and publisher have
// waiting.
func (d *delays) count(log *topic, publisher string, n, size int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tokens == nil {
		d.logs, d.tokens = map[*topic]load{}, map[string]load{}
	}
	tally(d.logs, log, n, size)
	tally(d.tokens, publisher, n, size)
}

// holds reports whether anything waits in log, a $delayed log: then it
// is not forgotten, even with its index empty, as on a DueIndex what
// waits may be on disk alone.
func (d *delays) holds(log *topic) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs[log].messages > 0
}

// tally adds n messages of size bytes to what loads[k] has waiting, and
// forgets k once it has none.
func tally[K comparable](loads map[K]load, k K, n, size int) {
	l := load{loads[k].messages + n, loads[k].bytes + size}
	if loads[k] = l; l.messages == 0 {
		delete(loads, k)
	}
}

// releaseLoop sends each delayed message when it falls due: it sleeps
// until the earliest is, or until one is scheduled sooner, and ends at
// Shutdown.
// A message scheduled before next while a turn releases (one retried a
// second later too) signals sooner, so next is read after the release.
// b.nearDue reads the DueIndex, if due may lack what it holds, and says when
// to read it again. With nothing due, nothing is made: each map made draws a
// random number, and a lab run replays only if it draws the same.
func (b *Broker) releaseLoop() {
	defer b.loops.Done()
	d := &b.delays
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-d.sooner:
		case <-b.stop:
			return
		}
		now := time.Now().UnixMilli()
		readAgain := b.nearDue(now)
		d.mu.Lock()
		due := d.due.Due(now)
		for _, w := range due {
			delete(d.held, w)
		}
		next, ok := d.due.Next()
		d.mu.Unlock()
		if len(due) > 0 {
			b.release(due)
		}
		if !ok {
			next = math.MaxInt64
		}
		wait := 24 * time.Hour
		if next = min(next, readAgain); next != math.MaxInt64 {
			wait = time.Until(time.UnixMilli(next))
		}
		timer.Reset(wait)
	}
}

// nearDue reads from the DueIndex what falls due by a new horizon,
// lookAhead from now, once due holds nothing by the last one: at most
// lookAheadMax records, the horizon stopping at the last found if there
// were more. It returns when to read again: at the horizon, or a second
// from now if the read failed or found only what due holds; never,
// without a DueIndex.
// Once the horizon moves, a batch synced with a message due by it schedules
// it: the read finds it, or it is held, or both. A full read of what due
// holds already (a thousand sends the log refused, retried a second later)
// would be read again at once: the next read waits that second.
func (b *Broker) nearDue(now int64) int64 {
	d := &b.delays
	if d.disk == nil {
		return math.MaxInt64
	}
	d.mu.Lock()
	if next, ok := d.due.Next(); ok && next <= d.horizon {
		defer d.mu.Unlock()
		return d.horizon
	}
	d.horizon = now + lookAhead.Milliseconds()
	until := d.horizon
	d.mu.Unlock()

	var found []waiting
	var at []int64
	err := d.disk.Due(until, lookAheadMax,
		func(log string, seq uint64, due int64) {
			found = append(found, waiting{b.topic(log), seq})
			at = append(at, due)
		})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		b.logger.Error("read the delayed messages due", "err", err)
		d.horizon = now - 1
		return now + time.Second.Milliseconds()
	}
	added := 0
	for i, w := range found {
		if !d.held[w] {
			added++
		}
		d.hold(w, at[i])
	}
	if len(found) == lookAheadMax {
		if d.horizon = at[len(at)-1]; added == 0 {
			return now + time.Second.Milliseconds()
		}
	}
	return d.horizon
}

// release publishes each of due to its topic, where it gets its seq
// now, and forgets those on disk there. One whose record the store
// failed to read, or whose publish the log refused, is tried again a
// second later; one whose record is gone (sent by another broker on a
// shared log) is forgotten.
func (b *Broker) release(due []waiting) {
	var sent []*outcome
	var sending, later []waiting
	// done maps each one sent or gone to its record (nil: gone).
	done, records := map[waiting]*Message{}, b.readDelayed(due)
	for _, w := range due {
		record, read := records[w]
		switch {
		case !read:
			later = append(later, w)
		case record == nil:
			done[w] = nil
		default:
			// A duplicate stores nothing to delete the record with.
			_, duplicate, stored := b.publish(copyToSend(w, record),
				b.stop, nil)
			if stored == nil {
				return // Shutdown: the record waits on disk
			}
			if duplicate {
				// Awaited, so that no later read of the log finds it.
				b.log.Delete(w.log.name, w.seq)
				stored = b.log.Barrier()
			}
			sent, sending = append(sent, stored), append(sending, w)
		}
	}
	for i, stored := range sent {
		w := sending[i]
		if <-stored.Done(); stored.Err() != nil {
			later = append(later, w)
		} else {
			done[w] = records[w]
		}
	}
	b.forgetDelayed(done)
	for _, w := range later {
		b.delays.schedule(w, time.Now().Add(time.Second).UnixMilli())
	}
}

// readSpan is how many seqs of a $delayed log one read of a release
// covers at most: due records published together sit side by side, and
// a release of a thousand is a few reads (a few round trips to a shared
// log), not a thousand.
const readSpan = 256

// readDelayed reads the records of due from their $delayed logs, a read
// for each run of one log's seqs within readSpan of its first. It maps
// each one read to its record, and each the log no longer has to nil;
// one the store failed to read is not in the map.
func (b *Broker) readDelayed(due []waiting) map[waiting]*Message {
	due = slices.SortedFunc(slices.Values(due), func(v, w waiting) int {
		return cmp.Or(strings.Compare(v.log.name, w.log.name),
			cmp.Compare(v.seq, w.seq))
	})
	records := map[waiting]*Message{}
	for i := 0; i < len(due); {
		first, j := due[i], i+1
		for j < len(due) && due[j].log == first.log &&
			due[j].seq < first.seq+readSpan {
			j++
		}
		msgs, err := b.store.Read(first.log.name, first.seq-1,
			int(due[j-1].seq-first.seq+1), maxQueueBytes)
		if err != nil {
			b.logger.Warn("read delayed messages due, to try in a second",
				"log", first.log.name, "seq", first.seq, "err", err)
			i = j
			continue
		}
		for _, m := range msgs {
			records[waiting{first.log, m.Seq}] = m
		}
		// Those the read spans but lacks are gone; a read cut short by
		// its bytes leaves the rest to the next.
		last := due[j-1].seq
		if len(msgs) > 0 && len(msgs) < int(last-first.seq+1) {
			last = msgs[len(msgs)-1].Seq
		}
		for ; i < j && due[i].seq <= last; i++ {
			if _, read := records[due[i]]; !read {
				records[due[i]] = nil
			}
		}
	}
	return records
}

// copyToSend is the message that w's record sends to its topic: a copy,
// as the store's own may be shared, that keeps its message_id,
// publisher, payload and times, and names its record.
func copyToSend(w waiting, record *Message) *Message {
	m := *record
	m.Topic = strings.TrimPrefix(w.log.name, DelayedPrefix)
	m.Seq, m.Timestamp, m.delivery = 0, 0, nil
	m.released = w.seq
	return &m
}

// forgetDelayed drops done, messages sent or gone, from what their
// $delayed logs and their tokens have waiting: on a DueIndex by their
// records (one gone has none: only a shared log, which keeps no
// DueIndex, loses one to another broker), otherwise from the logs'
// indexes, one pass over each.
func (b *Broker) forgetDelayed(done map[waiting]*Message) {
	logs := map[*topic]bool{}
	for w, record := range done {
		switch {
		case b.delays.disk == nil:
			logs[w.log] = true
		case record != nil:
			w.log.mu.Lock()
			b.unpark(w.log, record)
			w.log.mu.Unlock()
		}
	}
	for t := range logs {
		t.mu.Lock()
		b.drop(t, func(e entry) bool {
			_, listed := done[waiting{t, e.seq}]
			return listed
		})
		t.mu.Unlock()
	}
}

// # The x-ray (detail)
//
// The broker publishes its own transitions as events on $sys/events, so
// that the playground (or any client with a $sys grant) can watch
// messages being published, delivered, acked, retried and dead-lettered
// as they happen. The x-ray is the broker's observer (b.xray): it queues
// each event, and one goroutine publishes them, never the code that
// noticed them, which often holds a lock; a full queue drops events: the
// x-ray must never slow the broker it watches. Nothing is queued while
// nobody subscribes to a $sys topic, and no event is made about a $sys
// topic, so the feed cannot feed on itself. The event types live in
// package wire, which clients decode without the broker. Every
// transition the x-ray reports also goes to Options.OnEvent, watched or
// not, but the ones that come once a message or more, which the broker
// counts itself (Counted, through events.Count): the command counts them
// for /metrics, and so each observer call costs a branch when nobody
// listens, and a little more than an event's fields when someone does. A
// commit's size and time go to Options.OnEvent alone (events.Tell, in
// After a commit).

// EventsTopic is the topic the broker publishes its transitions on.
const EventsTopic = "$sys/events"

// events is the x-ray, the broker's observer (b.xray): a queue of events
// (package xray's Feed) that Emit adds to without blocking, dropping an
// event if it is full; Heard and Watched say whether anyone listens, and
// Run hands each event to b.publishEvent. Options.OnEvent hears every
// event, watched or not.
type events struct{ *xray.Feed }

// publishEvent publishes one x-ray event, for the feed's goroutine
// (b.xray, package xray). An event is an ordinary QoS 0 message: it is
// logged, retained and delivered like any other, and a watcher that
// falls behind reads on from the log.
func (b *Broker) publishEvent(e wire.Event) {
	payload, _ := json.Marshal(e)
	b.publish(&Message{Topic: EventsTopic, Payload: payload}, b.stop, nil)
}

// message emits a message's transition, seen from connection c (nil for
// published) and its pending entry p (nil for QoS 0). One that comes
// once a message or more (published, committed, delivered) is counted
// (x.Count reports which), and emitted only while someone watches the
// x-ray: an event per delivery, for /metrics to count, cost a busy
// broker 6 % of its CPU with ten subscribers; one per publish and per
// commit, 3 % with one.
func (x *events) message(kind string, c *connection, m *Message, p *pending) {
	// x.Count counts a counted kind first, watched or not.
	if x.Count(kind) && !x.Watched() || !x.Heard() {
		return
	}
	e := wire.Event{Kind: kind, Topic: m.Topic, Seq: m.Seq, MessageID: m.ID,
		QoS: m.QoS}
	if c != nil {
		e.Conn, e.Client, e.Sub = c.id, c.client, c.subject
	}
	if p != nil {
		e.Attempt, e.Deadline = p.attempt, p.deadline.UnixMilli()
	}
	x.Emit(e)
}

// connection emits a connection's transition. A connection that never
// authenticated was never announced, and leaves no event either.
func (x *events) connection(kind string, c *connection, reason string) {
	if c.subject == "" {
		return
	}
	x.Emit(wire.Event{Kind: kind, Conn: c.id, Client: c.client,
		Sub: c.subject, Reason: reason})
}

// subscription emits a subscription's transition, and keeps count of who
// watches $sys topics. A new watcher of EventsTopic gets a snapshot.
func (x *events) subscription(kind string, s *subscription) {
	c, system := s.conn, strings.HasPrefix(s.filter, "$sys/")
	switch {
	case system && kind == "unsubscribed":
		x.Watch(-1)
	case system:
		x.Watch(1)
		if s.filter == EventsTopic {
			x.Emit(wire.Event{Kind: "snapshot", State: c.broker.snapshot()})
		}
	default:
		x.Emit(wire.Event{Kind: kind, Conn: c.id, Client: c.client,
			Sub: c.subject, Topic: s.filter})
	}
}

// snapshot copies the broker's tables, one lock at a time. It is not one
// instant's picture: a message may be published between two topics'
// heads. The events that follow it correct whatever it missed, and a
// watcher needs no more than that.
func (b *Broker) snapshot() *wire.State {
	state := &wire.State{Topics: map[string]uint64{}}
	for _, t := range b.topicList() {
		if !strings.HasPrefix(t.name, "$sys/") {
			t.mu.Lock()
			state.Topics[t.name] = t.head
			t.mu.Unlock()
		}
	}
	for _, c := range b.connectionList() {
		if cs, ok := c.state(state); ok {
			state.Connections = append(state.Connections, cs)
		}
	}
	return state
}

// topicList snapshots the topics, so that each topic's lock can be taken
// in turn without holding the broker's across them.
func (b *Broker) topicList() []*topic {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Values(b.topics))
}

// state describes c and adds its pending entries to state, reporting
// false, with nothing added, if c has not authenticated.
func (c *connection) state(state *wire.State) (wire.ConnectionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subject == "" {
		return wire.ConnectionState{}, false
	}
	// An empty list, not nil: a client reads [] where JSON would say null.
	cs := wire.ConnectionState{Conn: c.id, Client: c.client, Sub: c.subject,
		Subscriptions: slices.AppendSeq([]string{}, maps.Keys(c.subscriptions))}
	for _, q := range c.unacked {
		for _, p := range q.Live() {
			m := p.message
			state.Pending = append(state.Pending, wire.Event{Kind: "pending",
				Conn: c.id, Client: c.client, Sub: c.subject, Topic: m.Topic,
				Seq: m.Seq, MessageID: m.ID, QoS: m.QoS, Attempt: p.attempt,
				Deadline: p.deadline.UnixMilli()})
		}
	}
	return cs, true
}

// Counted is how many messages the broker has given a seq, committed to
// its log, and queued to subscribers (first attempts), for monitoring.
func (b *Broker) Counted() (published, committed, delivered uint64) {
	return b.xray.(*events).Counted()
}

// OutboxBytes is how many bytes wait in every connection's outbox now,
// for monitoring.
func (b *Broker) OutboxBytes() int {
	total := 0
	for _, c := range b.connectionList() {
		total += c.outbox.Bytes()
	}
	return total
}

// # Retention (detail)
//
// A topic's log keeps at most MaxMessages messages and MaxLogBytes
// bytes, and none older than TTL. The broker keeps an index of each
// topic's retained messages without their payloads (topic.index, a
// queue of entries): it applies the caps to the index as each message
// arrives, and the TTL on a loop, and hands the log a trim to the seq
// the index now starts after, in the next batch. The index is also what
// recognises a publisher's repeated message_id, so an id is forgotten
// exactly when its message leaves the log. Counting in the store on
// every publish was simpler, and cost a read of the log per message. A
// subscriber reading from the log that a trim overtakes is told what it
// missed, with its next message (skipped).
//
// A topic is made on first use (b.topic), and forgotten once nothing
// holds it and its log is empty (b.forgetIfIdle): kept, every name
// anyone used once (a reply topic per request, a topic per reading)
// would stay in memory and in the file for good. Its seqs must still go
// on where they stopped, under a subscriber that resumes with after, so
// the store, a Forgetter, deletes the topic whole and keeps a floor, the
// highest head it forgot: a topic made again starts its seqs past the
// floor. Keeping each forgotten name's head was exact, and grew without
// bound; a subscriber that resumes on a topic made again hears
// recovered:false unless its after reaches the floor, as the broker no
// longer knows whether it missed something. So a topic a durable name or a
// group ever had a cursor on is never forgotten: its subscribers resume
// there by design, and such names are few. Each subscription pins its
// topic, from the look-up (b.pinTopic) to its end (b.unpin), and a
// publisher waiting for its seqs holds it (waitForSeq), so that no
// topic is forgotten while one is on its way in; a publisher that finds
// its topic forgotten looks it up again (b.lockTopic).
//
// Names cost the broker even so: a topic with a message is a page of the
// file while it lives, read at each start and written at each clean
// stop, and a client can make tens of thousands a second. So the broker
// holds at most MaxTopics, and refuses a client's publish or subscribe
// to a name it does not hold past that (b.topicLimit), until forgets make
// room. Its own topics ($dead/, $delayed/, $sys/), and a delayed
// message's topic at its release, are made past the cap, as each follows
// from a publish it took; so a subscribe to a "$" name, which waits for
// the broker's messages, passes, as a wildcard's does. A client's own
// publish to a "$" name, which only a grant allows, is held to the cap.
// The check reads a count, not the table, so that a publish to a topic
// the broker holds takes no lock for it; clients racing to new names may
// pass the cap by one each.

// A Forgetter is a Store that can forget a topic whole: a batch's
// Forgets delete each topic's log and head, and raise the store's floor
// to the head the topic had. Package boltstore keeps one. On any other
// store (a shared log, whose seqs it gives) a topic that had a message
// stays, with its head.
type Forgetter interface {
	// Floor returns where a topic made again starts: the highest head
	// of a topic forgotten, or the reserve (Batch.Reserve) if higher.
	Floor() (uint64, error)
	// CursorKeys returns the key of every durable cursor stored: a
	// durable name's or a group's, which ends in its topic's name after
	// a zero byte.
	CursorKeys() ([]string, error)
}

// newTopic returns an empty topic called name whose seqs go on after
// head.
func newTopic(name string, head uint64) *topic {
	return &topic{name: name, head: head, ids: map[messageKey]uint64{},
		subscribers: map[*subscription]struct{}{}}
}

// topic returns the topic called name, creating it on first use. Most
// calls find it under the read lock; only a new topic takes the write
// lock, and checks again in case another goroutine made it meanwhile.
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
		t = newTopic(name, b.floor)
		b.topics[name] = t
		b.topicCount.Store(int64(len(b.topics)))
	}
	return t
}

// pinTopic returns the topic called name, made on first use, pinned for a
// subscription until b.letGo unpins it. A shared log catches up on
// the topic first (b.want), outside the lock, as it waits for the log.
func (b *Broker) pinTopic(name string) *topic {
	b.mu.Lock()
	t := b.topics[name]
	if t == nil {
		t = newTopic(name, b.floor)
		b.topics[name] = t
		b.topicCount.Store(int64(len(b.topics)))
	}
	t.pins++
	b.mu.Unlock()
	b.want(name)
	return t
}

// letGo is leaves.letGo: it gives s's durable name up, takes a work
// queue's member out of its group, whose other members take left at
// once, and unpins s.
func (b *Broker) letGo(s *subscription, left []pending) {
	b.mu.Lock()
	b.releaseDurable(s)
	b.mu.Unlock()
	if g, ok := s.shares.(*group); ok {
		g.leave(s)
		g.handOn(left, nil)
	}
	b.unpin(s)
}

// unpin lets go of s's hold on its topic t, and forgets t if nothing
// else holds it and its log is empty (b.forgetIfIdle). A wildcard
// subscription, which holds no topic, leaves the table of filters
// fan-out covers, and a shared log forgets its filter once nobody here
// wants it.
func (b *Broker) unpin(s *subscription) {
	t := s.topic
	if t == nil {
		b.mu.Lock()
		delete(b.wildcards, s)
		b.mu.Unlock()
		b.forget(s.filter)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	t.pins--
	b.forgetIfIdle(t)
}

// forgetIfIdle forgets t if nothing holds it (no subscription pins it, no
// publisher waits for its seqs), its log is empty and on disk, and no
// head of it is on its way to the store. If its head is on disk, or it
// was lent seqs (or, on a shared log, it had a message), the store
// forgets it too, raising its floor, and so does b.floor, where a topic
// made again starts; the name is shadowed till the forget is on disk, so
// that a topic made again meanwhile is lent nothing (b.lend). On a store
// that is no Forgetter (a shared log is none), or with a cursor on it,
// it stays; so does a $delayed log with a message waiting, which may
// wait on disk alone (b.delays.holds).
// A shared log stops feeding it (b.forget). The caller holds t.mu and
// the broker's lock.
func (b *Broker) forgetIfIdle(t *topic) {
	// asked == reserved: every head asked for was stored and heard of
	// (b.storedHeads), which then never meets the name of one forgotten.
	if t.pins > 0 || t.reserving > 0 || len(t.index.Live()) > 0 ||
		len(t.unsynced) > 0 || t.asked != t.reserved ||
		b.topics[t.name] != t || b.delays.holds(t) {
		return
	}
	if t.reserved > 0 || t.lent > 0 || b.appendShared != nil && t.head > 0 {
		if !b.forgets || b.cursored[t.name] {
			return
		}
		b.log.Forget(t.name, t.head)
		b.floor = max(b.floor, t.head)
		b.shadowed[t.name] = true
	}
	delete(b.topics, t.name)
	b.topicCount.Store(int64(len(b.topics)))
	t.gone = true
	b.forget(t.name)
}

// lockTopic is leaves.lockTopic, a publisher's and the shared log's
// feed's way in: a topic may be forgotten between the look-up and the
// lock (b.forgetIfIdle), and then it is looked up again.
func (b *Broker) lockTopic(name string) *topic {
	for {
		t := b.topic(name)
		t.mu.Lock()
		if !t.gone {
			return t
		}
		t.mu.Unlock()
	}
}

// topicLimit returns the error frame that refuses a client's publish or
// subscribe to name, a topic the broker does not hold, once it holds
// MaxTopics; otherwise a zero reply.
func (b *Broker) topicLimit(name string) reply {
	if b.topicCount.Load() < int64(b.opts.MaxTopics) {
		return reply{}
	}
	b.mu.RLock()
	_, held := b.topics[name]
	b.mu.RUnlock()
	if held {
		return reply{}
	}
	return topicError("topic_limit", fmt.Sprintf("the broker holds %d "+
		"topics, the most --max-topics allows: use one it holds",
		b.opts.MaxTopics), name)
}

// roomForTopic is the publish rule of b.topicLimit.
func roomForTopic(c *connection, m *Message, _ frame) reply {
	return c.broker.topicLimit(m.Topic)
}

// every calls work at each tick of interval until Shutdown: the TTL's
// trim, which may be a tenth of the TTL late, needs no timer of its own.
func (b *Broker) every(interval time.Duration, work func(now time.Time)) {
	defer b.loops.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			work(now)
		case <-b.stop:
			return
		}
	}
}

// remember adds m to t's index; a $delayed log's message b.park counts
// and has wait for its time, and leaves to the store's DueIndex if it
// keeps one (Delayed delivery). The caller holds t.mu (or owns t).
func (b *Broker) remember(t *topic, m *Message) {
	t.lastTime = max(t.lastTime, m.Timestamp)
	if strings.HasPrefix(t.name, DelayedPrefix) && b.park(t, m) {
		return
	}
	// Only QoS 1 ids: QoS 0 has no confirm to retry after.
	e := entry{seq: m.Seq, timestamp: m.Timestamp, size: m.size()}
	if m.QoS == 1 {
		e.key = m.key()
		t.ids[e.key] = m.Seq
	}
	t.index.Insert(len(t.index.Live()), e)
	t.bytes += e.size
}

// drop drops the entries of t's index that match, wherever they are,
// with their ids and their bytes, and a $delayed log's from what it and
// their tokens have waiting. The caller holds t.mu.
func (b *Broker) drop(t *topic, match func(entry) bool) {
	delayed := strings.HasPrefix(t.name, DelayedPrefix)
	t.index.Drop(func(e entry) bool {
		if !match(e) {
			return false
		}
		if t.unindexed(e); delayed {
			b.delays.count(t, e.key.publisher, -1, -e.size)
		}
		return true
	})
}

// unindexed forgets e's id and bytes, as e leaves t's index. The caller
// holds t.mu.
func (t *topic) unindexed(e entry) {
	t.forgetID(e.key, e.seq)
	t.bytes -= e.size
}

// forgetID forgets the id k if it still names seq: a later message may
// have reused it after seq's was trimmed or sent. The caller holds t.mu.
func (t *topic) forgetID(k messageKey, seq uint64) {
	if t.ids[k] == seq {
		delete(t.ids, k)
	}
}

// forget drops the oldest n entries of the index and returns the seq of
// the last one dropped, for the log to trim to. The caller holds t.mu.
// The index is a queue: dropping the front of a thousand entries on every
// publish copies nothing, where deleting them from a slice would move all
// the others each time.
func (t *topic) forget(n int) uint64 {
	gone := t.index.Live()[:n]
	for _, e := range gone {
		t.unindexed(e)
	}
	last := gone[n-1].seq
	t.index.Remove(0, n)
	return last
}

// retain adds m to t's index (b.remember), drops from it the oldest
// messages over MaxMessages or MaxLogBytes, and has the log trim them; a
// $delayed log's leave it only once sent, and one waits for its time
// (Delayed delivery). The caller holds t.mu.
func (b *Broker) retain(t *topic, m *Message) {
	b.remember(t, m)
	over := t.excess(b.opts.MaxMessages, b.opts.MaxLogBytes)
	if over > 0 && !strings.HasPrefix(t.name, DelayedPrefix) {
		b.log.Trim(t.name, t.forget(over))
	}
}

// excess is how many of the oldest messages must leave the index for it
// to keep at most maxMessages and maxBytes; the newest always stays. The
// caller holds t.mu.
func (t *topic) excess(maxMessages, maxBytes int) int {
	live, bytes := t.index.Live(), t.bytes
	n := max(len(live)-maxMessages, 0)
	for _, e := range live[:n] {
		bytes -= e.size
	}
	for ; n < len(live)-1 && bytes > maxBytes; n++ {
		bytes -= live[n].size
	}
	return n
}

// trimExpired trims from every topic the messages older than its TTL,
// and forgets a topic left empty and idle (b.forgetIfIdle); it runs ten
// times per TTL. The count cap is applied on append; time needs a clock,
// so the broker checks it here rather than waiting for someone to read
// the topic. Timestamps only grow within a topic, so the old ones are a
// prefix. A $delayed log's leave it only once sent; emptied, it is
// forgotten as any topic is, or each name that once had a delayed
// message would hold a place under MaxTopics for good.
func (b *Broker) trimExpired(now time.Time) {
	cutoff := now.Add(-b.opts.TTL).UnixMilli()
	for _, t := range b.topicList() {
		t.mu.Lock()
		live := t.index.Live() // in timestamp order: they only grow
		n := sort.Search(len(live), func(i int) bool {
			return live[i].timestamp >= cutoff
		})
		if strings.HasPrefix(t.name, DelayedPrefix) {
			n = 0 // its messages leave when sent, not with age
		} else if n > 0 {
			b.log.Trim(t.name, t.forget(n))
		}
		if n == len(live) {
			b.mu.Lock()
			b.forgetIfIdle(t)
			b.mu.Unlock()
		}
		t.mu.Unlock()
	}
}

// overtaken reports whether the log has dropped what comes after *from,
// and if so moves *from past it, and has s.skipped tell the subscriber,
// who had everything up to after. read is what a read after *from
// found, whose first seq may be past a gap. On the broker's own log a
// gap above the oldest message kept is not a loss (seqs skipped after a
// crash hold no message), and is not said; on a shared log, whose seqs
// are dense, every gap is one (A log shared by several brokers). A work
// queue's members hear each gap at once, so from the read's place; a
// subscriber hears it all with its next message.
func (b *Broker) overtaken(s *subscription, after uint64,
	from *uint64, read []*Message) bool {
	first := s.topic.firstKept()
	if b.appendShared != nil && len(read) > 0 && read[0].Seq > first {
		first = read[0].Seq
	}
	if *from+1 >= first {
		return false
	}
	if s.conn == nil {
		after = *from
	}
	s.skipped(b, after, first-1)
	*from = first - 1
	return true
}

// skipped tells s's subscriber that the messages after seq after, up
// to last, left the log before it had them, and how many it missed; the
// replay goes on after last. The frame goes out with the next message
// (s.notice, which c.push sends), and a later gap before that replaces
// it, so one frame says the whole gap whenever it was found. A work
// queue's members (a group's g.list, in Work queues) hear it at once.
func (s *subscription) skipped(b *Broker, after, last uint64) {
	b.logger.Warn("subscriber overtaken by the log", "topic", s.filter,
		"after", after, "last", last)
	r := reply{Type: "skipped", Topic: s.filter, Seq: &last,
		Missed: last - after}
	if s.conn != nil {
		notice, _ := json.Marshal(r)
		s.conn.mu.Lock()
		s.notice = notice
		s.conn.mu.Unlock()
		return
	}
	for _, member := range s.to.(*group).list() {
		member.conn.reply(r)
	}
}

// # Seqs reserved on disk (detail)
//
// The log's section says why a topic's stored head runs ahead of its
// newest seq: no seq past the block on disk leaves before the next block
// is on disk too. Here is how: each topic remembers the head on disk
// (reserved) and the one last handed to the log (asked). A publish that
// would pass reserved waits for the sync that raises it, which goes ahead
// of a flood queued beside it, as a confirm's does (b.log.Await: a new
// topic's first confirm waited for a megabyte of flood). A topic asks
// for its next block of 32,768 (reserveBlock) while 16,384 are left
// (reserveAhead), more than the queue can give out before the ask is
// synced. A block the store refuses is asked for again by the next
// publish, whose confirm (or Publish's error) says store_failed
// meanwhile.
//
// A new topic's first publish would wait for its first block's sync, and
// a client publishing to new names would get one name a sync, 2,500 to
// 2,900 a second here. So the store keeps one more reservation, the
// reserve: seqs it lends to a topic with no head on disk, up to the end
// of the topic's first block, while that block is on its way (b.lend).
// After a crash a topic made again starts past the reserve, as past the
// floor (Forgetter.Floor). Only the first new topic after a start, and
// one the reserve has fallen behind, waits for a sync. A name whose
// head may still be on disk (stored at 0, or its forget not yet synced)
// is lent nothing: after a crash it would start at that head. Any head
// of a topic stored later is past its first block, so past every seq it
// was lent.
//
// Shutdown seals every topic, writing its newest seq as its head, gives
// out no more, and sets the reserve back to b.floor, where this start's
// new topics began: a clean stop gives the unused seqs back, so that
// seqs go on from the last one. A start after a crash begins past what
// the crashed one lent, so its clean stop keeps that reserved.

// reserveAhead and reserveBlock size a topic's reservation of seqs: a
// topic asks for its next block once fewer than reserveAhead seqs are
// left, more than can be given out (the queue, twice) before the ask is
// on disk.
const (
	reserveAhead = 2 * maxQueueMessages
	reserveBlock = 2 * reserveAhead
)

// loadTopics rebuilds each stored topic's head and index at start. The
// stored head is where seqs go on: after a clean stop the newest seq,
// after a crash the end of the topic's reservation, past any seq that
// reached a subscriber and not the disk (see the log's section).
// b.remember adds each message to the index, and a Forgetter's floor is
// read (Retention).
func (b *Broker) loadTopics() error {
	// With a DueIndex, delayed messages stay on disk (Delayed delivery).
	b.delays.disk, _ = b.store.(DueIndex)
	// A Forgetter's floor is where a topic made again starts, and a
	// topic with a cursor is never forgotten (Retention).
	b.cursored = map[string]bool{}
	if f, ok := b.store.(Forgetter); ok {
		floor, err := f.Floor()
		keys, err2 := f.CursorKeys()
		if err = cmp.Or(err, err2); err != nil {
			return fmt.Errorf("load the floor and the cursors: %w", err)
		}
		b.floor, b.forgets = floor, true
		b.reserve, b.reserveAsked = floor, floor
		for _, key := range keys {
			b.cursored[key[strings.LastIndexByte(key, 0)+1:]] = true
		}
	}
	heads, err := b.store.Topics()
	if err != nil {
		return fmt.Errorf("load topics: %w", err)
	}
	b.shadowed = map[string]bool{}
	for name, head := range heads {
		t := newTopic(name, head)
		t.reserved, t.asked = head, head
		if head == 0 {
			b.shadowed[name] = true // its head is on disk, at 0
		}

		// Read in chunks: a smaller cap at restart leaves a longer log.
		for after := uint64(0); ; {
			msgs, err := b.store.Read(name, after, replayChunk, maxQueueBytes)
			if err != nil {
				return fmt.Errorf("load topic %q: %w", name, err)
			}
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				b.remember(t, m)
			}
			after = msgs[len(msgs)-1].Seq
		}
		b.topics[name] = t
	}
	b.topicCount.Store(int64(len(b.topics)))
	return nil
}

// waitForSeq returns once t's next seq is covered by its stored head,
// having asked the log for the next block if fewer than reserveAhead
// seqs are left. It releases t.mu while it waits for the sync, counted
// in t.reserving, so that t is not forgotten meanwhile. If done
// is closed first it reports false and a nil outcome: nothing happened;
// if the store refused the block, or Shutdown sealed t, false and a
// failed outcome. The caller holds t.mu.
func (b *Broker) waitForSeq(t *topic, done <-chan struct{}) (*outcome, bool) {
	for {
		b.askAhead(t)
		switch {
		case t.head < max(t.reserved, t.lent):
			return nil, true
		case t.sealed:
			return groupcommit.Failed(ErrClosed), false
		}
		stored := b.log.Await(t.name)
		t.reserving++
		t.mu.Unlock()
		select {
		case <-stored.Done():
		case <-done:
			stored = nil // nothing happened
		}
		t.mu.Lock()
		if t.reserving--; stored == nil {
			return nil, false
		}
		if stored.Err() != nil {
			return stored, false
		}
	}
}

// askAhead hands the log t's next block of seqs once fewer than
// reserveAhead are left of the last one asked for, unless Shutdown
// sealed t; at a topic's first ask, with no head on disk, it borrows on
// the reserve (b.lend). The caller holds t.mu.
func (b *Broker) askAhead(t *topic) {
	if t.asked < t.head+reserveAhead && !t.sealed {
		if t.reserved == 0 && t.lent == 0 {
			t.lent = b.lend(t)
		}
		t.asked = t.head + reserveBlock
		b.log.SetHead(t.name, t.asked)
	}
}

// lend returns the seq up to which t, which has no head on disk and has
// given out no seq (so its head is where it started), may give out seqs
// on the store's reserve, or 0 if none: not past t's first block, which
// any head of t stored later covers, and none to a shadowed name. It
// asks the log for more reserve while fewer than reserveAhead seqs are
// left past t's head, unless Shutdown began. The caller holds t.mu.
func (b *Broker) lend(t *topic) uint64 {
	if !b.forgets {
		return 0 // a shared log gives its own seqs
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserveAsked < t.head+reserveAhead && !b.closing {
		b.reserveAsked = t.head + reserveBlock
		b.log.Reserve(b.reserveAsked)
	}
	if b.shadowed[t.name] || b.reserve <= t.head {
		return 0
	}
	return min(b.reserve, t.head+reserveBlock)
}

// storedHeads tells the topics whose heads a batch carried how it went:
// a block on disk may be given out, and ends what was lent; one the
// store refused is asked for again by the next publish.
func (b *Broker) storedHeads(heads map[string]uint64, stored bool) {
	for name, head := range heads {
		t := b.topic(name)
		t.mu.Lock()
		if stored {
			t.reserved, t.lent = max(t.reserved, head), 0
		} else {
			t.asked = t.reserved
		}
		t.mu.Unlock()
	}
}

// storedReserve tells the broker how a batch's reserve and forgets
// went: a reserve on disk may be lent, one the store refused is asked
// for again; a name whose forget is on disk is no longer shadowed.
func (b *Broker) storedReserve(batch *Batch, stored bool) {
	if batch.Reserve == nil && len(batch.Forgets) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !stored {
		b.reserveAsked = b.reserve
		return
	}
	if batch.Reserve != nil {
		b.reserve = max(b.reserve, *batch.Reserve)
	}
	for name := range batch.Forgets {
		delete(b.shadowed, name)
	}
}

// seal gives back, at Shutdown, the seqs each topic reserved or was lent
// and did not give out: its stored head becomes its newest seq, no seq
// is given out after it, and the reserve goes back to b.floor, where
// this start's new topics began: past what an earlier start lent, if
// that one crashed.
func (b *Broker) seal() {
	for _, t := range b.topicList() {
		t.mu.Lock()
		t.sealed = true
		if t.asked > t.head || t.lent > 0 {
			b.log.SetHead(t.name, t.head)
		}
		t.mu.Unlock()
	}
	if b.forgets {
		b.mu.Lock()
		b.log.Reserve(b.floor)
		b.mu.Unlock()
	}
}

// # After a commit (detail)
//
// The committer (package groupcommit) gathers what is queued into one
// transaction and one sync, and calls b.committed after each, before the
// batch's confirms go out. Here the broker updates its tables: a synced
// batch's messages leave the topics' unsynced lists, a refused batch's
// leave the index too, and each topic hears whether its reserved head is
// on disk. Committing each message on its own cost a quiet broker two
// syncs a message, a third of its CPU at 1,000 messages a second.

// startLog starts b's committer over its store, with the queue's bounds
// and its linger, urgent for QoS 1. After each commit, and before its
// confirms go out, it calls b.committed.
func (b *Broker) startLog() *commitLog {
	return groupcommit.Start(groupcommit.Config[*Message]{Store: b.store,
		Size:        (*Message).size,
		Urgent:      func(m *Message) bool { return m.QoS == 1 },
		Topic:       func(m *Message) string { return m.Topic },
		MaxMessages: maxQueueMessages, MaxBytes: maxQueueBytes,
		Linger: commitLinger, Committed: b.committed}, ErrClosed)
}

// committed updates the broker's tables after the committer wrote batch,
// or failed to (err), in took.
func (b *Broker) committed(batch *Batch, took time.Duration, err error) {
	if err != nil {
		b.logger.Error("log commit", "err", err,
			"messages", len(batch.Messages))
		b.forgetFailed(batch.Messages)
	} else {
		b.markCommitted(batch.Messages)
	}
	b.storedHeads(batch.Heads, err == nil)
	b.storedReserve(batch, err == nil)
	e := wire.Event{Kind: "commit", Messages: len(batch.Messages),
		Micros: took.Microseconds()}
	if err != nil {
		e.Reason = err.Error()
	}
	b.xray.(*events).Tell(e)
}

// markCommitted drops a synced batch's messages from their topics'
// unsynced lists: replay reads them from the store now. Each topic's
// batches commit in seq order, so each message is the oldest its topic
// holds there. The list lets go of each (slices.Delete clears what it
// moves from), and what is left moves to the front, at most the log
// queue's 8,192 pointers: slicing past them would leave the array behind
// the list holding a quiet topic's last messages, payloads and frames,
// until an append outgrew it, which on a topic that stays quiet is
// never.
func (b *Broker) markCommitted(msgs []*Message) {
	// A run of one topic's messages takes its lock once.
	for run := 0; len(msgs) > 0; msgs = msgs[run:] {
		t := b.topic(msgs[0].Topic)
		for run = 1; run < len(msgs) && msgs[run].Topic == t.name; run++ {
		}
		t.mu.Lock()
		t.unsynced = slices.Delete(t.unsynced, 0, run)
		if strings.HasPrefix(t.name, DelayedPrefix) {
			b.onDisk(t, msgs[:run]) // each may fall due now
		}
		t.mu.Unlock()
		for _, m := range msgs[:run] {
			b.xray.message("committed", nil, m, nil)
		}
	}
}

// forgetFailed undoes the index entries of a batch the store refused, so
// that a publisher's retry is not mistaken for a duplicate, and drops
// them from the unsynced lists, so that replay does not wait for them.
// The seqs themselves are not given back, as later publishes may already
// hold the next ones: the log has a gap, which replay skips, and the
// publishers hear store_failed.
func (b *Broker) forgetFailed(msgs []*Message) {
	for _, m := range msgs {
		t := b.topic(m.Topic)
		t.mu.Lock()
		t.unsynced = slices.Delete(t.unsynced, 0, 1)
		b.drop(t, func(e entry) bool { return e.seq == m.Seq })
		if b.delays.disk != nil && strings.HasPrefix(t.name, DelayedPrefix) {
			b.unpark(t, m) // its index, the DueIndex, never had it
		}
		t.mu.Unlock()
	}
}

// # Messages at rest (detail)
//
// A store keeps each message as its delivery frame at attempt 1, which
// holds every field a subscriber sees, and its publisher beside it: one
// encoding serves the log and every subscriber, and RestoreMessage reads
// it back. Both engines use it; the broker never does.

// Frame is m's delivery frame at attempt 1, which holds every field of a
// Message: what a Store keeps, and RestoreMessage reads back.
func (m *Message) Frame() []byte {
	// A message the broker did not sequence has no frame yet.
	if m.delivery == nil {
		return appendDelivery(nil, m, 1)
	}
	return m.delivery
}

// Publisher is the token subject that published m: a SharedLog scopes
// its dedup of message_ids to it, and a Store keeps it with Frame.
func (m *Message) Publisher() string { return m.publisher }

// RestoreMessage reads back a message a Store kept: its Frame and its
// Publisher. The frame's type and attempt are ignored, and a record
// written before frames were stored, the Message's fields alone, reads
// the same. On an error, the message is not to be used.
func RestoreMessage(frame []byte, publisher string) (*Message, error) {
	m := &Message{publisher: publisher}
	return m, json.Unmarshal(frame, m)
}

// # A log shared by several brokers (detail)
//
// Several brokers behind one load balancer can share one log, such as
// NATS JetStream (jetstream). Then the log, not the broker,
// owns what must agree across them: each topic's order and seqs,
// retention, the dedup of a publisher's repeated message_id, and durable
// cursors. Each broker keeps what is about its own clients: their
// connections and outboxes, each subscriber's pending acks and retries,
// and an index of the topics it knows (no payloads) for replay to start
// from.
//
// So a publish on a shared log is not sequenced here: the broker hands
// it to the log and returns, and its QoS 1 confirm waits for the log's
// answer, which carries the seq. The log then feeds each broker that
// wants the topic (whose clients publish or subscribe to it), this one
// included, each committed message in seq order, and fan-out happens
// there, under the topic's lock, as for a local publish: replay, the
// hand-over to live and back-pressure work unchanged. The alternative,
// each broker sequencing and the log merging, would give two messages one
// seq. Delivering only what the log committed costs a round trip to it on
// every publish; the benchmark in docs/performance.md measures it.

// SharedLog is a Store that other brokers share: it gives out seqs and
// feeds each broker what it committed to the topics the broker wants
// (Want, called as a client subscribes). Read must return nothing past
// what it has fed, so that replay never runs ahead of fan-out. Commit
// still gets the cursor moves, and the messages of the broker's own
// $sys/ topics, which it sequences itself: those the log keeps for Read
// but need not share.
type SharedLog interface {
	Store
	// Append commits m to its topic's log and then calls done with its
	// seq, or the first copy's for a repeated QoS 1 message_id. It may
	// wait for room, not for the commit.
	Append(m *Message, done func(seq uint64, duplicate bool, err error))
	// Follow starts feeding, in seq order within each topic, what is
	// committed to the topics this broker wants, after the heads Topics
	// returned.
	Follow(feed func(*Message))
	// Want adds the topics filter covers to those fed. For an exact
	// topic it returns once the feed has caught up with the log.
	Want(filter string)
	// Forget undoes Want when nobody here wants filter any more: for a
	// topic, once the broker forgets it (b.forgetIfIdle), as it never had
	// a message; for a wildcard filter, once for each subscription that
	// wanted it, as it ends. For a topic it is called under the broker's
	// locks: it must not wait, nor call the broker.
	Forget(filter string)
}

// appendTo is b.appendShared on shared: it hands m to the log and
// returns the outcome its confirm waits on, which the log's answer fills
// in with the seq. A delayed message counts against what waits
// (waitingRoom) from here until that answer, which comes once the feed
// has brought it back and b.park counted it (unless the feed is slower
// than the log's bound on waiting for it): counted only there, a burst
// of delayed publishes would pass the bound by as many as the log had in
// flight. For the moment between the two it counts twice.
func (b *Broker) appendTo(shared SharedLog) func(*Message) *outcome {
	return func(m *Message) *outcome {
		f := groupcommit.NewOutcome()
		m.Timestamp = time.Now().UnixMilli()
		done := f.Resolve
		if strings.HasPrefix(m.Topic, DelayedPrefix) {
			t, size := b.topic(m.Topic), m.size()
			b.delays.count(t, m.publisher, 1, size)
			done = func(seq uint64, duplicate bool, err error) {
				b.delays.count(t, m.publisher, -1, -size)
				f.Resolve(seq, duplicate, err)
			}
		}
		shared.Append(m, done)
		return f
	}
}

// feed takes a message the shared log committed, from any broker, and
// fans it out. A seq it already has (fed again after a reconnect) is
// dropped. One past a gap means the log deleted messages before this
// broker had them: the subscribers missed them (b.missed).
func (b *Broker) feed(m *Message) {
	t := b.lockTopic(m.Topic)
	last := t.head
	if m.Seq > last {
		// The head first, as a publish here gives it: m is on the log.
		t.head = m.Seq
		m.delivery = appendDelivery(nil, m, 1)
		if m.Seq > last+1 {
			b.missed(t, last, m.Seq-1)
		}
		b.sequenced(t, m, nil)
		b.xray.message("committed", nil, m, nil)
	}
	t.mu.Unlock()
	// Logged once the topic's lock is let go, as a burst makes many gaps.
	if m.Seq > last+1 {
		b.logger.Warn("the shared log deleted messages before this broker "+
			"read them", "topic", t.name, "after", last, "last", m.Seq-1)
	}
}

// missed takes every subscriber of t off fan-out, as the log deleted
// the messages after last, up to seq, before this broker had them: a
// live subscription goes back to the log, where it finds the gap and is
// told what is gone (skipped), as any subscriber the log overtook. A
// wildcard that covers t has no single log to go back to, and needs
// none: it is told at once, in a skipped frame that names t and, as its
// filter, the wildcard, and goes on with the next message. Cutting it
// off told it less, and lost it what came while it subscribed again. One
// without room for the frame is cut off, as fan-out would cut it off.
// The caller holds t.mu.
func (b *Broker) missed(t *topic, last, seq uint64) {
	for s := range t.subscribers {
		if s.live {
			s.fallBehind(b, last)
		}
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for s := range b.wildcards {
		if !wire.Covers(s.filter, t.name) {
			continue
		}
		gap, _ := json.Marshal(reply{Type: "skipped", Topic: t.name,
			Seq: &seq, Missed: seq - last, Filter: s.filter})
		if !s.conn.outbox.Push(gap) {
			s.conn.cutOff("no room for a wildcard's skipped frame")
		}
	}
}
