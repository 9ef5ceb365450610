package popsub

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/queue"
	"github.com/popsub/popsub/socket"
	"github.com/popsub/popsub/wire"
	bolt "go.etcd.io/bbolt"
)

// This file tests what lies behind the Store seam, the clocks that drive
// retries and retention (in fake time, with testing/synctest), and what
// survives a crash.

// TestMain lets the crash test run this binary as a broker it can kill.
func TestMain(m *testing.M) {
	if path := os.Getenv("POPSUB_TEST_CHILD_DB"); path != "" {
		serveChild(path)
		return
	}
	// Every quiet moment parks a socket (socket.IdleAfter), so that the
	// suite's connections go to the poller and back as often as can be.
	socket.IdleAfter = 0
	code := m.Run()
	// Every frame the tests saw, held to docs/asyncapi.json
	// (schema_test.go).
	if err := validateRecorded(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// serveChild runs a broker on 127.0.0.1 over the bbolt file at path and
// prints its address. It exits by itself after a minute.
func serveChild(path string) {
	time.AfterFunc(time.Minute, func() { os.Exit(3) })
	store, err := OpenBolt(path, quietLogger)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	b, err := New(Options{Secret: testSecret, Store: store,
		MaxMessages: 1 << 20, Logger: quietLogger})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(listener.Addr())
	http.Serve(listener, b)
}

// storeContract checks the Store promises any implementation must keep.
func storeContract(t *testing.T, store Store) {
	message := func(seq uint64) *Message {
		return &Message{Topic: "t", ID: fmt.Sprint("m", seq), Seq: seq,
			Timestamp: int64(seq), Payload: json.RawMessage(`1`)}
	}
	commit := func(b *Batch) {
		t.Helper()
		if err := store.Commit(b); err != nil {
			t.Fatalf("Commit: %v", err)
		}
	}
	read := func(after uint64, limit int) []uint64 {
		t.Helper()
		msgs, err := store.Read("t", after, limit, 1<<30)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		var out []uint64
		for _, m := range msgs {
			out = append(out, m.Seq)
		}
		return out
	}

	commit(&Batch{Messages: []*Message{message(1), message(2), message(3)},
		Cursors: map[string]uint64{"k": 2}})
	if got := read(1, 10); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("read after 1 = %v, want [2 3]", got)
	}
	if got := read(0, 2); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("read limit 2 = %v, want [1 2]", got)
	}
	commit(&Batch{Trims: map[string]uint64{"t": 3}})
	if got := read(0, 10); len(got) != 0 {
		t.Fatalf("read after trimming all = %v, want none", got)
	}
	heads, err := store.Topics()
	if err != nil || heads["t"] != 3 {
		t.Fatalf("Topics = %v, %v; want t at head 3 after trimming", heads,
			err)
	}
	if position, ok, err := store.Cursor("k"); position != 2 || !ok ||
		err != nil {
		t.Fatalf("Cursor(k) = %d, %v, %v; want 2", position, ok, err)
	}
	if _, ok, _ := store.Cursor("missing"); ok {
		t.Fatal("Cursor(missing) found a cursor")
	}

	// A head is set as it is given, higher (a reservation, on a topic
	// with no message yet too) or lower (given back at a clean stop),
	// and an append after it raises it again.
	wantHeads := func(want map[string]uint64) {
		t.Helper()
		heads, err := store.Topics()
		if err != nil || !maps.Equal(heads, want) {
			t.Fatalf("Topics = %v, %v; want %v", heads, err, want)
		}
	}
	commit(&Batch{Heads: map[string]uint64{"t": 100, "new": 50}})
	wantHeads(map[string]uint64{"t": 100, "new": 50})
	commit(&Batch{Messages: []*Message{message(4)},
		Heads: map[string]uint64{"t": 4}})
	wantHeads(map[string]uint64{"t": 4, "new": 50})
	commit(&Batch{Messages: []*Message{message(5)}})
	wantHeads(map[string]uint64{"t": 5, "new": 50})
	// A log trimmed empty takes appends again.
	if got := read(0, 10); !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("read after appends to an emptied log = %v, want [4 5]",
			got)
	}

	// A Forgetter deletes a topic whole, its messages and its head, and
	// its floor keeps the highest head forgotten, beside the keys of the
	// cursors, which a forget leaves; a head set after the
	// forget, in the same batch, is a new topic's. A forget of a name it
	// does not have raises the floor alone.
	forgetter, ok := store.(Forgetter)
	if !ok {
		t.Fatal("the store is no Forgetter")
	}
	wantFloor := func(want uint64) {
		t.Helper()
		floor, err := forgetter.Floor()
		keys, err2 := forgetter.CursorKeys()
		if floor != want || !slices.Equal(keys, []string{"k"}) ||
			cmp.Or(err, err2) != nil {
			t.Fatalf("Floor = %d, CursorKeys = %q (%v, %v); want %d and k",
				floor, keys, err, err2, want)
		}
	}
	wantFloor(0)
	commit(&Batch{Forgets: map[string]uint64{"t": 5, "never": 2}})
	wantHeads(map[string]uint64{"new": 50})
	wantFloor(5)
	if got := read(0, 10); len(got) != 0 {
		t.Fatalf("read of a forgotten topic = %v, want none", got)
	}
	commit(&Batch{Forgets: map[string]uint64{"new": 50},
		Heads: map[string]uint64{"new": 60}})
	wantHeads(map[string]uint64{"new": 60})
	wantFloor(50)
	commit(&Batch{Forgets: map[string]uint64{"new": 7}})
	wantHeads(map[string]uint64{})
	wantFloor(50)

	// The reserve counts in the floor while it is higher, and is set as
	// it is, lower too; it is no cursor, and leaves heads alone.
	reserve := func(upTo uint64) *uint64 { return &upTo }
	commit(&Batch{Reserve: reserve(90)})
	wantFloor(90)
	commit(&Batch{Reserve: reserve(20)})
	wantFloor(50)
	commit(&Batch{Reserve: reserve(0)})
	wantFloor(50)
	wantHeads(map[string]uint64{})
	commit(&Batch{Messages: []*Message{message(51)}})
	if got := read(0, 10); !slices.Equal(got, []uint64{51}) {
		t.Fatalf("read after an append to a forgotten topic = %v, want "+
			"[51]", got)
	}
}

