// Package jetstream keeps PopSub's log in NATS JetStream, so that several
// `popsub serve` processes behind any load balancer share one log: the
// same topics, seqs, dedup and durable cursors, whichever broker a client
// reaches.
//
// # The contract
//
// It is a popsub.SharedLog, the Store contract popsub.go declares plus
// three methods: Append commits a message and answers with its seq (or
// the first copy's, for a repeated QoS 1 message_id) without waiting for
// the feed; Follow feeds the broker, in seq order per topic, what any
// broker committed to the topics it wants; Want adds a filter's topics,
// and for an exact topic returns once the feed has caught up, so that a
// subscriber's head is the log's. Read never runs ahead of the feed.
// popsub.go's section "A log shared by several brokers" says what the
// log owns and what each broker keeps.
//
// # What each trick buys
//
// Measured with go test -bench . ./jetstream and popsub bench --nats
// (docs/performance.md, "The shared log"):
//
//	trick                                   buys
//	a broker reads a topic in chunks        a start 9.5x faster (15.2 s to 1.6 s)
//	answers pipelined, a window per broker  no round trip waited per publish
//	a broker follows only the topics it     no broker pays for topics none
//	wants                                   of its clients use
//
// # Decisions
//
// A stream per topic, not subjects in one shared stream. PopSub promises
// dense seqs per topic (1, 2, 3, … with no gap but what retention
// deleted), and a JetStream stream's own sequence is exactly that. In a
// shared stream the seqs are the stream's, shared by every topic; a
// per-topic count would need each publish to carry the topic's next seq
// and JetStream's expected-last-subject-sequence check, so two brokers
// publishing to one topic would conflict and retry: a round trip lost per
// collision, and a broker that must know the head before it may publish.
// A stream per topic costs the server a little memory per topic (a
// stream's state and, replicated, a Raft group), which suits PopSub's
// scale: tens or hundreds of topics, not millions. Retention by count,
// bytes and age is each stream's own limits; the bytes one reserves its
// whole MaxBytes of the server's storage, so the topics a server holds
// are its max_file_store divided by MaxBytes (storageExceededCode).
//
// Topics are listed in a key-value bucket (stream name to topic name),
// which every broker watches: a topic created on one broker is known to
// the others at once, and a wildcard subscription there covers it.
// Topic names are mapped, never refused: letters, digits and '-' stay,
// any other byte becomes _XX in hex, and a name that would be too long
// becomes a hash, since the bucket keeps the real name.
//
// Idempotent publish is JetStream's Nats-Msg-Id, made from the publisher
// and its message_id (a hash, as an id may hold any character), with the
// dedup window as long as messages live. The publisher travels beside
// each message, in a header, so that a delayed message that any broker
// sends on when due keeps its own, and so its dedup.
//
// A delayed message waits in the stream of $delayed/<topic>, which has
// no count or size cap (the broker bounds what waits) and keeps each
// message twice the others' age; once sent to its topic it is deleted
// from there (Message.Releases), and JetStream's dedup covers a send
// repeated before the delete. JetStream's own message schedules are not
// used: the schedule would take a seq in the topic's stream, a gap
// PopSub would announce as lost messages. Durable cursors are a second
// bucket, keyed by the durable key in base64.
//
// Each broker follows only the topics it wants: those its clients
// publish to (a confirm waits for the broker's own feed) and those they
// subscribe to, exactly or through a wildcard filter, from the first
// time they do until the broker stops. A broker reads every topic's
// retained messages once, at start, for its index; following a topic it
// had not followed then feeds what came since, and a subscription waits
// for that catch-up, so that its head, "last" and "recovered" are the
// log's. The alternative, every broker following every topic, is simpler
// and costs each broker every message of every topic.
package jetstream

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/queue"
	"github.com/popsub/popsub/wire"
)

// Options configure a Log. Retention mirrors the broker's options of the
// same names, so that a topic's stream keeps what a broker's index does.
type Options struct {
	// URL is the NATS server to connect to, or several separated by
	// commas: nats://127.0.0.1:4222.
	URL string
	// Prefix names the streams and buckets: popsub_<topic>,
	// popsub_topics, popsub_cursors. Brokers with the same prefix share
	// a log; the default is "popsub".
	Prefix string
	// Replicas is how many NATS servers keep each stream and bucket: 1,
	// or 3 on a cluster, which survives losing one server.
	Replicas int
	// MaxMessages, MaxBytes and MaxAge bound each topic's log.
	MaxMessages int
	MaxBytes    int64
	MaxAge      time.Duration
	// Logger reports lost connections and consumers.
	Logger *slog.Logger
}

// Log is a popsub.SharedLog on NATS JetStream. Open one per broker.
type Log struct {
	opts    Options
	nc      *nats.Conn
	js      jetstream.JetStream
	topics  jetstream.KeyValue // stream key → topic name
	cursors jetstream.KeyValue // base64 durable key → position
	// acks carries each publish's future, in publish order, to ackLoop.
	acks chan pendingAck
	// stop ends the loops; loops waits for them.
	stop  chan struct{}
	loops sync.WaitGroup
	// background waits for the answers that wait for the feed, and the
	// deletes of sent records: Close lets go of NATS after them, so that
	// a broker stopped just after a send leaves no record to send again.
	background sync.WaitGroup
	// rewatch is signalled when the connection to NATS comes back: the
	// bucket's watch is made again at once (watchTopics).
	rewatch chan struct{}
	// feed is the broker's, from Follow.
	feed func(*popsub.Message)

	// mu guards the fields below, feed, and each stream's created,
	// wanted, following and starting.
	mu sync.Mutex
	// streams maps a topic to what this broker knows of its stream.
	streams map[string]*stream
	// filters are the wildcard filters this broker's clients subscribe
	// with, each with how many of their subscriptions want it (Want,
	// Forget); listed holds every topic the bucket lists, for a new
	// filter to find those it covers.
	filters map[string]int
	listed  map[string]bool
	// local keeps the broker's own topics ($sys/events), which it
	// sequences itself and commits here: they describe this broker's
	// connections, so they are not shared, and live in memory.
	local map[string][]*popsub.Message
	// closed is set by Close.
	closed bool
}

