package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/wire"
)

// Dialer opens a WebSocket to the broker a client is to use now: through
// a proxy, to one of several brokers, or over a pipe.
type Dialer func(ctx context.Context) (*websocket.Conn, error)

// Client is one of a run's clients: it dials with Dial, authenticates
// with Token, and records every frame it sends or gets in History.
type Client struct {
	Name    string
	Dial    Dialer
	Token   string
	History *History
	// Pace is how long Publish waits before each new value: zero
	// publishes as fast as the window allows.
	Pace time.Duration
	// Overlap, if set, is a wildcard filter that Subscribe and Join
	// subscribe to on the same connection, beside their topic, which it
	// covers: every message of the topic then comes through both, and
	// the one ack (or nak) the client sends for it must settle both.
	Overlap string
	// Narrow, if set, is a token of the same subject without the grant
	// to read the topic: a member that naks a job (some of those it
	// naks, revokeAt) refreshes its session to it while the job is its
	// to ack, which ends its subscriptions and must hand the job on, and
	// joins again with Token, once for each value.
	Narrow string
	// narrowed holds the values whose nak narrowed the session.
	narrowed map[string]bool
	// Fleeting makes Publish give every value a time to live, not one in
	// eight: on a broker whose TTL is shorter than Pace, the topic's log
	// empties between values, and the broker forgets the topic and makes
	// it again for the next one.
	Fleeting bool
}

// frame is any frame the broker sends: the protocol's own type.
type frame = wire.Received

// connect dials and authenticates, trying again with a growing backoff
// until it succeeds or ctx ends.
func (c *Client) connect(ctx context.Context) (*websocket.Conn, error) {
	backoff := 20 * time.Millisecond
	for {
		ws, err := c.dialOnce(ctx)
		if err == nil {
			return ws, nil
		}
		// Jitter, so that clients cut at once do not all come back at
		// once.
		wait := backoff/2 + rand.N(backoff)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}

// dialOnce dials and authenticates once, within ten seconds.
func (c *Client) dialOnce(ctx context.Context) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, err := c.Dial(ctx)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(4 << 20)
	err = send(ctx, ws, map[string]any{"type": "auth", "token": c.Token})
	if err == nil {
		var f frame
		if f, err = read(ctx, ws); err == nil && f.Type != "authenticated" {
			err = fmt.Errorf("auth answered %s %s", f.Type, f.Code)
		}
	}
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	return ws, nil
}

// send writes v as one text frame.
func send(ctx context.Context, ws *websocket.Conn, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return ws.Write(ctx, websocket.MessageText, data)
}

// read reads and decodes the next frame.
func read(ctx context.Context, ws *websocket.Conn) (frame, error) {
	var f frame
	_, data, err := ws.Read(ctx)
	if err == nil {
		err = json.Unmarshal(data, &f)
	}
	return f, err
}

// Publish publishes unique values to topic at QoS 1, "NAME-1", "NAME-2",
// …, each its own message_id, with at most window unconfirmed at a time,
// until stop is closed; then it publishes nothing new and returns once
// every value it sent is confirmed, or ctx ends. After a dropped
// connection it dials again and sends again, with the same ids, every
// value not yet confirmed: the broker's dedup makes that safe. It
// returns how many values it made.
func (c *Client) Publish(ctx context.Context, stop <-chan struct{},
	topic string, window int) (int, error) {
	p := &publisher{Client: c, topic: topic, window: window, stop: stop,
		expire: true}
	for !p.finished() {
		ws, err := c.connect(ctx)
		if err != nil {
			return p.made, err
		}
		p.session(ctx, ws)
		ws.CloseNow()
		if p.refusedForNow {
			p.refusedForNow = false
			if err := waitToSendAgain(ctx); err != nil {
				return p.made, err
			}
		}
	}
	return p.made, nil
}