func TestStore_Contract(t *testing.T) {
	t.Run("the memory store keeps it", func(t *testing.T) {
		storeContract(t, newMemoryStore())
	})
	t.Run("the bbolt store keeps it", func(t *testing.T) {
		store := openBolt(t, filepath.Join(t.TempDir(), "popsub.db"))
		defer store.Close()
		storeContract(t, store)
	})
}

// A record whose checksum fails is skipped by the bbolt store; the
// broker replays past it without stalling.
func TestBoltStore_ACorruptRecordIsSkippedNeverDelivered(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	store := openBolt(t, path)
	var batch Batch
	for seq := uint64(1); seq <= 3; seq++ {
		batch.Messages = append(batch.Messages, &Message{
			Topic: "t", ID: fmt.Sprint(seq), Seq: seq,
			Payload: json.RawMessage(`"good"`)})
	}
	if err := store.Commit(&batch); err != nil {
		t.Fatal(err)
	}
	store.Close()
	corrupt(t, path, "t", 2, 3)

	// The broker replays 1, skips the two bad records without stalling,
	// and goes live for 4.
	ts := startBroker(t, Options{Store: openBolt(t, path)})
	reader := ts.dial("reader")
	reader.subscribe("t", nil)
	wantSeqs(t, reader.messages(1), []uint64{1})
	ts.dial("p").publish("t", "new", 1, "")
	wantSeqs(t, reader.messages(1), []uint64{4})
}