// stream is one topic's stream as this broker knows it.
type stream struct {
	// key names the topic in the bucket, name the stream, subject its
	// one subject.
	key, name, subject string
	// created is set once the stream is known to exist.
	created bool
	// fed is the newest seq fed to the broker; Read stops there, so
	// replay never runs ahead of fan-out. While anyone waits for it to
	// grow (waiters, under waitMu), fedMore is closed and replaced each
	// time it does.
	fed atomic.Uint64
	// feeding is the seq being fed now: the broker may act on it (a
	// delayed record it schedules may fall due) before fed reaches it.
	feeding atomic.Uint64
	waitMu  sync.Mutex
	waiters int
	fedMore chan struct{}
	// wanted is set once the broker wants the topic fed (Want, Append).
	// following is the consumer feeding it, once it follows; starting is
	// set while one is being made, so that there is only one, and
	// askedAgain once a follow came meanwhile (follow).
	wanted               bool
	following            jetstream.ConsumeContext
	starting, askedAgain bool
	// caughtUp is set once a Want has caught up with it.
	caughtUp atomic.Bool
	// creating counts the publishes making the stream (create): Forget
	// leaves a stream alone while one may be.
	creating int
}

// pendingAck is a publish waiting for JetStream's answer.
type pendingAck struct {
	future jetstream.PubAckFuture
	stream *stream
	done   func(seq uint64, duplicate bool, err error)
}

// requestTimeout bounds every request to JetStream that is not a publish;
// publishTimeout bounds a publish, as the broker's write timeout bounds
// a write.
const (
	requestTimeout = 5 * time.Second
	publishTimeout = popsub.DefaultWriteTimeout
)

// AnswerBound is how long a QoS 1 publish may wait for its answer,
// published or store_failed, however NATS fails: making its topic's
// stream (a request), waiting for room in the window of publishes in
// flight and then for JetStream's answer (a publish timeout each), and
// for this broker's feed (a request). protocol.md states it.
const AnswerBound = 2*requestTimeout + 2*publishTimeout

// Open connects to NATS, makes the two buckets if they are missing, and
// returns a Log ready for popsub.New.
func Open(opts Options) (*Log, error) {
	opts.Prefix = cmp.Or(opts.Prefix, "popsub")
	opts.Replicas = max(opts.Replicas, 1)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	rewatch := make(chan struct{}, 1)
	nc, err := connect(opts.URL, opts.Logger,
		func() { queue.Notify(rewatch) })
	if err != nil {
		return nil, err
	}
	// The window of publishes not answered yet is the broker's
	// back-pressure: past it, Append waits, and so does the publisher's
	// reader. An answer waits for this broker's feed (awaitFed), so the
	// window also bounds how far the log may run ahead of the feed: it is
	// kept well inside what the log retains, or a burst would have the
	// log delete messages before this broker fanned them out.
	window := min(4096, max(16, opts.MaxMessages/4))
	if opts.MaxMessages <= 0 {
		window = 4096
	}
	// While NATS is unreachable a publish is held, and answered with an
	// error after publishTimeout: its publisher hears store_failed, and
	// may send it again with the same message_id, which is safe.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(window),
		jetstream.WithPublishAsyncTimeout(publishTimeout))
	if err != nil {
		nc.Close()
		return nil, err
	}
	l := &Log{opts: opts, nc: nc, js: js, acks: make(chan pendingAck, window),
		stop: make(chan struct{}), rewatch: rewatch,
		streams: map[string]*stream{},
		local:   map[string][]*popsub.Message{}, listed: map[string]bool{},
		filters: map[string]int{}}
	if err := l.openBuckets(); err != nil {
		nc.Close()
		return nil, err
	}
	l.loops.Add(1)
	go l.ackLoop()
	return l, nil
}

// connect connects to NATS for good: it reconnects for as long as the
// broker runs, says so in the log, and calls reconnected each time.
func connect(url string, logger *slog.Logger,
	reconnected func()) (*nats.Conn, error) {
	// Never give up reconnecting, a quarter second apart: a broker whose
	// NATS restarts must come back to it, and its publishes wait (up to
	// AnswerBound) rather than fail while it does.
	nc, err := nats.Connect(url, nats.Name("popsub"),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: Close, which needs no word
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("nats reconnected", "url", nc.ConnectedUrl())
			reconnected()
		}))
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w (is a nats-server "+
			"with -js running there?)", url, err)
	}
	return nc, nil
}

