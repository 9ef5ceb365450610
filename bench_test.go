package popsub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/login"
	"github.com/popsub/popsub/wire"
	bolt "go.etcd.io/bbolt"
)

// Benchmarks for the hot paths. Speed is measured here and with popsub
// bench, never asserted in tests: these machines are shared and noisy.
// docs/performance.md records what they showed.

func BenchmarkDecodeFrame(b *testing.B) {
	data := []byte(`{"type":"publish","topic":"bench/0","qos":1,` +
		`"payload":{"p":0,"n":123,"t":1795997686774000000,"x":"xxxxxxxx"}}`)
	for b.Loop() {
		decodeFrame(data)
	}
}

func BenchmarkAppendDelivery(b *testing.B) {
	m := &Message{Topic: "bench/0", ID: wire.NewMessageID(), Seq: 123456, QoS: 1,
		Timestamp: 1795997686774, Payload: json.RawMessage(
			`{"p":0,"n":123,"t":1795997686774000000,"x":"xxxxxxxx"}`)}
	buffer := make([]byte, 0, 256)
	for b.Loop() {
		buffer = appendDelivery(buffer[:0], m, 1)
	}
}

// BenchmarkFanOut measures one committed message offered to N live
// subscribers: the per-delivery cost without sockets or disk.
func BenchmarkFanOut(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			broker := newBenchBroker(b)
			defer broker.Shutdown(context.Background())
			t := broker.topic("bench")
			var connections []*connection
			for i := range n {
				c, _ := fakeConnection(broker, fmt.Sprint("s", i))
				defer broker.unregister(c)
				connections = append(connections, c)
				s := c.newSubscription("bench", broker.pinTopic("bench"), "")
				s.live = true
				t.subscribers[s] = struct{}{}
			}
			m := &Message{Topic: "bench", ID: "id", Seq: 1,
				Payload: json.RawMessage(`"x"`)}
			// Each round also takes the frame out of every outbox, as
			// the writers would.
			var drained [][]byte
			for b.Loop() {
				t.mu.Lock()
				broker.fanOut(t, m, nil)
				t.mu.Unlock()
				for _, c := range connections {
					drained = c.outbox.Take(drained[:0])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/
				float64(b.N*n), "ns/delivery")
		})
	}
}

// BenchmarkPublishOverSockets measures what a delivery costs end to end
// over real WebSockets on 127.0.0.1, as an outsider's client sends it:
// one publish per frame, QoS 0, at most 2,000 messages ahead of the
// slowest subscriber. It covers the writer's framing and the coalescing
// of one read's worth of publishes into one write per subscriber
// (wakeups). The client shares the machine, so the figure is an upper
// bound on the broker's own cost; popsub bench and docs/compare read the
// server's CPU on its own.
func BenchmarkPublishOverSockets(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			broker := newBenchBroker(b)
			server := httptest.NewServer(broker)
			defer server.Close()
			defer broker.Shutdown(context.Background())
			url := "ws" + strings.TrimPrefix(server.URL, "http")
			received := make([]atomic.Int64, n)
			for i := range n {
				ws := dialBench(b, url)
				defer ws.CloseNow()
				writeFrame(b, ws, `{"type":"subscribe","topic":"bench"}`)
				ws.Read(context.Background())
				go countDeliveries(ws, &received[i])
			}
			publisher := dialBench(b, url)
			defer publisher.CloseNow()
			slowest := func() int64 {
				low := received[0].Load()
				for i := range received {
					low = min(low, received[i].Load())
				}
				return low
			}
			publish := []byte(`{"type":"publish","topic":"bench",` +
				`"payload":{"x":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}`)
			sent := int64(0)
			for b.Loop() {
				for sent-slowest() >= 2000 {
					time.Sleep(20 * time.Microsecond)
				}
				publisher.Write(context.Background(), websocket.MessageText,
					publish)
				sent++
			}
			for slowest() < sent {
				time.Sleep(100 * time.Microsecond)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/
				float64(b.N*n), "ns/delivery")
		})
	}
}