// corrupt flips one byte in the payload of each of topic's records at
// seqs, in the bbolt file at path, laid out as package boltstore says.
func corrupt(t *testing.T, path, topic string, seqs ...uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		records := tx.Bucket([]byte("topics")).Bucket([]byte(topic)).
			Bucket([]byte("log"))
		for _, seq := range seqs {
			key := binary.BigEndian.AppendUint64(nil, seq)
			record := slices.Clone(records.Get(key))
			record[len(record)-3] ^= 0x01
			if err := records.Put(key, record); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// fakeConnection is a connection with no socket, for fake-time tests and
// benchmarks: its frames collect in its outbox, and its writer only
// signals wake. Whoever takes the frames plays the writer.
func fakeConnection(b *Broker, sub string) (c *connection,
	wake chan struct{}) {
	c = &connection{broker: b, subject: sub, remote: "test", claims: &Claims{},
		ws:            closedSocket{},
		room:          make(chan struct{}, 1),
		done:          make(chan struct{}),
		subscriptions: map[string]*subscription{},
		unacked:       map[string]*pendingQueue{}}
	wake = make(chan struct{}, 1)
	c.outbox = queue.NewOutbox(1<<20, func() { queue.Notify(wake) }, nil)
	b.register(c)
	return c, wake
}

// closedSocket is a fake connection's socket, closed from the start: its
// frames go through the outbox, which the test reads itself.
type closedSocket struct{}

func (closedSocket) Read() ([]byte, error)                    { return nil, net.ErrClosed }
func (closedSocket) SetReadLimit(int64)                       {}
func (closedSocket) Send([][]byte, bool) error                { return net.ErrClosed }
func (closedSocket) Ping(context.Context) error               { return net.ErrClosed }
func (closedSocket) Close(websocket.StatusCode, string) error { return nil }
func (closedSocket) CloseNow() error                          { return nil }
func (closedSocket) Idle(func())                              {}

// taken holds the frames a fake connection's writer took from its
// outbox that no test has read yet, by connection.
var taken sync.Map

// nextFrame takes the next frame from a fake connection's outbox, as its
// writer would: an outbox found empty is marked idle, so that the next
// push starts the writer and signals wake.
func nextFrame(t *testing.T, c *connection, wake chan struct{}) got {
	t.Helper()
	for {
		v, _ := taken.Load(c)
		frames, _ := v.([][]byte)
		if len(frames) == 0 {
			if frames = c.outbox.Take(nil); len(frames) == 0 {
				<-wake
				continue
			}
		}
		taken.Store(c, frames[1:])
		var g got
		if err := json.Unmarshal(frames[0], &g); err != nil {
			t.Fatal(err)
		}
		return g
	}
}

func TestBroker_RetryScheduleInFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, worker, wake := fakeBroker(t, Options{})

		// With the defaults, five seconds, five retries and a backoff of
		// 2 up to a minute, the gaps between the six attempts are 5, 10,
		// 20, 40 and 60 seconds (80, capped), each retry's less up to a
		// fifth of jitter, and late by RetryWindow at the most.
		last := time.Now()
		b.publish(&Message{Topic: "jobs", ID: "j", QoS: 1,
			Payload: json.RawMessage(`1`)}, nil, nil)
		nominal := []time.Duration{0, 5 * time.Second, 10 * time.Second,
			20 * time.Second, 40 * time.Second, time.Minute}
		for attempt := 1; attempt <= 6; attempt++ {
			g := nextFrame(t, worker, wake)
			gap, want := time.Since(last), nominal[attempt-1]
			least := want
			if attempt > 2 {
				least = want * 4 / 5
			}
			if g.Attempt != attempt || gap < least || gap > want+RetryWindow {
				t.Fatalf("attempt %d came %v after the one before, want "+
					"%v to %v", g.Attempt, gap, least, want+RetryWindow)
			}
			last = time.Now()
		}

		// After the last retry times out, a minute on, the message is
		// dead-lettered.
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if head := b.topic("$dead/jobs").headNow(); head != 1 {
			t.Fatalf("$dead/jobs head = %d, want 1", head)
		}
		if n := pendingCount(b); n != 0 {
			t.Fatalf("pending = %d after dead-lettering, want 0", n)
		}
	})
}

func TestBroker_NegativeMaxRetriesMeansNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, worker, wake := fakeBroker(t, Options{MaxRetries: -1})
		b.publish(&Message{Topic: "jobs", ID: "j", QoS: 1,
			Payload: json.RawMessage(`1`)}, nil, nil)
		if g := nextFrame(t, worker, wake); g.Attempt != 1 {
			t.Fatalf("got attempt %d, want 1", g.Attempt)
		}

		// One ack timeout later it is a dead letter, with no retry
		// between (five retries would take thirty seconds).
		time.Sleep(DefaultAckTimeout + time.Second)
		synctest.Wait()
		if head := b.topic("$dead/jobs").headNow(); head != 1 {
			t.Fatalf("$dead/jobs head = %d, want 1", head)
		}
	})
}

