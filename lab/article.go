package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/socket"
	"github.com/popsub/popsub/wire"
)

// # The article's broker
//
// The original PopSub, as "Building PopSub" describes it, runs here
// beside popsub.go so that a learner sees where "the simple version
// runs out". It is a model, not a port: three maps and a retry loop,
// behind one lock, doing what the article says in the order it says
// it, and nothing more. A port of the Rust code would bring its
// runtime and its transport into the page and hide the five mechanisms
// the article names among everything else; the model is those five. It
// takes the lab's ack timeout and retries (brokerOptions), not the
// article's five seconds and five, so that both brokers keep the same
// time; and its store keeps a cap but no time-to-live, which no lab run
// lasts long enough to reach.
//
//   - topics maps a topic to the ids of its subscribers; clients maps an
//     id to a channel that writes to that client's socket. A send to an
//     id with no client is a warning, never a crash.
//   - A publish is stamped with the time, given an id if it has none,
//     recorded in pendingAcks if it asks for QoS 1 (keyed by its
//     message_id alone), written to the store, and sent to every
//     subscriber of its topic. There is no confirm.
//   - An ack, from anyone, removes the message's entry.
//   - A loop wakes once a second: an entry older than the ack timeout is
//     sent again to the whole topic and counts a retry; after the last,
//     it is dropped.
//   - A subscribe sends what the store holds for the topic, each with a
//     fresh id and QoS 0, before any new message.
//   - All of it runs under one mutex, the store's write too; a client's
//     channel has no bound.
//
// The store is the lab's Disk, as sled uses a disk: a write goes to the
// page cache at once, and a flush every flushEvery syncs it. Its keys
// are a counter per topic, standing for the article's timestamp_uuid:
// they sort in time order, and nobody outside the store sees them.

// articleTick is how often the article's retry loop wakes; flushEvery
// how often its store syncs (sled's default); articleCap how many
// messages its store keeps of a topic.
const (
	articleTick = time.Second
	flushEvery  = 500 * time.Millisecond
	articleCap  = 1000
)

// article is the article's broker: its one struct.
type article struct {
	disk *Disk
	// stop ends the retry loop and the flusher, at Shutdown, which waits
	// for every goroutine running to end.
	stop     chan struct{}
	stopping sync.Once
	running  sync.WaitGroup

	// mu is the one lock, a channel of one: a client waiting for it
	// waits as a goroutine waits on a channel, which the lab's fake
	// clock (testing/synctest's) sees, where a sync.Mutex's wait it
	// does not; time moves on while the lock is held across a slow write.
	mu          lock
	topics      map[string]map[int]bool
	clients     map[int]*articleClient
	pendingAcks map[string]*pendingMessage
	// next numbers clients and fresh ids; keys numbers each topic's
	// store entries.
	next int
	keys map[string]uint64
	// bytes counts what waits in every client's queue, read without the
	// lock, which a slow write may hold.
	bytes atomic.Int64
}

// lock is a mutex made of a channel.
type lock chan struct{}

func (l lock) Lock()   { l <- struct{}{} }
func (l lock) Unlock() { <-l }

// pendingMessage is a QoS 1 message waiting for an ack: the article's
// PendingMessage.
type pendingMessage struct {
	message message
	sentAt  time.Time
	retries int
}

// message is a publish as the article's broker keeps it.
type message struct {
	topic     string
	payload   json.RawMessage
	timestamp int64
	id        string
	qos       int
}

// articleClient is one client's entry in clients: its socket and the
// frames waiting for it, without bound.
type articleClient struct {
	end   brokerEnd
	wake  chan struct{}
	bytes *atomic.Int64 // the broker's count

	mu    sync.Mutex
	queue [][]byte
}

// newArticle starts the article's broker on disk: the store survives a
// crash, pendingAcks does not.
func newArticle(disk *Disk) (*article, error) {
	heads, err := disk.Topics()
	if err != nil {
		return nil, err
	}
	a := &article{disk: disk, stop: make(chan struct{}), mu: make(lock, 1),
		topics: map[string]map[int]bool{}, clients: map[int]*articleClient{},
		pendingAcks: map[string]*pendingMessage{}, keys: heads}
	a.running.Go(a.retryLoop)
	a.running.Go(a.flusher)
	return a, nil
}

// serve serves one client's link until it ends.
func (a *article) serve(l *link) {
	a.running.Add(1)
	defer a.running.Done()
	// No write timeout: the article's broker does not cut a client off.
	end := l.open(socket.Options{WriteTimeout: 24 * time.Hour}).(brokerEnd)
	c := &articleClient{end: end, wake: make(chan struct{}, 1),
		bytes: &a.bytes}
	a.mu.Lock()
	a.next++
	id := a.next
	a.clients[id] = c
	a.mu.Unlock()
	a.running.Go(c.writeLoop)
	for {
		frame, err := end.Read()
		if err != nil {
			break
		}
		var f wire.Frame
		if json.Unmarshal(frame, &f) == nil {
			a.handle(id, f)
		}
	}
	a.mu.Lock()
	delete(a.clients, id)
	a.mu.Unlock()
	c.mu.Lock()
	for _, f := range c.queue {
		a.bytes.Add(-int64(len(f)))
	}
	c.queue = nil
	c.mu.Unlock()
}