// countDeliveries counts the deliveries a subscriber reads until its
// socket closes.
func countDeliveries(ws *websocket.Conn, count *atomic.Int64) {
	for {
		_, data, err := ws.Read(context.Background())
		if err != nil {
			return
		}
		count.Add(int64(bytes.Count(data, []byte(`"type":"message"`))))
	}
}

// newBenchBroker starts a broker on a store in memory.
func newBenchBroker(b *testing.B) *Broker {
	broker, err := New(Options{Secret: testSecret, Store: newMemoryStore(),
		Logger: quietLogger})
	if err != nil {
		b.Fatal(err)
	}
	return broker
}

// BenchmarkPublishQoS1 measures publishes that wait for their confirm,
// one publisher at a time and 64 at once: group commit lets the 64 share
// each disk sync.
func BenchmarkPublishQoS1(b *testing.B) {
	for _, publishers := range []int{1, 64} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			store, err := OpenBolt(filepath.Join(b.TempDir(), "b.db"),
				quietLogger)
			if err != nil {
				b.Fatal(err)
			}
			broker, err := New(Options{Secret: testSecret, Store: store,
				Logger: quietLogger, MaxMessages: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer broker.Shutdown(context.Background())
			b.SetParallelism(publishers)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := broker.Publish(context.Background(),
						"bench", 1, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "confirms/s")
		})
	}
}

// BenchmarkLoginFlood measures what a login flood costs a bystander: 64
// sockets at a time guess passwords, each hanging up 50 ms after its
// guess and dialling again, while an authenticated client pings; each
// round is one ping and its pong. The user's hash is a real one
// (600,000 rounds). "strangers" guess before authenticating, all from
// 127.0.0.1, as a script would; "tokens" guess after authenticating,
// where no auth timeout bounds a guess and only the hashes' turns do.
// docs/security.md quotes it.
func BenchmarkLoginFlood(b *testing.B) {
	hash, err := login.Hash("correct horse")
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"strangers", "tokens"} {
		b.Run(mode, func(b *testing.B) {
			url := loginBroker(b, hash)
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			for range 64 {
				go guessUntil(ctx, url, mode == "tokens")
			}
			time.Sleep(time.Second) // the flood under way
			bystander := dialBench(b, url)
			var rtts []time.Duration
			for b.Loop() {
				start := time.Now()
				writeFrame(b, bystander, `{"type":"ping"}`)
				if _, _, err := bystander.Read(ctx); err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, time.Since(start))
				time.Sleep(10 * time.Millisecond)
			}
			slices.Sort(rtts)
			ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
			b.ReportMetric(ms(rtts[len(rtts)/2]), "p50-ms")
			b.ReportMetric(ms(rtts[len(rtts)*99/100]), "p99-ms")
			b.ReportMetric(ms(rtts[len(rtts)-1]), "max-ms")
		})
	}
}

// BenchmarkLoginBesideGuessers is alice logging in, on a fresh
// connection from the same address, while eight sockets guess her
// password, each guessing again as soon as it hears its answer and
// reconnecting when it is closed: the time to her token, and how many of
// her logins were refused. Run it with -benchtime=10x: each login costs
// a real hash, a quarter of a second of a core.
func BenchmarkLoginBesideGuessers(b *testing.B) {
	hash, err := login.Hash("correct horse")
	if err != nil {
		b.Fatal(err)
	}
	url := loginBroker(b, hash)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	for range 8 {
		go guessOnOneSocket(ctx, url)
	}
	time.Sleep(2 * time.Second) // the guessing under way
	login := `{"type":"login","username":"alice","password":"correct horse"}`
	var waits []time.Duration
	refused := 0
	for b.Loop() {
		alice := dialRawBench(b, url)
		start := time.Now()
		writeFrame(b, alice, login)
		_, data, err := alice.Read(ctx)
		if err != nil || !bytes.Contains(data, []byte("login_response")) {
			refused++
		}
		waits = append(waits, time.Since(start))
		alice.CloseNow()
		time.Sleep(500 * time.Millisecond)
	}
	slices.Sort(waits)
	ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
	b.ReportMetric(ms(waits[len(waits)/2]), "p50-ms")
	b.ReportMetric(ms(waits[len(waits)-1]), "max-ms")
	b.ReportMetric(float64(refused), "refused")
}