// A message on disk leaves the broker's memory once synced: replay
// reads it from the log, and the list of what is not on disk yet must
// not keep it, payload and frame, for as long as its topic stays quiet.
// Kept, 200 topics with one 64 KiB message each held 29 MiB of heap
// after retention had taken every one from the log.
func TestBroker_ASyncedMessageLeavesMemory(t *testing.T) {
	b, err := New(Options{Secret: testSecret, Logger: quietLogger,
		Store: openBolt(t, filepath.Join(t.TempDir(), "popsub.db"))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	var synced []weak.Pointer[Message]
	for i := range 4 {
		// Two topics, two messages each, a batch each: the last of
		// each is what a topic that then stays quiet kept.
		m := &Message{Topic: fmt.Sprint("quiet/", i%2), ID: fmt.Sprint(i),
			QoS: 1, Payload: json.RawMessage(`"` +
				strings.Repeat("x", 64<<10) + `"`)}
		_, _, stored := b.publish(m, nil, nil)
		<-stored.Done()
		if stored.Err() != nil {
			t.Fatal(stored.Err())
		}
		synced = append(synced, weak.Make(m))
	}
	// The committer's next batch lets go of the last one's batch.
	if _, err := b.Publish(context.Background(), "other", 1, 1); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	for i, m := range synced {
		if m.Value() != nil {
			t.Errorf("message %d is still in memory after its sync", i)
		}
	}
}

func TestOptions_ANegativeLimitIsRefused(t *testing.T) {
	for _, opts := range []Options{{AckTimeout: -time.Second},
		{MaxInflight: -1}, {FeatureOptions: FeatureOptions{PublishRate: -2}}} {
		opts.Secret, opts.Store = testSecret, newMemoryStore()
		if b, err := New(opts); err == nil {
			b.Shutdown(context.Background())
			t.Errorf("New(%+v) took a negative limit", opts)
		}
	}
}

func TestBroker_RetentionInFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newMemoryStore()
		b, err := New(Options{Secret: testSecret, Store: store,
			TTL: time.Minute, Logger: quietLogger})
		if err != nil {
			t.Fatal(err)
		}
		publish := func() {
			b.publish(&Message{Topic: "t", ID: wire.NewMessageID(),
				Payload: json.RawMessage(`1`)}, nil, nil)
		}
		publish()
		publish()
		time.Sleep(40 * time.Second)
		publish()

		// Nobody reads the topic: the broker expires the first two by
		// itself, within a tick (a tenth of the TTL) of their deadline.
		time.Sleep(27 * time.Second)
		synctest.Wait()
		msgs, _ := store.Read("t", 0, 10, 1<<30)
		if len(msgs) != 1 || msgs[0].Seq != 3 {
			t.Fatalf("log holds %d messages, want only seq 3", len(msgs))
		}
		b.Shutdown(context.Background())
	})
}

// child is a broker process the crash test can kill.
type child struct {
	cmd *exec.Cmd
	url string
}

// startChild runs this test binary as a broker over the file at path.
func startChild(t *testing.T, path string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "POPSUB_TEST_CHILD_DB="+path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error") {
		t.Fatalf("child broker: %q, %v", line, err)
	}
	return &child{cmd: cmd,
		url: "ws://" + strings.TrimSpace(line) + "/ws"}
}

// crashLedger is what the crash test saw: confirms and deliveries.
type crashLedger struct {
	mu        sync.Mutex
	confirmed map[string]bool // message ids whose publish was confirmed
	delivered map[string]int  // message ids → deliveries to the durable
}

// subscribeDurably reads the durable subscription "billing" on url until
// the connection breaks or until stop returns true, acking everything.
func (l *crashLedger) subscribeDurably(t *testing.T, url string,
	stop func(got) bool) {
	c := dialRaw(t, url, "billing")
	c.send(map[string]any{"type": "auth", "token": token(t, "billing")})
	c.expect("authenticated")
	c.send(map[string]any{"type": "subscribe", "topic": "ledger",
		"durable": "billing"})
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			return
		}
		record(t, false, data)
		var g got
		json.Unmarshal(data, &g)
		if g.Type != "message" {
			continue
		}
		l.mu.Lock()
		l.delivered[g.MessageID]++
		l.mu.Unlock()
		ack, _ := json.Marshal(map[string]any{"type": "ack",
			"message_id": g.MessageID, "topic": "ledger"})
		c.ws.Write(context.Background(), 1, ack)
		if stop != nil && stop(g) {
			return
		}
	}
}