// handle takes one frame. The model takes a client's auth on trust: the
// lab's clients send good tokens, and the article's login is not one of
// the limits it shows.
func (a *article) handle(id int, f wire.Frame) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch f.Type {
	case "subscribe":
		if a.topics[f.Topic] == nil {
			a.topics[f.Topic] = map[int]bool{}
		}
		a.topics[f.Topic][id] = true
		a.replay(id, f.Topic)
	case "unsubscribe":
		delete(a.topics[f.Topic], id)
	case "publish":
		a.publish(f)
	case "ack":
		delete(a.pendingAcks, f.MessageID)
	}
}

// publish does the article's five steps, in its order; a.mu is held.
func (a *article) publish(f wire.Frame) {
	m := message{topic: f.Topic, payload: f.Payload,
		timestamp: time.Now().UnixMilli(), id: f.MessageID, qos: f.QoS}
	if m.id == "" {
		m.id = a.freshID()
	}
	if m.qos == 1 {
		a.pendingAcks[m.id] = &pendingMessage{message: m, sentAt: time.Now()}
	}
	a.store(m)
	a.send(m)
}

// store writes m to the disk, under the lock, trimming the topic to
// articleCap.
func (a *article) store(m message) {
	a.keys[m.topic]++
	key := a.keys[m.topic]
	b := &popsub.Batch{Messages: []*popsub.Message{{Topic: m.topic,
		Seq: key, ID: m.id, Payload: m.payload, Timestamp: m.timestamp}}}
	if key > articleCap {
		b.Trims = map[string]uint64{m.topic: key - articleCap}
	}
	a.disk.write(b)
}

// send queues m for every subscriber of its topic.
func (a *article) send(m message) {
	frame := m.frame()
	for _, id := range slices.Sorted(maps.Keys(a.topics[m.topic])) {
		if c := a.clients[id]; c != nil {
			c.push(frame)
		}
		// A subscriber whose client is gone: a warning in the log.
	}
}

// replay sends subscriber id what the store holds of topic, each with a
// fresh id and QoS 0: history is a convenience, not a contract.
func (a *article) replay(id int, topic string) {
	stored, _ := a.disk.Read(topic, 0, articleCap, 1<<30)
	for _, s := range stored {
		m := message{topic: topic, payload: s.Payload,
			timestamp: s.Timestamp, id: a.freshID()}
		a.clients[id].push(m.frame())
	}
}

// frame is m as a delivery: the original's fields, and no others.
func (m message) frame() []byte {
	frame, _ := json.Marshal(map[string]any{"type": "message",
		"topic": m.topic, "payload": m.payload, "timestamp": m.timestamp,
		"message_id": m.id, "qos": m.qos})
	return frame
}

// freshID makes an id of the broker's own.
func (a *article) freshID() string {
	a.next++
	return fmt.Sprintf("id-%d", a.next)
}

// retryLoop is the article's background task: once a second, every
// entry that waited longer than the ack timeout goes again to the whole
// topic, until its last retry, after which it is dropped.
func (a *article) retryLoop() {
	ticker := time.NewTicker(articleTick)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
		case <-a.stop:
			return
		}
		a.disk.gate.wait() // a paused broker retries nothing
		a.mu.Lock()
		for _, id := range slices.Sorted(maps.Keys(a.pendingAcks)) {
			p := a.pendingAcks[id]
			if time.Since(p.sentAt) < brokerOptions.AckTimeout {
				continue
			}
			if p.retries >= brokerOptions.MaxRetries {
				delete(a.pendingAcks, id)
				continue
			}
			p.retries++
			p.sentAt = time.Now()
			a.send(p.message)
		}
		a.mu.Unlock()
	}
}

// flusher syncs the store's writes every flushEvery.
func (a *article) flusher() {
	ticker := time.NewTicker(flushEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			a.disk.flush()
		case <-a.stop:
			return
		}
	}
}

// push queues a frame for the client's socket.
func (c *articleClient) push(frame []byte) {
	c.mu.Lock()
	c.queue = append(c.queue, frame)
	c.bytes.Add(int64(len(frame)))
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes the client's frames to its socket, one at a time, as
// long as each takes.
func (c *articleClient) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.end.done:
			return
		}
		for frame, ok := c.next(); ok; frame, ok = c.next() {
			c.end.gate.wait() // a paused broker writes nothing
			if c.end.dropping(frame) {
				continue
			}
			if c.end.put(item{frame: frame}) != nil {
				return
			}
		}
	}
}

// next takes the client's oldest waiting frame.
func (c *articleClient) next() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return nil, false
	}
	frame := c.queue[0]
	c.queue = c.queue[1:]
	c.bytes.Add(-int64(len(frame)))
	return frame, true
}

// Shutdown stops the broker's loops, drops its clients, and waits for
// what was under way to end.
func (a *article) Shutdown(context.Context) error {
	a.stopping.Do(func() { close(a.stop) })
	a.mu.Lock()
	for _, c := range a.clients {
		c.end.CloseNow()
	}
	a.mu.Unlock()
	a.running.Wait()
	return nil
}

// held is how many bytes wait for clients in the broker's memory.
func (a *article) held() int { return int(a.bytes.Load()) }