// loginBroker serves a broker whose user alice has the password hash,
// for the benchmark, and returns its WebSocket URL.
func loginBroker(b *testing.B, hash string) string {
	broker, err := New(Options{Secret: testSecret, Store: newMemoryStore(),
		Logger: quietLogger, FeatureOptions: FeatureOptions{
			Users: map[string]User{"alice": {PasswordHash: hash}}}})
	if err != nil {
		b.Fatal(err)
	}
	server := httptest.NewServer(broker)
	b.Cleanup(func() {
		server.Close()
		broker.Shutdown(context.Background())
	})
	return "ws" + strings.TrimPrefix(server.URL, "http") + "/ws"
}

// guessOnOneSocket guesses alice's password on one socket, again as soon
// as each answer comes, and on a new socket when the broker closes it,
// until ctx ends.
func guessOnOneSocket(ctx context.Context, url string) {
	guess := []byte(`{"type":"login","username":"alice","password":"x"}`)
	for ctx.Err() == nil {
		ws, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			continue
		}
		for ctx.Err() == nil {
			if ws.Write(ctx, websocket.MessageText, guess) != nil {
				break
			}
			if _, _, err := ws.Read(ctx); err != nil {
				break
			}
		}
		ws.CloseNow()
	}
}

// dialRawBench connects a client that has not authenticated.
func dialRawBench(b *testing.B, url string) *websocket.Conn {
	ws, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		b.Fatal(err)
	}
	return ws
}

// guessUntil guesses alice's password on one socket after another until
// ctx ends, authenticating first if authenticated is set, and hanging up
// 50 ms after each guess.
func guessUntil(ctx context.Context, url string, authenticated bool) {
	guess := []byte(`{"type":"login","username":"alice","password":"x"}`)
	tok, _ := NewToken(testSecret, "guesser", time.Hour)
	auth, _ := json.Marshal(map[string]string{"type": "auth", "token": tok})
	for ctx.Err() == nil {
		ws, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			continue
		}
		if authenticated {
			ws.Write(ctx, websocket.MessageText, auth)
			ws.Read(ctx)
		}
		ws.Write(ctx, websocket.MessageText, guess)
		wait, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		ws.Read(wait)
		cancel()
		ws.CloseNow()
	}
}

// dialBench connects and authenticates a client for a benchmark.
func dialBench(b *testing.B, url string) *websocket.Conn {
	ws, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		b.Fatal(err)
	}
	tok, _ := NewToken(testSecret, "bystander", time.Hour)
	writeFrame(b, ws, `{"type":"auth","token":"`+tok+`"}`)
	if _, _, err := ws.Read(context.Background()); err != nil {
		b.Fatal(err)
	}
	return ws
}

// writeFrame writes one text frame or fails the benchmark.
func writeFrame(b *testing.B, ws *websocket.Conn, frame string) {
	err := ws.Write(context.Background(), websocket.MessageText, []byte(frame))
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStart_WithAFullDelayedLog measures New on a bbolt file whose
// $delayed log holds as much as the default bounds let one topic (and
// one token) keep waiting: 10,000 small messages, or 64 MiB of large
// ones. Each op is one start, reading the log to count what waits (the
// index of when each is due stays on disk, bbolt's), and the Shutdown
// after it; heap-B/message is what a waiting message keeps of the
// broker's heap once started: nothing, until it is near due.
func BenchmarkStart_WithAFullDelayedLog(b *testing.B) {
	for _, payload := range []int{64, 256 << 10} {
		b.Run(fmt.Sprintf("payload=%d", payload), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "popsub.db")
			store := openBolt(b, path)
			body := json.RawMessage(`"` + strings.Repeat("x", payload) + `"`)
			due := time.Now().Add(time.Hour).UnixMilli()
			bytes, n := 0, 0
			for n < DefaultMaxDelayed {
				m := &Message{Topic: DelayedPrefix + "jobs",
					ID: fmt.Sprint("m", n), Seq: uint64(n + 1), QoS: 1,
					Timestamp: time.Now().UnixMilli(), Payload: body,
					DeliverAt: due, publisher: "alice"}
				if bytes+m.size() > DefaultMaxDelayedBytes {
					break
				}
				bytes, n = bytes+m.size(), n+1
				if err := store.Commit(&Batch{Messages: []*Message{m}}); err != nil {
					b.Fatal(err)
				}
			}
			store.Close()
			// What the waiting messages keep in memory once loaded: the
			// live heap of a broker started on this file, less that of
			// one started on an empty file.
			held, _ := liveHeap(b, path, nil)
			none, _ := liveHeap(b, filepath.Join(b.TempDir(), "empty.db"), nil)
			held -= none
			startEach(b, path)
			b.ReportMetric(float64(n), "messages")
			b.ReportMetric(held/float64(n), "heap-B/message")
		})
	}
}

