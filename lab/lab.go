// Package lab runs the real broker, popsub.New from popsub.go, with a
// disk, a network and three clients that live in the same process, so
// that a learner can crash it, cut its power and its links, and see at
// once which promise held. The page /lab compiles it to WebAssembly and
// drives its clock (package lab/page); tests drive it in fake time.
//
// # The world around the broker
//
// Nothing of the broker is modelled: it is popsub.go, built for the
// browser, behind the contracts popsub.go declares. (Beside it a run may
// have the one thing the lab does model: the article's original broker,
// article.go, to show where the simple version runs out.) The disk is a Store
// whose commits are written, then synced (Disk); the network is links
// in memory that the broker serves as it serves WebSockets (link); the
// clients, alice, bob and carol, speak the protocol's frames as any
// client does, and keep what they saw in a chaos.History, the one
// `popsub chaos` checks. After each event the page asks chaos.Promises
// what held.
//
// # Time
//
// The broker reads the clock and sets timers as it always does. In the
// page, Go's clock is the page's: the tab's WebAssembly host tells Go
// the time, and moves it on only when the learner plays or steps, to
// the next timer Go has set. Its random numbers come from the run's
// seed. So a run is a seed and the learner's clicks, and replaying them
// replays the run (lab/page says how). In tests, testing/synctest's
// bubble plays the same part.
package lab

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/chaos"
	"github.com/popsub/popsub/wire"
)

// The lab's broker: retries and timeouts short enough to watch, and a
// log that keeps the whole run, so that the checker reads every message.
var brokerOptions = popsub.Options{
	AckTimeout:     2 * time.Second,
	MaxRetries:     2,
	WriteTimeout:   3 * time.Second,
	OutboxBytes:    4 << 10,
	MaxMessages:    1 << 20,
	TTL:            24 * time.Hour,
	FeatureOptions: popsub.FeatureOptions{PingInterval: 10 * time.Second},
}

// The lab's pauses: a killed broker is restarted after restartDelay, and
// a client whose connection dropped connects again after reconnectDelay.
const (
	restartDelay   = 500 * time.Millisecond
	reconnectDelay = time.Second
)

// beat is the period of the lab's own timer. The page's clock moves from
// one timer to the next, and with nothing waiting for an ack the
// broker's next may be a ping ten seconds on: a scenario's wait of 200
// ms, or a step, would jump there. The beat keeps every move of the
// clock under it, as a retry loop's tick once did.
const beat = 400 * time.Millisecond

// deadPrefix starts the topics dead letters go to.
const deadPrefix = "$dead/"

// commitTime is how long a dead letter may take to reach the disk: a
// batch's wait for company, its write and its sync, with room to spare.
const commitTime = 500 * time.Millisecond

// maxCount bounds one action's publishes.
const maxCount = 100

// Names are the lab's clients, in the order the page draws them.
var Names = []string{"alice", "bob", "carol"}

// Lab is one run: a broker on its disk, and the clients.
type Lab struct {
	secret []byte
	start  time.Time
	gate   *gate

	// kind is the broker the run is on: Popsub or Article.
	kind string

	mu      sync.Mutex
	disk    *Disk
	broker  server
	broken  func() // heals the fault that took the broker down
	state   string // running, paused, down, or closed
	run     int    // counts brokers started, for their events
	clients map[string]*client
	history *chaos.History
	events  []Event
	// held is the most bytes the broker has held for its clients.
	held int
	// stop ends the beat, at Close; stopping counts the brokers killed
	// and still shutting down, for Close to wait for.
	stop     chan struct{}
	stopping sync.WaitGroup
}