// openBuckets makes or opens the topics and cursors buckets.
func (l *Log) openBuckets() error {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	// CreateOrUpdate, so that every broker may start first; a server
	// without JetStream gets the one error that says how to fix it.
	var err error
	for name, kv := range map[string]*jetstream.KeyValue{
		"topics": &l.topics, "cursors": &l.cursors} {
		err = whileForming(ctx, func() (err error) {
			*kv, err = l.js.CreateOrUpdateKeyValue(ctx,
				jetstream.KeyValueConfig{Bucket: l.opts.Prefix + "_" + name,
					Replicas: l.opts.Replicas, Storage: jetstream.FileStorage})
			return err
		})
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return fmt.Errorf("%s has no JetStream: start nats-server "+
				"with -js", l.opts.URL)
		}
		if err == nil { // the bucket answers reads
			err = l.untilAnswered(ctx, (*kv).Bucket(), func() error {
				_, err := (*kv).Get(ctx, "answering")
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					return nil
				}
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("jetstream bucket %s_%s: %w", l.opts.Prefix,
				name, err)
		}
	}
	return nil
}

// whileForming runs create until it succeeds, fails for another reason
// than a cluster still forming, or ctx ends. A cluster that has just
// elected its leader may not yet count every node as a peer, and refuses
// a replicated stream or bucket with "no suitable peers for placement"
// (err_code 10005) for a moment: a broker starting beside it, or a test
// on a loaded machine, met that.
func whileForming(ctx context.Context, create func() error) error {
	for {
		err := create()
		var api *jetstream.APIError
		if !errors.As(err, &api) || api.ErrorCode != noPeersCode {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// noPeersCode is JetStream's err_code for "no suitable peers for
// placement".
const noPeersCode = 10005

// storageExceededCode is JetStream's err_code for "insufficient storage
// resources available": a file stream with a MaxBytes reserves that much
// of the server's max_file_store (by default three quarters of the free
// disk) when it is made, so the topics that fit are that divided by
// MaxBytes, a hundred or so on a small disk with the default 64 MiB.
const storageExceededCode jetstream.ErrorCode = 10047

// untilAnswered calls ask until it hears something other than "no
// responders", 20 ms apart, for as long as ctx lasts, and logs once
// that a read of the stream or bucket called name waits. A stream or
// bucket just made, or one whose cluster is electing after a node went
// away, has nobody serving its reads for a moment: a broker that took
// that for an answer failed to start, or cut off a subscriber whose
// replay read then.
func (l *Log) untilAnswered(ctx context.Context, name string,
	ask func() error) error {
	for tries := 0; ; tries++ {
		err := ask()
		if !errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		if tries == 0 {
			l.opts.Logger.Info("nobody serves the reads; waiting", "of", name)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// streamKey maps a topic to a name valid as a stream name, a subject
// token and a bucket key: letters, digits and '-' stay, every other byte
// is _XX. A name longer than maxKey is a hash instead.
func streamKey(topic string) string {
	var b strings.Builder
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '-':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	if b.Len() > maxKey {
		sum := sha256.Sum256([]byte(topic))
		return "_H" + hex.EncodeToString(sum[:20])
	}
	return b.String()
}

// maxKey keeps a stream's name under the server's 255 bytes with room for
// a prefix: a stream is a folder on the server's disk.
const maxKey = 160

// stream returns what this broker knows of topic's stream.
func (l *Log) stream(topic string) *stream {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streamLocked(topic)
}

// streamLocked is stream, for a caller that holds l.mu.
func (l *Log) streamLocked(topic string) *stream {
	s := l.streams[topic]
	if s == nil {
		key := streamKey(topic)
		s = &stream{key: key, name: l.opts.Prefix + "_" + key,
			subject: l.opts.Prefix + ".t." + key,
			fedMore: make(chan struct{})}
		l.streams[topic] = s
	}
	return s
}

// ready returns topic's stream, and whether this broker has made it and
// follows it: a publish's usual case, in one look under the lock. When
// it has not, the stream counts the caller as creating it, until create
// returns.
func (l *Log) ready(topic string) (*stream, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streamLocked(topic)
	ready := s.created && s.following != nil
	if !ready {
		s.creating++
	}
	return s, ready
}

// create makes topic's stream if this broker has not seen it yet, then
// lists the topic in the bucket, where every broker learns of it. It
// ends what ready began: the caller no longer counts as creating s.
func (l *Log) create(topic string, s *stream) error {
	l.mu.Lock()
	created := s.created
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		s.creating--
		l.mu.Unlock()
	}()
	if created {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	// The stream keeps what a broker's index keeps: count, bytes and age
	// are the broker's retention options. The dedup window lasts as long
	// as a message does, as PopSub's own does; JetStream allows it no
	// longer than the stream's MaxAge.
	window := cmp.Or(l.opts.MaxAge, 2*time.Minute)
	config := jetstream.StreamConfig{
		Name: s.name, Subjects: []string{s.subject},
		MaxMsgs:  orMinusOne(int64(l.opts.MaxMessages)),
		MaxBytes: orMinusOne(l.opts.MaxBytes), MaxAge: l.opts.MaxAge,
		Duplicates: window, Discard: jetstream.DiscardOld,
		Replicas: l.opts.Replicas, Storage: jetstream.FileStorage,
		AllowDirect: true}
	// A $delayed/<topic> stream holds messages until they are due, at
	// most MaxAge after their publish: no count or size cap may drop one
	// before, and it keeps each twice that, so that a message due at the
	// last moment is still there when a broker sends it on.
	if strings.HasPrefix(topic, popsub.DelayedPrefix) {
		config.MaxMsgs, config.MaxBytes, config.MaxAge = -1, -1, 2*l.opts.MaxAge
	}
	err := whileForming(ctx, func() error {
		_, err := l.js.CreateOrUpdateStream(ctx, config)
		return err
	})
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == storageExceededCode {
		err = fmt.Errorf("%w: each topic's stream reserves its MaxBytes "+
			"(--max-log-bytes, %d) of NATS's storage; lower it, or raise "+
			"NATS's max_file_store", err, l.opts.MaxBytes)
	}
	if err != nil {
		return fmt.Errorf("create stream for %q: %w", topic, err)
	}
	if _, err := l.topics.Put(ctx, s.key, []byte(topic)); err != nil {
		return fmt.Errorf("list topic %q: %w", topic, err)
	}
	l.mu.Lock()
	s.created = true
	l.mu.Unlock()
	return nil
}

// orMinusOne is n, or -1 (JetStream's "no limit") when n is not positive.
func orMinusOne(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// Append publishes m to its topic's stream without waiting for the
// answer; ackLoop calls done with it. A QoS 1 message carries a
// Nats-Msg-Id, so the same publisher's repeat, on any broker, is a
// duplicate that JetStream answers with the first copy's seq.
func (l *Log) Append(m *popsub.Message,
	done func(seq uint64, duplicate bool, err error)) {
	if log, seq := m.Releases(); seq != 0 {
		done = l.deletingAfter(log, seq, done)
	}
	s, ready := l.ready(m.Topic)
	if !ready {
		if err := l.create(m.Topic, s); err != nil {
			done(0, false, err)
			return
		}
		l.want(m.Topic, s) // the confirm waits for this broker's feed
	}
	body, err := json.Marshal(m)
	if err != nil {
		done(0, false, err)
		return
	}
	msg := &nats.Msg{Subject: s.subject, Data: body,
		Header: nats.Header{publisherHeader: {m.Publisher()}}}
	var opts []jetstream.PublishOpt
	if m.QoS == 1 {
		opts = append(opts, jetstream.WithMsgID(msgID(m)))
	}
	// A full window waits up to a write timeout's worth, not the client
	// library's 200 ms: the publisher waits, as it would for the disk.
	opts = append(opts, jetstream.WithStallWait(publishTimeout))
	future, err := l.js.PublishMsgAsync(msg, opts...)
	if err != nil {
		done(0, false, err)
		return
	}
	select {
	case l.acks <- pendingAck{future, s, done}:
	case <-l.stop:
		done(0, false, popsub.ErrClosed)
	}
}

// deletingAfter returns done, which first deletes seq from log's stream
// once the message sent from it is stored (or was already: a
// duplicate). A delayed message's record is deleted after its send, not
// with it: JetStream has no transaction across two streams, and its
// dedup of the message_id keeps one copy if a broker sends it again
// before the delete. Any broker may delete it: one that finds it gone
// has nothing to do.
func (l *Log) deletingAfter(log string, seq uint64,
	done func(uint64, bool, error)) func(uint64, bool, error) {
	return func(sent uint64, duplicate bool, err error) {
		if err == nil {
			l.background.Go(func() { l.deleteSent(l.stream(log), seq) })
		}
		done(sent, duplicate, err)
	}
}

// deleteSent deletes seq, a sent message's record, from s's stream,
// and tries again until it is gone or the log closes. A record left
// behind is sent again by the next broker to start, and JetStream
// drops that copy as a duplicate only within the dedup window (MaxAge,
// or two minutes): a record whose delete failed once must not wait for
// a restart.
func (l *Log) deleteSent(s *stream, seq uint64) {
	if err := l.deleteMsg(s, seq); err != nil {
		l.deleteAgain(s, seq, err)
	}
}

// deleteAgain tries seq's delete again after err, waiting longer each
// time, from a tenth of a second up to a request's timeout, until it is
// gone or the log closes.
func (l *Log) deleteAgain(s *stream, seq uint64, err error) {
	for wait := time.Second / 10; err != nil; wait = min(2*wait,
		requestTimeout) {
		l.opts.Logger.Warn("delete a sent delayed message", "stream", s.name,
			"seq", seq, "err", err, "again_in", wait)
		select {
		case <-time.After(wait):
		case <-l.stop:
			return
		}
		err = l.deleteMsg(s, seq)
	}
}

// deleteMsg deletes seq from s's stream, or finds it gone already. It
// asks JetStream's API itself, in one request: the client library's
// Stream.DeleteMsg needs a Stream, which costs a STREAM.INFO first, and
// it does not tell "gone" from a failure.
func (l *Log) deleteMsg(s *stream, seq uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	request, _ := json.Marshal(map[string]any{"seq": seq, "no_erase": true})
	answer, err := l.nc.RequestWithContext(ctx,
		"$JS.API.STREAM.MSG.DELETE."+s.name, request)
	if err != nil {
		return err
	}
	var response struct {
		Success bool                `json:"success"`
		Error   *jetstream.APIError `json:"error"`
	}
	switch err := json.Unmarshal(answer.Data, &response); {
	case err != nil:
		return fmt.Errorf("delete answered %q: %w", answer.Data, err)
	case response.Success || gone(response.Error):
		return nil
	case response.Error != nil:
		return response.Error
	}
	return fmt.Errorf("delete answered %q", answer.Data)
}

// gone reports whether a delete failed because there was nothing to
// delete: the stream is gone (10059), or the message is (10037; or
// 10057, the code nats-server gives it, with the store's "no message
// found", or "stream store EOF" past the stream's end).
func gone(e *jetstream.APIError) bool {
	return e != nil && (e.ErrorCode == jetstream.JSErrCodeStreamNotFound ||
		e.ErrorCode == jetstream.JSErrCodeMessageNotFound ||
		strings.Contains(e.Description, "no message found") ||
		strings.Contains(e.Description, "stream store EOF"))
}

// msgID is m's Nats-Msg-Id: its publisher and message_id, hashed.
func msgID(m *popsub.Message) string {
	sum := sha256.Sum256([]byte(m.Publisher() + "\x00" + m.ID))
	return base64.RawURLEncoding.EncodeToString(sum[:18])
}

// ackLoop answers each Append in publish order, as its future resolves.
// One goroutine for all of them, rather than one per publish.
func (l *Log) ackLoop() {
	defer l.loops.Done()
	for {
		// Answers are taken in publish order: NATS answers one stream's
		// publishes in order, so waiting on the oldest future first holds
		// no later one back for long.
		var p pendingAck
		select {
		case p = <-l.acks:
		case <-l.stop:
			return
		}
		// The answer is the stream's seq, given to Append's caller once
		// this broker's own feed has had the message (answerWhenFed), or
		// the error, which a QoS 1 publisher hears as store_failed.
		select {
		case ack := <-p.future.Ok():
			l.answerWhenFed(p, ack)
		case err := <-p.future.Err():
			// A QoS 0 publisher hears nothing of it, so it is logged.
			l.opts.Logger.Warn("publish not stored", "stream", p.stream.name,
				"err", err)
			p.done(0, false, fmt.Errorf("jetstream: %w", err))
		case <-l.stop:
			answerNow(p)
			return
		}
	}
}

// answerWhenFed answers p once this broker has been fed its message,
// or after a request timeout: at once if it has been, or else on a
// goroutine of its own, so that one topic whose feed lags does not hold
// up the answers to every other (at most one goroutine per publish in
// flight, which the window bounds). The broker's confirmer still sends
// each connection's confirms in publish order.
func (l *Log) answerWhenFed(p pendingAck, ack *jetstream.PubAck) {
	if p.stream.fed.Load() >= ack.Sequence {
		p.done(ack.Sequence, ack.Duplicate, nil)
		return
	}
	l.background.Go(func() {
		l.awaitFed(p.stream, ack.Sequence)
		p.done(ack.Sequence, ack.Duplicate, nil)
	})
}

// advance records that the broker has been fed seq, and wakes whoever
// waits for it.
func (s *stream) advance(seq uint64) {
	s.fed.Store(seq)
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waiters > 0 {
		close(s.fedMore)
		s.fedMore = make(chan struct{})
	}
}

// awaitFed waits until this broker has been fed s up to seq, or for a
// request timeout at most. A publisher who hears "published" and then
// subscribes here must find its message in the replay, as on one
// broker: the confirm waits for the feed, which is usually there first.
func (l *Log) awaitFed(s *stream, seq uint64) {
	s.waitMu.Lock()
	s.waiters++
	s.waitMu.Unlock()
	defer func() {
		s.waitMu.Lock()
		s.waiters--
		s.waitMu.Unlock()
	}()
	timeout := time.NewTimer(requestTimeout)
	defer timeout.Stop()
	for {
		s.waitMu.Lock()
		more := s.fedMore
		s.waitMu.Unlock()
		if s.fed.Load() >= seq {
			return
		}
		select {
		case <-more:
		case <-timeout.C:
			l.opts.Logger.Warn("the feed did not catch up",
				"stream", s.name, "seq", seq)
			return
		case <-l.stop:
			return
		}
	}
}

// answerNow answers p without waiting: with JetStream's answer if it
// came, or ErrClosed, so that no confirm waits for ever.
func answerNow(p pendingAck) {
	select {
	case ack := <-p.future.Ok():
		p.done(ack.Sequence, ack.Duplicate, nil)
	default:
		p.done(0, false, popsub.ErrClosed)
	}
}

// Commit keeps a batch's cursor moves in the cursors bucket, and its
// messages, which only the broker's own topics send here, in memory; it
// deletes the single messages it names, and tries a failed delete again
// on a goroutine of its own (deleteAgain). Shared topics' messages come
// through Append, and their trims are each stream's own limits.
func (l *Log) Commit(batch *popsub.Batch) error {
	l.keepLocal(batch)
	for topic, seqs := range batch.Deletes {
		s := l.stream(topic)
		for _, seq := range seqs {
			if err := l.deleteMsg(s, seq); err != nil {
				l.background.Go(func() { l.deleteAgain(s, seq, err) })
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	for key, position := range batch.Cursors {
		value := binary.BigEndian.AppendUint64(nil, position)
		if _, err := l.cursors.Put(ctx, cursorKey(key), value); err != nil {
			return fmt.Errorf("save cursor: %w", err)
		}
	}
	return nil
}

// keepLocal appends a batch's messages to the local topics and applies
// its trims to them.
func (l *Log) keepLocal(batch *popsub.Batch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range batch.Messages {
		l.local[m.Topic] = append(l.local[m.Topic], m)
	}
	for topic, upTo := range batch.Trims {
		if kept, local := l.local[topic]; local {
			l.local[topic] = slices.DeleteFunc(kept,
				func(m *popsub.Message) bool { return m.Seq <= upTo })
		}
	}
}

// readLocal reads a local topic as Read does, and reports whether topic
// is one.
func (l *Log) readLocal(topic string, after uint64,
	limit int) ([]*popsub.Message, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept, ok := l.local[topic]
	if !ok {
		return nil, false
	}
	i, _ := slices.BinarySearchFunc(kept, after+1,
		func(m *popsub.Message, seq uint64) int { return cmp.Compare(m.Seq, seq) })
	return slices.Clone(kept[i:min(len(kept), i+limit)]), true
}

// cursorKey maps a durable key (subject, name and topic, split by NUL) to
// a bucket key.
func cursorKey(key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}

// Cursor returns a durable cursor's position, if one is stored. Like
// Read, it waits out a bucket with nobody serving its reads.
func (l *Log) Cursor(key string) (uint64, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var entry jetstream.KeyValueEntry
	err := l.untilAnswered(ctx, l.cursors.Bucket(), func() (err error) {
		entry, err = l.cursors.Get(ctx, cursorKey(key))
		return err
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read cursor: %w", err)
	}
	if len(entry.Value()) != 8 {
		return 0, false, nil
	}
	return binary.BigEndian.Uint64(entry.Value()), true, nil
}

// Topics returns every listed topic with its stream's last seq, and
// remembers those heads: Follow starts after them, and Read stops there
// until then.
func (l *Log) Topics() (map[string]uint64, error) {
	// Three requests' time: on a loaded machine, listing a bucket just
	// made on a cluster just formed may take longer than one, and a
	// broker that cannot list its topics does not start.
	ctx, cancel := context.WithTimeout(context.Background(), 3*requestTimeout)
	defer cancel()
	names, err := l.listTopics(ctx)
	if err != nil {
		return nil, err
	}
	// A topic's head is its stream's last seq: what was trimmed away
	// still counts, so seqs never start again.
	heads := map[string]uint64{}
	for _, topic := range names {
		s := l.stream(topic)
		info, err := l.js.Stream(ctx, s.name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // listed, then deleted by hand
		}
		if err != nil {
			return nil, fmt.Errorf("topic %q: %w", topic, err)
		}
		heads[topic] = info.CachedInfo().State.LastSeq
		s.fed.Store(heads[topic])
		l.mu.Lock()
		s.created = true
		l.mu.Unlock()
	}
	return heads, nil
}

// listTopics returns the topic names in the topics bucket.
func (l *Log) listTopics(ctx context.Context) ([]string, error) {
	keys, err := l.topics.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var names []string
	for key := range keys.Keys() {
		entry, err := l.topics.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("list topics: %w", err)
		}
		names = append(names, string(entry.Value()))
	}
	return names, nil
}

// Read returns up to limit messages of topic after seq, stopping at the
// newest seq fed to the broker. It is one batched direct get: JetStream
// answers with the messages one by one and then an end-of-batch status,
// so a replay chunk, or a topic's index at start, costs one round trip,
// not one per message (a hundred topics of a thousand messages took a
// broker 15 s to start that way), and the gaps retention leaves cost
// nothing. A stream with nobody serving direct gets for a moment (its
// cluster electing) is asked again until a request's timeout.
func (l *Log) Read(topic string, after uint64, limit,
	maxBytes int) ([]*popsub.Message, error) {
	if msgs, ok := l.readLocal(topic, after, limit); ok {
		return msgs, nil
	}
	s := l.stream(topic)
	// A message being fed is the broker's already, and what it does with
	// it may read it back before fed moves: a delayed record its feed
	// scheduled, falling due at once, was read as gone. A read that would
	// find nothing short of it waits for the feed rather than answer that
	// it is not there; one that finds messages before it returns them, as
	// a replay catching up does while the feed runs.
	if feeding := s.feeding.Load(); after >= s.fed.Load() &&
		after < feeding {
		l.awaitFed(s, feeding)
	}
	fed := s.fed.Load()
	if after >= fed || limit <= 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	request, _ := json.Marshal(map[string]any{"seq": after + 1,
		"batch": limit, "max_bytes": max(maxBytes, 1), "up_to_seq": fed})
	var msgs []*popsub.Message
	err := l.untilAnswered(ctx, s.name, func() (err error) {
		msgs, err = l.directGet(ctx, s, request, fed)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %q after %d: %w", topic, after, err)
	}
	return msgs, nil
}

// directGet sends one batched direct get of s and gathers the answers,
// skipping any past fed.
func (l *Log) directGet(ctx context.Context, s *stream, request []byte,
	fed uint64) ([]*popsub.Message, error) {
	answers, err := l.nc.SubscribeSync(l.nc.NewRespInbox())
	if err != nil {
		return nil, err
	}
	defer answers.Unsubscribe()
	err = l.nc.PublishRequest("$JS.API.DIRECT.GET."+s.name, answers.Subject,
		request)
	if err != nil {
		return nil, err
	}
	var msgs []*popsub.Message
	for {
		answer, err := answers.NextMsgWithContext(ctx)
		if err != nil {
			return nil, err
		}
		// The end of the batch, or "no messages" (404), is a status
		// with no body; every message has one.
		if len(answer.Data) == 0 && answer.Header.Get("Status") != "" {
			return msgs, nil
		}
		seq, _ := strconv.ParseUint(answer.Header.Get("Nats-Sequence"), 10,
			64)
		if seq > fed {
			continue // past the feed, which up_to_seq should have kept out
		}
		m, err := decode(answer.Data, answer.Header, seq)
		if err != nil {
			l.opts.Logger.Error("corrupt message skipped", "stream", s.name,
				"seq", seq, "err", err)
			continue
		}
		msgs = append(msgs, m)
	}
}

// publisherHeader keeps a message's publisher beside it: the broker
// scopes a message_id to its publisher, and a delayed message sent on
// when due must keep its own.
const publisherHeader = "Popsub-Publisher"

// decode turns a stream message back into PopSub's, with its seq.
func decode(data []byte, header nats.Header,
	seq uint64) (*popsub.Message, error) {
	m, err := popsub.RestoreMessage(data, header.Get(publisherHeader))
	if err != nil {
		return nil, err
	}
	m.Seq = seq
	return m, nil
}

// Follow keeps the broker's feed and starts watching the topics bucket;
// a topic is fed once the broker wants it (Want, Append), from the head
// Topics returned, or from its first message if it is new.
func (l *Log) Follow(feed func(*popsub.Message)) {
	l.mu.Lock()
	l.feed = feed
	l.mu.Unlock()
	l.loops.Add(1)
	go l.watchTopics()
}

// watchTopics learns each topic in the bucket, those there now and those
// added later, until Close, and follows those the broker wants.
func (l *Log) watchTopics() {
	defer l.loops.Done()
	// The watch ends with Close; a watch that fails (NATS away) is made
	// again a second later, and one the connection came back under at
	// once, and reports every listed topic again, which learn takes as it
	// took them the first time. Left to the client library, a watch that
	// NATS restarted under resumes only once it has missed its
	// heartbeats: for that long, seconds, a topic made on another broker
	// reached none of this broker's subscribers.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-l.stop
		cancel()
	}()
	for {
		watcher, err := l.topics.WatchAll(ctx)
		if err == nil && l.followUpdates(watcher) {
			continue
		}
		select {
		case <-l.stop:
			return
		case <-time.After(time.Second):
			if err != nil {
				l.opts.Logger.Warn("watch topics", "err", err)
			}
		}
	}
}

// followUpdates learns each topic a watcher reports, until it ends, or
// until the connection comes back: then it reports true, and the watch
// is to be made again. It stops the watcher.
func (l *Log) followUpdates(watcher jetstream.KeyWatcher) bool {
	defer watcher.Stop()
	for {
		select {
		case entry, ok := <-watcher.Updates():
			if !ok {
				return false
			}
			if entry == nil || entry.Operation() != jetstream.KeyValuePut {
				continue // the end of the initial values, or a delete
			}
			l.learn(string(entry.Value()))
		case <-l.rewatch:
			return true
		case <-l.stop:
			return false
		}
	}
}

// learn notes a listed topic, and follows it if a filter covers it or
// the broker wanted it before it existed.
func (l *Log) learn(topic string) {
	l.mu.Lock()
	l.listed[topic] = true
	s := l.streamLocked(topic)
	for filter := range l.filters {
		s.wanted = s.wanted || wire.Covers(filter, topic)
	}
	wanted := s.wanted
	l.mu.Unlock()
	if wanted {
		go l.follow(topic) // the watcher learns the next topic meanwhile
	}
}

// Want makes the log feed the broker the topics filter covers, and
// returns once the feed has caught up with each of them (or after a
// request timeout): an exact topic, or for a wildcard filter every topic
// listed now that it covers. A topic listed later is new, and is fed
// from its first message. Catching up first keeps a late follow from
// looking new: a subscription registers only after it, so a live-only
// wildcard never receives what came before it. A topic caught up with
// once is fed in order from then on, so a wildcard's Want does not ask
// NATS about it again: a request per covered topic on every wildcard
// subscribe would let one client make a thousand requests of NATS a
// frame. An exact topic is caught up every time: its subscriber is told
// the log's head now.
func (l *Log) Want(filter string) {
	if strings.HasPrefix(filter, "$sys/") {
		return // the broker's own, never in NATS
	}
	topics, wildcard := []string{filter}, strings.ContainsAny(filter, "+#")
	if wildcard {
		topics = l.wantFilter(filter)
	}
	for _, topic := range topics {
		s := l.stream(topic)
		l.want(topic, s)
		if wildcard && s.caughtUp.Load() {
			continue
		}
		if l.catchUp(s) {
			s.caughtUp.Store(true)
		}
	}
}

// wantFilter adds a wildcard filter, and returns the topics the bucket
// lists now that it covers: listed afresh, as the watcher may lag.
func (l *Log) wantFilter(filter string) []string {
	l.mu.Lock()
	l.filters[filter]++
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	names, err := l.listTopics(ctx)
	if err != nil {
		l.opts.Logger.Warn("list topics", "filter", filter, "err", err)
	}
	var covered []string
	for _, topic := range names {
		if wire.Covers(filter, topic) {
			covered = append(covered, topic)
		}
	}
	return covered
}

// want marks s wanted and starts following it, unless it does already.
// It does not wait: making a consumer is a request the client library
// retries for as long as NATS refuses it, and a publisher, or a
// subscriber, must not wait on that. Who needs the feed waits for it,
// with a bound (awaitFed).
func (l *Log) want(topic string, s *stream) {
	l.mu.Lock()
	already := s.wanted && s.following != nil
	s.wanted = true
	l.mu.Unlock()
	if !already {
		go l.follow(topic)
	}
}

// catchUp waits until the broker has been fed s up to the stream's
// head as of now, and reports whether it was: a subscription's head must
// be the log's.
func (l *Log) catchUp(s *stream) bool {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	info, err := l.js.Stream(ctx, s.name)
	if err != nil {
		return false // no stream yet: nothing to catch up with
	}
	head := info.CachedInfo().State.LastSeq
	l.awaitFed(s, head)
	return s.fed.Load() >= head
}

// follow starts feeding topic's messages after the newest one fed, if
// nothing feeds them yet. The ordered consumer resumes by itself after a
// lost connection, a lost NATS node or a gap, from the seq after the last
// it delivered; a heartbeat every half second (pulls that last two
// seconds) notices a lost node within a second or two, rather than the
// client library's 30 s.
func (l *Log) follow(topic string) {
	// One consumer per topic per broker: a call after one is made does
	// nothing, as does one for a topic forgotten. A call while one is
	// being made asks it to try again if it finds no stream: this call's
	// caller may have made the stream since (Append), or seen it listed
	// (learn), after that one asked NATS.
	l.mu.Lock()
	s := l.streams[topic]
	if s == nil || s.following != nil || l.closed {
		l.mu.Unlock()
		return
	}
	if s.starting {
		s.askedAgain = true
		l.mu.Unlock()
		return
	}
	s.starting, s.askedAgain = true, false
	feed := l.feed
	l.mu.Unlock()

	// Consume below makes the consumer, and retries until NATS makes it:
	// say so if that takes longer than a request should.
	slow := time.AfterFunc(requestTimeout, func() {
		l.opts.Logger.Warn("following a topic is taking long: NATS does "+
			"not make its consumer yet; its publishes are answered "+
			"without waiting for the feed", "topic", topic)
	})
	defer slow.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	consumer, err := l.js.OrderedConsumer(ctx, s.name,
		jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:   s.fed.Load() + 1})
	if err != nil {
		// Whether to try again is decided as starting ends, under one
		// lock, so that no call asks in between and is lost.
		l.mu.Lock()
		s.starting = false
		listed, asked := l.listed[topic], s.askedAgain
		l.mu.Unlock()
		switch {
		case !errors.Is(err, jetstream.ErrStreamNotFound) || listed:
			l.retryFollow(topic, err)
		case asked:
			go l.follow(topic)
		}
		// Else no one published yet: learn follows it once listed.
		return
	}
	// Each message is fed as it comes, and s.advance moves the topic's
	// fed seq, which Read and the confirms of this broker wait for.
	following, err := consumer.Consume(func(msg jetstream.Msg) {
		meta, err := msg.Metadata()
		if err != nil {
			return
		}
		m, err := decode(msg.Data(), msg.Headers(), meta.Sequence.Stream)
		if err != nil {
			l.opts.Logger.Error("corrupt message skipped", "topic", topic,
				"seq", meta.Sequence.Stream, "err", err)
			return
		}
		s.feeding.Store(m.Seq)
		feed(m)
		s.advance(m.Seq)
	}, jetstream.PullExpiry(2*time.Second),
		jetstream.PullHeartbeat(500*time.Millisecond))
	// A consumer made is kept unless Close came while it was being
	// made, or Forget: the topic was made meanwhile by another broker,
	// and this one no longer wants it. The log line and the consumer's
	// stop wait for the lock's release.
	l.mu.Lock()
	s.starting = false
	kept := err == nil && !l.closed && l.streams[topic] == s
	if kept {
		s.following = following
	}
	l.mu.Unlock()
	if err != nil {
		l.retryFollow(topic, err)
	} else if !kept {
		following.Stop()
	}
}

// Forget undoes Want. For a wildcard filter, one subscription that
// wanted it ended: the last takes it out of the filters that new topics
// are matched against. For a topic, the broker forgot it, nobody here
// subscribing to it any more and the log never having had a message of
// it: Forget drops what this broker keeps of it (its stream struct,
// about 650 bytes), unless the stream exists, a publish is making it or
// this broker follows it. Without Forget, every name and filter a client
// ever subscribed to would stay until a restart.
func (l *Log) Forget(topic string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.ContainsAny(topic, "+#") {
		if l.filters[topic]--; l.filters[topic] <= 0 {
			delete(l.filters, topic)
		}
		return
	}
	s := l.streams[topic]
	if s != nil && !s.created && s.creating == 0 && s.following == nil &&
		!l.listed[topic] {
		delete(l.streams, topic)
	}
}

// retryFollow reports a topic this broker could not follow, and tries
// again in a second: until it does, its clients miss the topic.
func (l *Log) retryFollow(topic string, err error) {
	l.opts.Logger.Error("follow topic", "topic", topic, "err", err)
	time.AfterFunc(time.Second, func() { l.follow(topic) })
}

// Close stops following, waits for publishes in flight to be answered,
// and for the deletes of what they sent (a few seconds at most, each),
// and closes the connection.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	for _, s := range l.streams {
		if s.following != nil {
			s.following.Stop()
		}
	}
	l.mu.Unlock()

	// Publishes in flight get their answers, for a request's time at
	// most; then the loops stop.
	select {
	case <-l.js.PublishAsyncComplete():
	case <-time.After(requestTimeout):
	}
	close(l.stop)
	l.loops.Wait()

	// What ackLoop left is answered here; then the deletes those answers
	// started, and any under way, finish (one try each, as stop is
	// closed) before the connection closes.
	for {
		select {
		case p := <-l.acks:
			answerNow(p)
		default:
			l.background.Wait()
			l.nc.Close()
			return nil
		}
	}
}