// startEach starts a broker on the bbolt file at path, and shuts it
// down, once each op.
func startEach(b *testing.B, path string) {
	for b.Loop() {
		broker, err := New(Options{Secret: testSecret,
			Store: openBolt(b, path), Logger: quietLogger})
		if err != nil {
			b.Fatal(err)
		}
		broker.Shutdown(context.Background())
	}
}

// liveHeap is the live heap, in bytes, while a broker started on the
// bbolt file at path runs, less the heap before it started; and the same
// after forget, if not nil, has run on the broker.
func liveHeap(b *testing.B, path string,
	forget func(*Broker)) (started, forgot float64) {
	heap := func() float64 {
		// Twice: the first GC only moves what sync.Pools hold aside.
		var stats runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&stats)
		return float64(stats.HeapAlloc)
	}
	before := heap()
	broker, err := New(Options{Secret: testSecret, Store: openBolt(b, path),
		Logger: quietLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer broker.Shutdown(context.Background())
	started = heap() - before
	if forget != nil {
		forget(broker)
		forgot = heap() - before
	}
	return started, forgot
}

// BenchmarkTopics_ForgottenOnceEmptied measures what a topic costs once
// retention has taken all its messages: a bbolt file with 20,000 such
// topics, one message each, trimmed, as an hour of TTL leaves them (or
// a broker from before topics were forgotten). start-heap-B/topic is
// what each holds of the heap of a broker started on the file, before
// the TTL's trim runs; heap-B/topic what it holds once the trim has
// forgotten it; file-B/topic the bytes of the pages the topics take in
// the file after the Shutdown. Each op writes the file afresh, starts a
// broker, trims, and shuts it down.
func BenchmarkTopics_ForgottenOnceEmptied(b *testing.B) {
	const n = 20000
	empty := filepath.Join(b.TempDir(), "empty.db")
	base, _ := liveHeap(b, empty, nil)
	var started, forgot, file float64
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "popsub.db")
		writeEmptiedTopics(b, path, n)
		s, f := liveHeap(b, path, func(broker *Broker) {
			broker.trimExpired(time.Now().Add(2 * time.Hour))
			<-broker.log.Barrier().Done()
		})
		started, forgot = started+s-base, forgot+f-base
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		db.View(func(tx *bolt.Tx) error {
			stats := tx.Bucket([]byte("topics")).Stats()
			file += float64((stats.BranchPageN + stats.LeafPageN) *
				db.Info().PageSize)
			return nil
		})
		db.Close()
	}
	ops := float64(b.N) * n
	b.ReportMetric(started/ops, "start-heap-B/topic")
	b.ReportMetric(forgot/ops, "heap-B/topic")
	b.ReportMetric(file/ops, "file-B/topic")
}

// writeEmptiedTopics writes n topics to a bbolt file at path, one
// message each, then trims every one empty, as the TTL would.
func writeEmptiedTopics(b *testing.B, path string, n int) {
	store := openBolt(b, path)
	defer store.Close()
	var batch Batch
	trims := map[string]uint64{}
	for i := range n {
		topic := fmt.Sprintf("device/%d/temp", i)
		batch.Messages = append(batch.Messages, &Message{Topic: topic,
			ID: "m", Seq: 1, Payload: json.RawMessage(`21.5`)})
		trims[topic] = 1
	}
	for _, step := range []*Batch{&batch, {Trims: trims}} {
		if err := store.Commit(step); err != nil {
			b.Fatal(err)
		}
	}
}