// Event is one thing the page draws on its sequence diagram.
type Event struct {
	// At is when it happened, in milliseconds since the run began.
	At int64 `json:"at"`
	// Kind is publish, published, subscribe, subscribed, message, ack,
	// error, skipped, write, sync, dead, connect, disconnect, or a fault:
	// kill, power, cut, stop, read, pause, resume, restart.
	Kind string `json:"kind"`
	// From and To are lanes: a client's name, "broker" or "disk".
	From string `json:"from"`
	To   string `json:"to"`
	// Label says it in a few words.
	Label string `json:"label"`
	// Topic, Seq and ID name the message it is about, if any; Value is
	// a publish's or a delivery's payload.
	Topic string `json:"topic,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
	ID    string `json:"id,omitempty"`
	Value string `json:"value,omitempty"`
}

// The brokers a run can be on: popsub.go's, or the article's model of
// the original PopSub (article.go).
const (
	Popsub  = "popsub"
	Article = "article"
)

// server is a broker as the lab runs it.
type server interface {
	// serve serves a client's link until it ends.
	serve(l *link)
	Shutdown(ctx context.Context) error
	// held is how many bytes wait for clients in the broker's memory.
	held() int
}

// real is popsub.go's broker, serving links as it serves WebSockets.
type real struct{ *popsub.Broker }

func (r real) serve(l *link) {
	request, _ := http.NewRequest(http.MethodGet, "http://lab/ws", nil)
	r.ServeHTTP(nobody{}, popsub.WithSocket(request, l.open))
}

func (r real) held() int { return r.OutboxBytes() }

// New starts a run on popsub.go's broker: an empty disk, the broker,
// and the clients, not yet connected.
func New() (*Lab, error) { return NewOn(Popsub) }

// NewOn starts a run on the broker kind names: Popsub or Article.
func NewOn(kind string) (*Lab, error) {
	if kind != Popsub && kind != Article {
		return nil, fmt.Errorf("no broker %q: the lab's are %s and %s",
			kind, Popsub, Article)
	}
	l := &Lab{kind: kind, secret: []byte("the lab's secret, in the page"),
		start: time.Now(), gate: &gate{}, clients: map[string]*client{},
		history: &chaos.History{}, stop: make(chan struct{})}
	l.disk = &Disk{gate: l.gate, written: l.written, synced: newContents()}
	for _, name := range Names {
		l.clients[name] = &client{lab: l, name: name,
			current: map[string]*chaos.Subscription{}, reading: open(),
			newest:      map[string]uint64{},
			replacing:   map[string][]*chaos.Subscription{},
			unconfirmed: map[string][]byte{}}
	}
	if err := l.startBroker(); err != nil {
		return nil, err
	}
	go l.beat()
	return l, nil
}

// Kind is the broker the run is on: Popsub or Article.
func (l *Lab) Kind() string { return l.kind }

// beat wakes every beat until Close, and does nothing else.
func (l *Lab) beat() {
	ticker := time.NewTicker(beat)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			l.measure()
		case <-l.stop:
			return
		}
	}
}

// measure notes what the broker holds for its clients now, if it is
// the most yet.
func (l *Lab) measure() {
	l.mu.Lock()
	b := l.broker
	l.mu.Unlock()
	if b == nil {
		return
	}
	held := b.held()
	l.mu.Lock()
	l.held = max(l.held, held)
	l.mu.Unlock()
}

// open returns a closed channel: a gate that is open.
func open() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// startBroker starts a broker on the disk. Its events name its run, so
// that a dead broker's last words are not taken for the next one's.
func (l *Lab) startBroker() error {
	l.mu.Lock()
	if l.state == "closed" {
		l.mu.Unlock()
		return nil
	}
	l.run++
	run, disk := l.run, l.disk
	l.mu.Unlock()
	b, err := l.newBroker(run, disk)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.broker, l.state = b, "running"
	if l.broken != nil {
		l.broken()
		l.broken = nil
		l.note(Event{Kind: "restart", From: "broker", To: "broker",
			Label: "restarted on what the disk kept"})
	}
	return nil
}

// newBroker starts the run's kind of broker on disk, as its run'th.
func (l *Lab) newBroker(run int, disk *Disk) (server, error) {
	if l.kind == Article {
		return newArticle(disk)
	}
	opts := brokerOptions
	opts.Secret, opts.Store = l.secret, disk
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.OnEvent = func(e wire.Event) { l.heard(run, e) }
	b, err := popsub.New(opts)
	if err != nil {
		return nil, err
	}
	return real{b}, nil
}

// Action is one click of the learner's.
type Action struct {
	// Do is what: subscribe, publish, ack, hold, release; or a fault:
	// kill, power, cut, stop, read, drop (the client's link loses its
	// next delivery), pause, resume; slow (the disk's
	// writes take slowWrite each), lie (its syncs return without
	// syncing), heal (it is well again).
	Do     string `json:"do"`
	Client string `json:"client,omitempty"`
	// Topic, QoS, After, Durable and Group are a subscribe's or a
	// publish's.
	Topic   string  `json:"topic,omitempty"`
	QoS     int     `json:"qos,omitempty"`
	After   *uint64 `json:"after,omitempty"`
	Durable string  `json:"durable,omitempty"`
	Group   string  `json:"group,omitempty"`
	// Count publishes that many, one after another; zero is one.
	Count int `json:"count,omitempty"`
}

// Do does an action. It never blocks: what it starts happens as the
// clock moves.
func (l *Lab) Do(a Action) error {
	switch a.Do {
	case "kill", "power":
		l.kill(a.Do == "power")
		return nil
	case "pause":
		l.pause()
		return nil
	case "resume":
		l.resume()
		return nil
	case "slow", "lie", "heal":
		l.failDisk(a.Do)
		return nil
	}
	c := l.clients[a.Client]
	if c == nil {
		return fmt.Errorf("no client %q: the lab's are %s", a.Client,
			strings.Join(Names, ", "))
	}
	topicless := a.Do == "ack" || a.Do == "hold" || a.Do == "release" ||
		a.Do == "cut" || a.Do == "stop" || a.Do == "read" || a.Do == "drop"
	if problem := wire.ValidTopic(a.Topic); problem != "" && !topicless {
		return fmt.Errorf("topic: %s", problem)
	}
	switch a.Do {
	case "subscribe":
		c.subscribe(sub{topic: a.Topic, after: a.After, durable: a.Durable,
			group: a.Group})
	case "publish":
		for range min(max(a.Count, 1), maxCount) {
			c.publish(a.Topic, a.QoS)
		}
	case "ack":
		c.ackHeld()
	case "hold", "release":
		c.hold(a.Do == "hold")
	case "cut":
		c.cut()
	case "stop", "read":
		c.setReading(a.Do == "read")
	case "drop":
		c.loseNext()
	default:
		return fmt.Errorf("unknown action %q", a.Do)
	}
	return nil
}

// kill kills the broker as kill -9 would, or cuts the machine's power:
// every link drops without a word, the disk keeps what it kept, and a
// new broker starts on it after restartDelay.
func (l *Lab) kill(powerCut bool) {
	l.mu.Lock()
	if l.state == "down" || l.state == "closed" {
		l.mu.Unlock()
		return
	}
	kind, label := "kill", "kill -9: the page cache survives"
	if powerCut {
		kind, label = "power", "power cut: only what was synced survives"
	}
	// A paused broker killed is not paused any more: that fault ends.
	if l.broken != nil {
		l.broken()
	}
	l.broken = l.history.Fault(kind, "broker")
	old := l.broker
	l.disk, l.state = l.disk.after(powerCut), "down"
	l.note(Event{Kind: kind, From: "broker", To: "broker", Label: label})
	clients := l.clientList()
	l.mu.Unlock()

	for _, c := range clients {
		c.drop()
	}
	l.gate.resume()
	l.stopping.Go(func() { old.Shutdown(context.Background()) })
	time.AfterFunc(restartDelay, func() { l.startBroker() })
}

// slowWrite is how long a write takes on a failing disk.
const slowWrite = time.Second

// failDisk makes the disk slow or a liar, or heals it. These are not
// faults the checker excuses: a slow disk delays confirms and breaks no
// promise; a disk that lies about a sync breaks the contract the
// broker's promises stand on, and the checker shows what that costs.
func (l *Lab) failDisk(how string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.disk.mu.Lock()
	slow, lies := l.disk.slow, l.disk.lies
	l.disk.mu.Unlock()
	label := ""
	switch how {
	case "slow":
		slow, label = slowWrite, "the disk fails: each write takes "+
			slowWrite.String()
	case "lie":
		lies, label = true, "the disk lies: a sync returns, nothing is synced"
	default:
		slow, lies, label = 0, false, "the disk is well again"
	}
	l.disk.fail(slow, lies)
	l.note(Event{Kind: how, From: "disk", To: "disk", Label: label})
}

// Close ends the run: the broker stops, and nobody connects again.
func (l *Lab) Close() {
	l.mu.Lock()
	b := l.broker
	if l.state != "closed" {
		close(l.stop)
	}
	l.state = "closed"
	l.mu.Unlock()
	l.gate.resume()
	for _, c := range l.clientList() {
		c.drop()
		c.endStop()
	}
	b.Shutdown(context.Background())
	l.stopping.Wait()
}

// pause stops the broker as SIGSTOP would; resume goes on.
func (l *Lab) pause() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != "running" {
		return
	}
	l.broken, l.state = l.history.Fault("pause", "broker"), "paused"
	l.gate.pause()
	l.note(Event{Kind: "pause", From: "broker", To: "broker",
		Label: "paused: it reads, writes and syncs nothing"})
}

func (l *Lab) resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != "paused" {
		return
	}
	l.broken()
	l.broken, l.state = nil, "running"
	l.gate.resume()
	l.note(Event{Kind: "resume", From: "broker", To: "broker",
		Label: "resumed"})
}

// clientList returns the clients in Names' order.
func (l *Lab) clientList() []*client {
	var list []*client
	for _, name := range Names {
		list = append(list, l.clients[name])
	}
	return list
}

// note records an event; l.mu is held.
func (l *Lab) note(e Event) {
	e.At = time.Since(l.start).Milliseconds()
	l.events = append(l.events, e)
}

// now is the time since the run began, in milliseconds.
func (l *Lab) now() int64 { return time.Since(l.start).Milliseconds() }

// record records an event.
func (l *Lab) record(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.note(e)
}

// written hears the disk write or sync a batch.
func (l *Lab) written(what string, b *popsub.Batch) {
	var seqs []uint64
	var topic string
	for _, m := range b.Messages {
		if !strings.HasPrefix(m.Topic, "$") {
			seqs, topic = append(seqs, m.Seq), m.Topic
		}
	}
	label := what
	switch {
	case l.kind == Article && len(seqs) > 0: // its keys are its own
		var ids []string
		for _, m := range b.Messages {
			ids = append(ids, m.ID)
		}
		if len(ids) > 2 {
			ids = []string{fmt.Sprintf("%s … %s (%d)", ids[0],
				ids[len(ids)-1], len(ids))}
		}
		label += " " + strings.Join(ids, ",")
	case len(seqs) > 0:
		label += " seq " + ranges(seqs)
	case len(b.Heads) > 0:
		label += " reserved heads"
	case len(b.Cursors) > 0:
		label += " cursor"
	default:
		return
	}
	from, to, kind := "broker", "disk", what
	switch what {
	case "sync":
		from, to = "disk", "disk"
	case "lie": // drawn as the sync it claims to be
		from, to, kind = "disk", "disk", "sync"
		label = "“synced”, not synced:" + strings.TrimPrefix(label, "lie")
	}
	l.record(Event{Kind: kind, From: from, To: to, Label: label,
		Topic: topic})
}

// ranges writes seqs, in order, as runs: 2-5,9.
func ranges(seqs []uint64) string {
	var parts []string
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		part := fmt.Sprint(seqs[i])
		if j > i {
			part += fmt.Sprint("-", seqs[j])
		}
		parts, i = append(parts, part), j+1
	}
	return strings.Join(parts, ",")
}

// heard takes an event of broker run's x-ray: a dead letter is the
// page's to draw.
func (l *Lab) heard(run int, e wire.Event) {
	l.mu.Lock()
	if run != l.run || strings.HasPrefix(e.Topic, "$") {
		l.mu.Unlock()
		return
	}
	switch e.Kind {
	case "dead_lettered":
		l.note(Event{Kind: "dead", From: "broker", To: e.Sub,
			Label: fmt.Sprintf("seq %d to $dead/%s", e.Seq, e.Topic),
			Topic: e.Topic, Seq: e.Seq, ID: e.MessageID})
	}
	l.mu.Unlock()
	if c := l.clients[e.Sub]; c != nil && e.Kind == "dead_lettered" {
		c.forget(e.Topic, e.MessageID)
	}
}

// Promises holds the run so far to PopSub's promises: the logs and the
// dead letters are what the disk holds now. A dead letter counts once
// it is on disk: one a power cut took was never given, and the broker
// gives it again.
func (l *Lab) Promises() []Check {
	logs, _, _ := l.currentDisk().picture()
	return l.promises(logs)
}

// Check is one of PopSub's promises, and the checker's verdict on it so
// far, or why the run's broker does not make it.
type Check struct {
	chaos.Promise
	// Unmade says why the broker does not make the promise; the
	// verdict is then nobody's.
	Unmade string `json:"unmade,omitempty"`
}

// unmade are the promises the article's broker does not make, and why.
// It makes the other two: it retries a QoS 1 message until an ack or
// its last retry, and a client that asks for a group gets a plain
// subscription, so its group's promise is judged as made.
var unmade = map[string]string{
	"no confirmed message is lost":                                    "it confirms nothing",
	"no seq is given to two messages":                                 "it gives no seqs",
	"each subscriber sees its topic in seq order, with no silent gap": "it gives no seqs",
}

// promises holds the run to the promises, with logs the disk's now.
func (l *Lab) promises(logs map[string][]diskMessage) []Check {
	var dead []wire.DeadLetter
	for topic, log := range logs {
		if strings.HasPrefix(topic, deadPrefix) {
			for _, m := range log {
				var letter wire.DeadLetter
				if json.Unmarshal(m.Payload, &letter) == nil {
					dead = append(dead, letter)
				}
			}
		}
		if strings.HasPrefix(topic, "$") {
			continue
		}
		var final []chaos.Stored
		for _, m := range log {
			final = append(final, chaos.Stored{Seq: m.Seq, ID: m.ID,
				Value: value(m.Payload)})
		}
		l.history.SetFinal(topic, final)
	}
	l.history.SetDeadLetters(dead)
	late := popsub.RetryWindow + commitTime
	if l.kind == Article {
		late = articleTick + commitTime
	}
	var checks []Check
	for _, p := range chaos.Promises(l.history, brokerOptions.AckTimeout,
		late, time.Now()) {
		if why := unmade[p.Name]; l.kind == Article && why != "" {
			p = chaos.Promise{Name: p.Name}
			checks = append(checks, Check{Promise: p, Unmade: why})
			continue
		}
		if l.kind == Article { // its deliveries have no seq and no attempt
			for i, e := range p.Examples {
				p.Examples[i] = strings.Replace(e, "seq 0, attempt 0 at",
					"delivered at", 1)
			}
		}
		checks = append(checks, Check{Promise: p})
	}
	return checks
}

// currentDisk returns the disk the broker runs on now.
func (l *Lab) currentDisk() *Disk {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.disk
}

// value decodes a payload the lab's clients publish: a JSON string.
func value(payload []byte) string {
	var v string
	if json.Unmarshal(payload, &v) != nil {
		return string(payload)
	}
	return v
}

// History returns the run's events, as JSON: two runs of the same seed
// and clicks return the same bytes.
func (l *Lab) History() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	data, _ := json.Marshal(l.events)
	return data
}

// nobody is the ResponseWriter a link's request is served with: the
// broker writes to it only to refuse a connection over MaxConnections,
// which the lab does not set.
type nobody struct{}

func (nobody) Header() http.Header         { return http.Header{} }
func (nobody) Write(p []byte) (int, error) { return len(p), nil }
func (nobody) WriteHeader(int)             {}

// sortedTopics returns m's keys in order.
func sortedTopics[V any](m map[string]V) []string {
	topics := make([]string, 0, len(m))
	for topic := range m {
		if !strings.HasPrefix(topic, "$") {
			topics = append(topics, topic)
		}
	}
	slices.SortFunc(topics, cmp.Compare)
	return topics
}