// publishUntilKilled publishes QoS 1 messages without waiting, records
// every confirm, and kills the broker once enough confirms are in.
func (l *crashLedger) publishUntilKilled(t *testing.T, broker *child,
	round int) {
	publisher := dialRaw(t, broker.url, "publisher")
	publisher.send(map[string]any{"type": "auth",
		"token": token(t, "publisher")})
	publisher.expect("authenticated")
	go func() {
		for i := range 3000 {
			data, _ := json.Marshal(map[string]any{"type": "publish",
				"topic": "ledger", "payload": i, "qos": 1,
				"message_id": fmt.Sprintf("r%d-%d", round, i)})
			if publisher.ws.Write(context.Background(), 1, data) != nil {
				return
			}
		}
	}()
	for range 300 {
		g := publisher.expect("published")
		l.mu.Lock()
		l.confirmed[g.MessageID] = true
		l.mu.Unlock()
	}
	broker.cmd.Process.Kill()
	broker.cmd.Wait()
}

func TestBroker_KillNineKeepsEveryConfirmedMessage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	ledger := &crashLedger{confirmed: map[string]bool{},
		delivered: map[string]int{}}

	// Three times: a durable subscriber reads and acks while a publisher
	// streams QoS 1 messages, and the broker dies with SIGKILL mid-way.
	for round := range 3 {
		broker := startChild(t, path)
		var wg sync.WaitGroup
		wg.Go(func() { ledger.subscribeDurably(t, broker.url, nil) })
		ledger.publishUntilKilled(t, broker, round)
		wg.Wait()
	}

	// After the last crash the subscriber resumes; a sentinel published
	// behind everything marks when it has caught up.
	broker := startChild(t, path)
	var wg sync.WaitGroup
	wg.Go(func() {
		ledger.subscribeDurably(t, broker.url, func(g got) bool {
			return g.MessageID == "sentinel"
		})
	})
	publisher := dialRaw(t, broker.url, "publisher")
	publisher.send(map[string]any{"type": "auth",
		"token": token(t, "publisher")})
	publisher.expect("authenticated")
	publisher.publish("ledger", "end", 1, "sentinel")
	wg.Wait()
	ledger.report(t)
}

// report counts, as Jepsen's queue checker does: confirmed messages never
// delivered (lost, must be 0), duplicates, and unconfirmed deliveries.
func (l *crashLedger) report(t *testing.T) {
	lost, duplicated, unconfirmed := 0, 0, 0
	for id := range l.confirmed {
		if l.delivered[id] == 0 {
			lost++
		}
	}
	for id, n := range l.delivered {
		if n > 1 {
			duplicated++
		}
		if !l.confirmed[id] && id != "sentinel" {
			unconfirmed++
		}
	}
	t.Logf("confirmed %d, delivered %d, lost %d, duplicated %d, "+
		"delivered but unconfirmed %d", len(l.confirmed), len(l.delivered),
		lost, duplicated, unconfirmed)
	if lost != 0 {
		t.Fatalf("%d confirmed messages were never delivered", lost)
	}
}

// powerStore is a memoryStore behind a disk that can stop syncing and
// then lose power: a commit held when the power goes never happened.
type powerStore struct {
	*memoryStore
	mu   sync.Mutex
	held chan struct{} // non-nil while commits wait for the disk
	lost bool          // the power went: every commit fails
}

// Commit waits while the disk is held, then commits unless the power
// went meanwhile.
func (s *powerStore) Commit(batch *Batch) error {
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if held != nil {
		<-held
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost {
		return errors.New("power lost")
	}
	return s.memoryStore.Commit(batch)
}

// hold makes commits wait, as a disk that has not synced yet.
func (s *powerStore) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = make(chan struct{})
}

// powerLoss loses every commit not yet made, and returns what the disk
// kept, for the next broker to start on.
func (s *powerStore) powerLoss() *memoryStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.memoryStore.Copy()
	s.lost = true
	if s.held != nil {
		close(s.held)
	}
	return kept
}