// waitToSendAgain waits before a frame refused for now is sent again, or
// until ctx ends: sent at once, it would be refused at once for as long
// as the bound holds, and a loop that never waits stops a fake clock.
func waitToSendAgain(ctx context.Context) error {
	select {
	case <-time.After(250 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publisher is the state of one Publish.
type publisher struct {
	*Client
	topic  string
	window int
	stop   <-chan struct{}
	// made counts the values made; unconfirmed lists the ids sent and
	// not confirmed yet, oldest first.
	made        int
	unconfirmed []string
	// expire lets values expire (expiring) and wait (delayed); a marker
	// never expires, and always waits the delay: behind every value
	// published before it, delayed or not.
	expire, marker bool
	// refusedForNow is set when the session had a value refused for now
	// (refusedForNow, the list): it is sent again on the next session.
	refusedForNow bool
}

// stopped reports whether stop is closed.
func (p *publisher) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// finished reports whether Publish is done: stopped, and nothing left to
// confirm.
func (p *publisher) finished() bool {
	return p.stopped() && len(p.unconfirmed) == 0
}

// session publishes on one connection until it drops or Publish is
// finished. Each publish gets exactly one reply, so the window counts
// the replies still due on this connection.
func (p *publisher) session(ctx context.Context, ws *websocket.Conn) {
	due := 0
	for _, id := range p.unconfirmed {
		if p.publish(ctx, ws, id) != nil {
			return
		}
		due++
	}
	for !p.finished() {
		for due < p.window && !p.stopped() {
			if p.Pace > 0 {
				time.Sleep(p.Pace)
			}
			p.made++
			id := fmt.Sprintf("%s-%d", p.Name, p.made)
			p.unconfirmed = append(p.unconfirmed, id)
			if p.publish(ctx, ws, id) != nil {
				return
			}
			due++
		}
		if due == 0 {
			return
		}
		f, err := read(ctx, ws)
		if err != nil {
			return
		}
		switch {
		case f.Type == "published":
			due--
			p.confirmed(f)
		case f.Type == "error" && f.Code == "store_failed" &&
			f.MessageID != "":
			// Not stored: send it again, now, with the same id.
			p.History.Refused(Refusal{p.Name, f.Topic, f.MessageID, f.Code,
				time.Time{}})
			if p.publish(ctx, ws, f.MessageID) != nil {
				return
			}
		case f.Type == "error":
			// Refused for now (a bound, a rate) is sent again on the
			// next connection; refused for good (an invalid delay, say)
			// would be refused again, at every connection, for ever.
			if f.MessageID != "" {
				p.History.Refused(Refusal{p.Name, f.Topic, f.MessageID,
					f.Code, time.Time{}})
				if !slices.Contains(refusedForNow, f.Code) {
					p.settled(f.MessageID)
				} else {
					p.refusedForNow = true
				}
			}
			due--
		}
	}
}

// publish records and sends one value, its id as its payload; one value
// in eight (expiring), or every one if Fleeting, is published with a
// time to live.
func (p *publisher) publish(ctx context.Context, ws *websocket.Conn,
	id string) error {
	expires := p.expire && (expiring(id) || p.Fleeting)
	delays := p.expire && waiting(id)
	p.History.Sent(Attempt{Publisher: p.Name, Topic: p.topic, ID: id,
		Value: id, Expiring: expires, Delayed: delays || p.marker})
	frame := map[string]any{"type": "publish", "topic": p.topic,
		"payload": id, "qos": 1, "message_id": id}
	if expires {
		frame["ttl_ms"] = ttl
	}
	switch {
	case p.marker:
		frame["delay_ms"] = markerDelay
	case delays:
		frame["delay_ms"] = delay
	}
	return send(ctx, ws, frame)
}

// confirmed records a confirm and forgets the value's id.
func (p *publisher) confirmed(f frame) {
	waits := strings.HasPrefix(f.Topic, delayedPrefix)
	p.History.Confirmed(Confirm{Publisher: p.Name,
		Topic: strings.TrimPrefix(f.Topic, delayedPrefix), ID: f.MessageID,
		Seq: f.Seq, Duplicate: f.Duplicate, Delayed: waits})
	p.settled(f.MessageID)
}

// refusedForNow are the refusals a publisher tries again after: the
// broker's bounds and rates, which a moment may lift.
var refusedForNow = []string{"delayed_limit", "rate_limited", "topic_limit",
	"unavailable"}

// settled forgets id, confirmed or refused for good: it is not sent
// again.
func (p *publisher) settled(id string) {
	p.unconfirmed = slices.DeleteFunc(p.unconfirmed, func(unsent string) bool {
		return unsent == id
	})
}

// Mark publishes one value with id at QoS 1, through drops, and returns
// once it is confirmed: a marker behind everything published before. It
// waits markerDelay, so that it is sent after every delayed value
// published before it, even one whose send failed and is tried again.
// A marker refused (the topic's delayed messages at their bound, say) is
// sent again a tenth of a second later.
func (c *Client) Mark(ctx context.Context, topic, id string) error {
	p := &publisher{Client: c, topic: topic, window: 1,
		stop: closed, unconfirmed: []string{id}, marker: true}
	for !p.finished() {
		ws, err := c.connect(ctx)
		if err != nil {
			return fmt.Errorf("mark %s: %w", topic, err)
		}
		p.session(ctx, ws)
		ws.CloseNow()
		if !p.finished() {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// closed is a closed channel: a publisher that makes no new values.
var closed = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Subscribe reads topic, acking every QoS 1 message, until it gets the
// message whose id is until, or ctx ends. After a dropped connection it
// subscribes again: with its durable name if it has one, else after the
// last seq it saw.
func (c *Client) Subscribe(ctx context.Context, topic, durable,
	until string) error {
	var last *uint64
	for {
		ws, err := c.connect(ctx)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", topic, err)
		}
		s := &Subscription{Subscriber: c.Name, Topic: topic,
			Durable: durable, After: last, Overlap: c.Overlap}
		done, seen := c.read(ctx, ws, s, until)
		ws.CloseNow()
		if done {
			return nil
		}
		if seen > 0 && durable == "" {
			last = &seen
		}
	}
}

// Begin subscribes to topic under a new durable name, for new messages
// only ("last":0), and leaves as soon as the reply comes, before
// anything else can; then it reads topic as Subscribe does, resuming the
// name, until the message until comes. A name resumed before its first
// delivery must start where it began, not at the log's start. The name
// is durable, "-", and the attempt: one whose reply never came (a fault
// took it) may have begun anyway, where the client cannot tell, so the
// next attempt begins another, and only the name that replied is
// recorded.
func (c *Client) Begin(ctx context.Context, topic, durable,
	until string) error {
	for attempt := 1; ; attempt++ {
		ws, err := c.connect(ctx)
		if err != nil {
			return fmt.Errorf("begin %s: %w", topic, err)
		}
		name := fmt.Sprint(durable, "-", attempt)
		err = send(ctx, ws, map[string]any{"type": "subscribe",
			"topic": topic, "durable": name, "last": 0})
		f := frame{}
		for err == nil && f.Type != "subscribed" && f.Type != "error" {
			f, err = read(ctx, ws)
		}
		ws.CloseNow()
		if err == nil && f.Type == "subscribed" {
			s := c.History.Subscribed(&Subscription{Subscriber: c.Name,
				Topic: topic, Durable: name, Begun: true})
			c.History.Replied(s, f.Seq, f.Recovered == nil || *f.Recovered)
			c.History.Closed(s)
			return c.Subscribe(ctx, topic, name, until)
		}
	}
}

// Burst publishes bursts of n values to topic at QoS 1, each delayed by
// delay and all sent at once on one connection, then waits for their
// answers and for a delay and a half more, so that each burst finds the
// last one's fallen due. Under a bound of fewer than n delayed messages a
// topic (the broker's --max-delayed, which it records as the topic's
// bound), each burst is confirmed up to the bound and refused past it
// (delayed_limit). Values a dropped connection left unanswered are not
// sent again: the final read says whether they were stored. Once stop
// is closed it returns, after the last burst's wait, or when ctx ends.
func (c *Client) Burst(ctx context.Context, stop <-chan struct{},
	topic string, n, bound int) {
	c.History.Bounded(topic, bound)
	made, run := 0, 0
	for {
		ws, err := c.connect(ctx)
		if err != nil {
			return
		}
		run++
		sent := c.burst(ctx, ws, topic, n, run, &made)
		ws.CloseNow()
		if sent {
			select {
			case <-time.After(delay * time.Millisecond * 3 / 2):
			case <-ctx.Done():
			}
		}
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
	}
}

// burst sends one burst of n delayed values, the run numbered run,
// counting them in made, and reads their answers; it reports false if
// the connection dropped.
func (c *Client) burst(ctx context.Context, ws *websocket.Conn,
	topic string, n, run int, made *int) bool {
	for range n {
		*made++
		id := fmt.Sprintf("%s-%d", c.Name, *made)
		c.History.Sent(Attempt{Publisher: c.Name, Topic: topic, ID: id,
			Value: id, Delayed: true, Run: run})
		if send(ctx, ws, map[string]any{"type": "publish", "topic": topic,
			"payload": id, "qos": 1, "message_id": id,
			"delay_ms": delay}) != nil {
			return false
		}
	}
	for answered := 0; answered < n; {
		f, err := read(ctx, ws)
		if err != nil {
			return false
		}
		name := strings.TrimPrefix(f.Topic, delayedPrefix)
		switch {
		case f.Type == "published":
			c.History.Confirmed(Confirm{Publisher: c.Name, Topic: name,
				ID: f.MessageID, Seq: f.Seq, Duplicate: f.Duplicate,
				Delayed: name != f.Topic})
			answered++
		case f.Type == "error" && f.MessageID != "":
			c.History.Refused(Refusal{c.Name, name, f.MessageID, f.Code,
				time.Time{}})
			answered++
		}
	}
	return true
}

// Churn subscribes to each of topics and unsubscribes again, in turn, a
// Pace apart, until stop is closed or ctx ends, dialing again after a
// dropped connection: a client whose topics come and go as reply topics
// do, so that the broker forgets a topic nobody published to, and makes
// it again, beside the publishes that land on it. It records nothing:
// what it hears is no subscriber's to check.
func (c *Client) Churn(ctx context.Context, stop <-chan struct{},
	topics []string) {
	for {
		ws, err := c.connect(ctx)
		if err != nil {
			return
		}
		done := c.churn(ctx, stop, ws, topics)
		ws.CloseNow()
		if done {
			return
		}
	}
}

// churn is Churn on one connection: it reports true once stop is closed
// or ctx ended, false when the connection dropped.
func (c *Client) churn(ctx context.Context, stop <-chan struct{},
	ws *websocket.Conn, topics []string) bool {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return true
		case <-ctx.Done():
			return true
		case <-time.After(c.Pace):
		}
		topic := topics[i%len(topics)]
		for _, kind := range []string{"subscribe", "unsubscribe"} {
			// The answer is kind+"d", or an error about the topic (past
			// the broker's cap on topics, say); a message that landed
			// meanwhile is read past.
			err := send(ctx, ws, map[string]any{"type": kind, "topic": topic})
			for f := (frame{}); err == nil && f.Type != kind+"d" &&
				(f.Type != "error" || f.Topic != topic); {
				f, err = read(ctx, ws)
			}
			if err != nil {
				return false
			}
		}
	}
}

// Join reads topic as a member of group, acking every QoS 1 message,
// and joins again after a dropped connection, until ctx ends: the group
// shares the messages, so one member's marker is not the others'. The
// member that gets the message until calls finished, which may end ctx
// for them all.
func (c *Client) Join(ctx context.Context, topic, group, until string,
	finished func()) {
	for ctx.Err() == nil {
		ws, err := c.connect(ctx)
		if err != nil {
			return
		}
		s := &Subscription{Subscriber: c.Name, Topic: topic, Group: group,
			Overlap: c.Overlap}
		if done, _ := c.read(ctx, ws, s, until); done {
			finished()
		}
		ws.CloseNow()
	}
}

// read subscribes with s on ws and reads until the connection drops (it
// returns false and the newest seq seen) or the message until comes.
func (c *Client) read(ctx context.Context, ws *websocket.Conn,
	s *Subscription, until string) (bool, uint64) {
	request := map[string]any{"type": "subscribe", "topic": s.Topic}
	if s.Durable != "" {
		request["durable"] = s.Durable
	}
	if s.Group != "" {
		request["group"] = s.Group
	}
	newest := uint64(0)
	if s.After != nil {
		request["after"], newest = *s.After, *s.After
	}
	c.History.Subscribed(s)
	defer c.History.Closed(s)
	if send(ctx, ws, request) != nil || s.Overlap != "" &&
		send(ctx, ws, map[string]any{"type": "subscribe",
			"topic": s.Overlap}) != nil {
		return false, newest
	}
	// seen holds the deliveries (seq and attempt) this connection had:
	// through an overlapping filter each comes twice, and only the first
	// is recorded and answered.
	seen := map[[2]uint64]bool{}
	for {
		f, err := read(ctx, ws)
		if err != nil {
			return false, newest
		}
		if f.Type == "message" && s.Overlap != "" {
			delivery := [2]uint64{f.Seq, uint64(f.Attempt)}
			if seen[delivery] || f.Topic != s.Topic {
				continue // acked with the first; not this topic's
			}
			seen[delivery] = true
		}
		switch f.Type {
		case "subscribed":
			if f.Topic == s.Topic {
				c.History.Replied(s, f.Seq, f.Recovered == nil ||
					*f.Recovered)
			}
		case "unsubscribed":
			// A refresh to Narrow ended the subscription: leave, and
			// come back with Token.
			return false, newest
		case "skipped":
			// The overlap's own (f.Filter) says the same gap of the
			// topic as s's, which s hears from its replay.
			if f.Filter != "" {
				continue
			}
			c.History.Skipped(s, f.Seq)
			newest = max(newest, f.Seq)
		case "message":
			var value string
			json.Unmarshal(f.Payload, &value)
			// Some first deliveries are handed back (nakFirst), to come
			// again a moment later; every other QoS 1 one is acked.
			nak := f.QoS == 1 && f.Attempt == 1 && nakFirst(value)
			c.History.Delivered(s, Delivery{Seq: f.Seq, ID: f.MessageID,
				Value: value, Attempt: f.Attempt, QoS: f.QoS, Nakked: nak,
				ExpiresAt: f.ExpiresAt, DeliverAt: f.DeliverAt})
			newest = max(newest, f.Seq)
			answer := map[string]any{"type": "ack", "topic": s.Topic,
				"message_id": f.MessageID}
			if nak {
				answer["type"], answer["delay_ms"] = "nak", nakDelay
			}
			if f.QoS == 1 && send(ctx, ws, answer) != nil {
				return false, newest
			}
			if f.MessageID == until {
				return true, newest
			}
			if nak && c.narrowAt(value) && s.Group != "" &&
				send(ctx, ws, map[string]any{"type": "auth",
					"token": c.Narrow}) != nil {
				return false, newest
			}
		}
	}
}

// nakDelay is how long, in milliseconds, a nakked delivery waits for its
// retry: under the simulated ack timeout, so a nak is not a timeout.
const nakDelay = 100

// nakFirst reports whether a subscriber hands value's first delivery
// back: one value in eight, the same for every subscriber and every run,
// so that a history replays exactly.
func nakFirst(value string) bool { return eighth(value) == 0 }

// ttl is the time to live, in milliseconds, of the values that expire:
// a few ack timeouts, so some expire while their subscriber is away.
const ttl = 2000

// expiring reports whether the value id is published with ttl: another
// one in eight.
func expiring(id string) bool { return eighth(id) == 1 }

// delay is how long, in milliseconds, the values that wait are delayed:
// a few ack timeouts, so that some fall due while their broker is down.
const delay = 1500

// markerDelay is how long, in milliseconds, a marker waits: the delay,
// and time for a value that fell due during a fault to be sent after
// the heal. A broker tries a failed send again a second later, and a
// read of its record that NATS never answered gives up after five
// seconds; a marker due before such a value was sent would end the
// readers' logs ahead of it, and the value would look lost.
const markerDelay = delay + 10_000

// delayedPrefix names the log a delayed message waits in until it is
// due: its confirm names it.
const delayedPrefix = "$delayed/"

// waiting reports whether the value id is published with delay: another
// one in eight.
func waiting(id string) bool { return eighth(id) == 2 }

// narrowAt reports whether a member that naks value's first delivery
// narrows its session then (Client.Narrow): a quarter of the values it
// naks, once each, or a group that replays the value at attempt 1 after
// a restart would see its only member leave again for ever.
func (c *Client) narrowAt(value string) bool {
	if c.Narrow == "" || hash(value)%32 != 0 || c.narrowed[value] {
		return false
	}
	if c.narrowed == nil {
		c.narrowed = map[string]bool{}
	}
	c.narrowed[value] = true
	return true
}

// eighth sorts a value into one of eight classes, by its hash.
func eighth(value string) uint32 { return hash(value) % 8 }

// hash is value's FNV-1a hash.
func hash(value string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(value))
	return h.Sum32()
}

// ReadLog reads topic's whole log, from the oldest message kept up to
// and with the message whose id is until, into History.Final.
func (c *Client) ReadLog(ctx context.Context, topic, until string) error {
	for {
		ws, err := c.connect(ctx)
		if err != nil {
			return fmt.Errorf("read log %s: %w", topic, err)
		}
		log, err := readLog(ctx, ws, topic, until, c.History)
		ws.CloseNow()
		if err == nil {
			c.History.SetFinal(topic, log)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("read log %s: %w", topic, ctx.Err())
		}
	}
}

// ReadDeadLetters reads the dead letters of topic, from $dead/<topic>,
// into History.DeadLetters. It marks the end of that topic first, so
// its token needs publish and subscribe grants on $dead/#.
func (c *Client) ReadDeadLetters(ctx context.Context, topic string) error {
	dead := "$dead/" + topic
	if err := c.Mark(ctx, dead, "end-"+dead); err != nil {
		return err
	}
	for {
		ws, err := c.connect(ctx)
		if err != nil {
			return fmt.Errorf("read dead letters %s: %w", topic, err)
		}
		log, err := readLog(ctx, ws, dead, "end-"+dead, nil)
		ws.CloseNow()
		if err == nil {
			var letters []wire.DeadLetter
			for _, m := range log {
				var letter wire.DeadLetter
				if json.Unmarshal([]byte(m.Value), &letter) == nil {
					letters = append(letters, letter)
				}
			}
			c.History.Dead(letters)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("read dead letters %s: %w", topic, ctx.Err())
		}
	}
}

// readLog reads topic from the start on one connection. It acks as it
// goes, all up to each seq: an unacked replay would stop once it filled
// half the in-flight window. A message with an expires_at goes to h,
// if not nil, to be checked.
func readLog(ctx context.Context, ws *websocket.Conn, topic,
	until string, h *History) ([]Stored, error) {
	err := send(ctx, ws, map[string]any{"type": "subscribe",
		"topic": topic})
	if err != nil {
		return nil, err
	}
	var log []Stored
	for {
		f, err := read(ctx, ws)
		if err != nil {
			return nil, err
		}
		if f.Type != "message" || f.Attempt > 1 {
			continue
		}
		err = send(ctx, ws, map[string]any{"type": "ack", "topic": topic,
			"seq": f.Seq})
		if err != nil {
			return nil, err
		}
		// A dead letter's payload is an object: kept as it is.
		value := string(f.Payload)
		json.Unmarshal(f.Payload, &value)
		log = append(log, Stored{f.Seq, f.MessageID, value})
		if f.ExpiresAt != 0 && h != nil {
			h.ReadExpiring(FinalRead{topic, f.Seq, f.MessageID, f.ExpiresAt,
				time.Time{}})
		}
		if f.MessageID == until {
			return log, nil
		}
	}
}

// publishUnread records and sends the QoS 1 publish of value id to
// topic, a value no reader of the final log is asked for.
func (c *Client) publishUnread(ctx context.Context, ws *websocket.Conn,
	topic, id string) error {
	c.History.Sent(Attempt{Publisher: c.Name, Topic: topic, ID: id,
		Value: id, Unread: true})
	return send(ctx, ws, map[string]any{"type": "publish", "topic": topic,
		"payload": id, "qos": 1, "message_id": id})
}

// ErrUnfinished is returned by a run whose clients did not finish
// before its deadline: the history then has holes of its own.
var ErrUnfinished = errors.New("chaos: clients did not finish in time")

// OnFirstDelivery subscribes to topic for new messages only, publishes
// id there (unless it is ""), and calls then the moment the first
// message arrives, before anything else happens on this client: a
// nemesis kills the broker there, while that message's commit is most
// likely still under way. It records the subscription like any other.
func (c *Client) OnFirstDelivery(ctx context.Context, topic, id string,
	then func()) error {
	ws, err := c.connect(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", topic, err)
	}
	defer ws.CloseNow()
	zero := uint64(0)
	s := c.History.Subscribed(&Subscription{Subscriber: c.Name,
		Topic: topic, After: nil})
	subscribe := map[string]any{"type": "subscribe", "topic": topic,
		"last": zero}
	err = send(ctx, ws, subscribe)
	for err == nil {
		var f frame
		if f, err = read(ctx, ws); err != nil {
			break
		}
		switch f.Type {
		case "subscribed":
			// Only new messages: as if it asked for everything after
			// the head.
			c.History.Replied(s, f.Seq, true)
			head := f.Seq
			s.After = &head
			if id != "" {
				err = c.publishUnread(ctx, ws, topic, id)
			}
		case "error":
			// A subscribe refused for now (past the cap on topics) is
			// sent again a moment later.
			if f.MessageID == "" && slices.Contains(refusedForNow, f.Code) {
				if err = waitToSendAgain(ctx); err == nil {
					err = send(ctx, ws, subscribe)
				}
			}
			// Not stored (the log was away): send it again, now, with
			// the same id, as a publisher does. Waiting for a delivery
			// of a refused publish would wait in vain.
			if id != "" && f.Code == "store_failed" && f.MessageID == id {
				c.History.Refused(Refusal{c.Name, topic, id, f.Code,
					time.Time{}})
				err = c.publishUnread(ctx, ws, topic, id)
			}
		case "message":
			then()
			var value string
			json.Unmarshal(f.Payload, &value)
			c.History.Delivered(s, Delivery{Seq: f.Seq, ID: f.MessageID,
				Value: value, Attempt: f.Attempt, DeliverAt: f.DeliverAt})
			return nil
		}
	}
	return fmt.Errorf("watch %s: %w", topic, err)
}