// Deliveries leave before the disk syncs; the power then goes. A
// subscriber resuming with "after" misses nothing and never sees a seq it
// saw given to another message, and every confirmed message survives.
func TestBroker_PowerLossReusesNoSeqAndLosesNoConfirm(t *testing.T) {
	store := &powerStore{memoryStore: newMemoryStore()}
	ts := startBroker(t, Options{Store: store})
	sub, pub := ts.dial("sub"), ts.dial("pub")
	sub.subscribe("jobs", nil)
	seen := map[uint64]string{}
	receive := func(c *client, n int) (last uint64) {
		t.Helper()
		for range n {
			g := c.expect("message")
			if id, ok := seen[g.Seq]; ok && id != g.MessageID {
				t.Fatalf("seq %d was %s, and now is %s", g.Seq, id,
					g.MessageID)
			}
			seen[g.Seq], last = g.MessageID, g.Seq
		}
		return last
	}
	for i := range 3 {
		pub.publish("jobs", i, 1, fmt.Sprint("confirmed-", i))
	}
	receive(sub, 3)

	// The disk stops syncing: deliveries go on without it, and the
	// confirms wait for it.
	store.hold()
	for i := range 3 {
		pub.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": i, "qos": 1, "message_id": fmt.Sprint("unconfirmed-", i)})
	}
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": "at most once", "message_id": "qos0"})
	last := receive(sub, 4)

	// The power goes. The publisher sends again what it never heard
	// confirmed, and something new; the subscriber resumes after the
	// last seq it saw, on a broker started from what the disk kept.
	ts2 := startBroker(t, Options{Store: store.powerLoss()})
	ts.stop()
	sub, pub = ts2.dial("sub"), ts2.dial("pub")
	sub.subscribe("jobs", map[string]any{"after": last})
	pub.publish("jobs", "new", 1, "confirmed-new")
	for i := range 3 {
		pub.publish("jobs", i, 1, fmt.Sprint("unconfirmed-", i))
	}
	receive(sub, 4)

	// Nothing confirmed is lost: a reader from the start gets it all.
	reader := ts2.dial("reader")
	reader.subscribe("jobs", nil)
	var ids []string
	for range 7 {
		ids = append(ids, reader.expect("message").MessageID)
	}
	want := []string{"confirmed-0", "confirmed-1", "confirmed-2",
		"confirmed-new", "unconfirmed-0", "unconfirmed-1", "unconfirmed-2"}
	if !slices.Equal(ids, want) {
		t.Fatalf("after the power loss the log holds %v, want %v", ids, want)
	}
}

// release lets held commits through, as a disk that caught up.
func (s *powerStore) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
}

// A subscriber that joins while the disk is behind replays the store and
// then the messages not on it yet, from memory, with no gap, and turns
// live at the head.
func TestBroker_ReplayReadsWhatTheDiskHasNotYet(t *testing.T) {
	store := &powerStore{memoryStore: newMemoryStore()}
	ts := startBroker(t, Options{Store: store})
	pub := ts.dial("pub")
	for i := range 100 {
		pub.publish("t", i, 1, "")
	}
	store.hold()
	for i := range 200 {
		pub.publish("t", i, 0, "")
	}
	pub.quiet()

	sub := ts.dial("sub")
	sub.subscribe("t", nil)
	wantSeqs(t, sub.messages(300), span(1, 300))
	store.release()
	pub.publish("t", "after", 1, "")
	wantSeqs(t, sub.messages(1), []uint64{301})
}

// awayStore is a memoryStore that refuses every commit while away is
// set, as a log on NATS does while NATS restarts.
type awayStore struct {
	*memoryStore
	away    atomic.Bool
	refused atomic.Int64 // commits refused while away
}

// Commit fails while the store is away.
func (s *awayStore) Commit(batch *Batch) error {
	if s.away.Load() {
		s.refused.Add(1)
		return errors.New("the log is away")
	}
	return s.memoryStore.Commit(batch)
}

func TestCommitter_RetriesACursorMoveThatFailed(t *testing.T) {
	// A durable subscriber acks while the log is away, and then acks
	// nothing more: once the log is back, its cursor must still get
	// there, or it would resume behind what it acked.
	store := &awayStore{memoryStore: newMemoryStore()}
	ts := startBroker(t, Options{Store: store})
	alice := ts.dial("alice")
	alice.subscribe("orders", map[string]any{"durable": "billing"})
	ts.dial("shop").publish("orders", "one", 1, "")
	got := alice.expect("message")

	store.away.Store(true)
	alice.ack(got)
	waitFor(t, func() bool { return store.refused.Load() > 0 },
		"the ack's commit to be refused")
	store.away.Store(false)
	waitFor(t, func() bool {
		position, _, _ := store.Cursor("alice\x00billing\x00orders")
		return position == got.Seq
	}, "the cursor to reach the log once it is back")
}
