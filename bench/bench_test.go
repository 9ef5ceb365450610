package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/popsub/popsub/internal/built"
	"github.com/popsub/popsub/jetstream/natstest"
)

// config is Defaults with the built command (package internal/built):
// the servers Run starts, and the bystander's process, are that binary,
// as they are for popsub bench. Then change changes it.
func config(t *testing.T, change func(*Config)) Config {
	t.Helper()
	cfg := Defaults
	cfg.Popsub, cfg.JSON = built.PopsubFor(t), true
	change(&cfg)
	return cfg
}

// stuck is the deadline that ends a stuck run. The servers first build
// their pages' WebAssembly (awaitPages), which on a loaded 2-core machine
// took over a minute.
const stuck = 6 * time.Minute

// run runs cfg and returns its JSON summary.
func run(t *testing.T, cfg Config) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stuck)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatalf("bench: %v", err)
	}
	var result Result
	if err := json.Unmarshal(out.Bytes(), &result); err != nil {
		t.Fatalf("bench printed %q: %v", out.String(), err)
	}
	return result
}

// Each subscriber gets every message once, at either QoS, and Run
// measures the server it started: its CPU time per delivery.
func TestBench_CountsEveryDelivery(t *testing.T) {
	for _, qos := range []int{0, 1} {
		t.Run(fmt.Sprint("qos ", qos), func(t *testing.T) {
			r := run(t, config(t, func(c *Config) {
				c.Subscribers, c.QoS = 3, qos
				c.Duration, c.Window = 300*time.Millisecond, 50
			}))
			deliveredOnceEach(t, r, 3)
			if r.ServerCPUPerDeliv <= 0 {
				t.Errorf("no server CPU per delivery: %+v", r)
			}
		})
	}
}

// Several brokers on one NATS JetStream log: the publisher is on the
// first; the subscribers take the brokers in turn, so some hear it
// through the log.
func TestBench_SpreadsOverBrokersSharingALog(t *testing.T) {
	ns := natstest.Start(t)
	deliveredOnceEach(t, run(t, config(t, func(c *Config) {
		c.Brokers, c.NATS, c.Subscribers, c.QoS = 2, ns.ClientURL(), 3, 1
		c.Duration, c.Window = 300*time.Millisecond, 50
	})), 3)
}

// An open-loop burst beside a stuck subscriber: the others get every
// message, and the bystander's confirms are timed in a process of its
// own. (Whether the stuck one is cut off in so short a run depends on
// the kernel's socket buffers, so the test does not ask.)
func TestBench_BurstBesideAStuckSubscriberAndABystander(t *testing.T) {
	r := run(t, config(t, func(c *Config) {
		c.Subscribers, c.Stuck, c.Bystander = 2, 1, true
		c.Window, c.Burst, c.Size, c.Batch = 0, 2000, 1024, false
	}))
	deliveredOnceEach(t, r, 2)
	if r.Published != 2000 {
		t.Errorf("published %d, want the burst's 2000", r.Published)
	}
	if r.Bystanders == 0 || r.BystanderP99Milli <= 0 {
		t.Errorf("no bystander confirms timed: %+v", r)
	}
}

// deliveredOnceEach fails the test unless the bench published something
// and each of its subscribers received every message once.
func deliveredOnceEach(t *testing.T, r Result, subscribers int64) {
	t.Helper()
	if r.Published == 0 || r.Lost != 0 || r.Duplicated != 0 ||
		r.Delivered != subscribers*r.Published {
		t.Fatalf("published %d, delivered %d, lost %d, duplicated %d; "+
			"want every message to each of %d subscribers once",
			r.Published, r.Delivered, r.Lost, r.Duplicated, subscribers)
	}
}

// Idle holds its connections, and one publish reaches each of them; the
// server's /metrics counts them: a descriptor each, and no goroutine,
// since a connection quiet for a second waits in the poller.
// With a topic each, as an outsider counts, each hears the publish to
// its own.
func TestBench_IdleConnectionsAllHearOnePublish(t *testing.T) {
	for _, each := range []bool{false, true} {
		r := run(t, config(t, func(c *Config) {
			c.Idle, c.IdleWatch, c.IdleTopicEach = 50, 0, each
		}))
		if r.IdleConnections != 50 || r.FanOutMillis <= 0 ||
			r.ServerFDs < 50 || r.ServerGoroutines >= 50 {
			t.Fatalf("idle, a topic each %v: %+v; want 50 connections, a "+
				"fan-out time, at least 50 descriptors, and under 50 "+
				"goroutines", each, r)
		}
	}
}

// Delayed has its messages confirmed, past one token's bound of 10,000
// (a second token and topic take the rest), and reports the server's CPU
// while they wait.
func TestBench_DelayedWaitsConfirmedAndMeasured(t *testing.T) {
	r := run(t, config(t, func(c *Config) {
		c.Delayed, c.IdleWatch = 10_050, time.Second
	}))
	if r.DelayedWaiting != 10_050 || r.Publishers != 2 || r.Seconds < 1 ||
		r.ServerIdleCorePct < 0 || r.ServerPeakRSSMiB <= 0 {
		t.Fatalf("delayed: %+v; want 10,050 waiting from two tokens, "+
			"over a second, with the server's CPU and memory", r)
	}
}

// BystanderOnly publishes until interrupted, and prints each confirm's
// latency: what Bystander reads from its process.
func TestBench_BystanderOnlyPrintsEachConfirm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), stuck)
	defer cancel()
	cfg := config(t, func(*Config) {})
	server, err := startBenchServers(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer server.stop()
	cfg.URL, cfg.Secret, cfg.BystanderOnly = server.urls[0], benchSecret, true
	out := &interruptAfter{lines: 3, interrupt: cancel}
	err = Run(ctx, cfg, out, io.Discard)
	lines := strings.Fields(out.String())
	if err != nil || len(lines) < 3 {
		t.Fatalf("bench: %v, printed %q", err, out.String())
	}
	for _, line := range lines {
		if micros, err := strconv.Atoi(line); err != nil || micros <= 0 {
			t.Fatalf("printed %q, want a latency in µs a line", line)
		}
	}
}

// interruptAfter keeps what is written, and calls interrupt once it
// holds lines lines, as a Ctrl-C would.
type interruptAfter struct {
	mu        sync.Mutex
	buffer    bytes.Buffer
	lines     int
	interrupt func()
}

func (w *interruptAfter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buffer.Write(p)
	if bytes.Count(w.buffer.Bytes(), []byte("\n")) >= w.lines {
		w.interrupt()
	}
	return len(p), nil
}

func (w *interruptAfter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buffer.String()
}

func TestBench_RefusesOtherMachinesAndWhatItCannotRun(t *testing.T) {
	remote := Defaults
	remote.URL, remote.Secret = "ws://broker.example.invalid:8080/ws",
		strings.Repeat("s", 32)
	err := Run(context.Background(), remote, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not this machine") {
		t.Fatalf("got %v, want a refusal before any connection", err)
	}
	for _, change := range []func(*Config){
		func(c *Config) { c.QoS = 2 },
		func(c *Config) { c.Brokers = 2 },
		func(c *Config) { c.Publishers = 0 },
		func(c *Config) { c.Size = 8 },
		// Delayed measures a server it started.
		func(c *Config) { c.Delayed = 10 },
	} {
		cfg := Defaults
		cfg.URL = "ws://127.0.0.1:1/ws"
		change(&cfg)
		if err := Run(context.Background(), cfg, io.Discard,
			io.Discard); err == nil {
			t.Errorf("%+v ran, want an error", cfg)
		}
	}
	if err := Run(context.Background(), Defaults, io.Discard,
		io.Discard); err == nil || !strings.Contains(err.Error(), "no server") {
		t.Errorf("no URL and no binary: got %v, want a refusal", err)
	}
}

// A message a reader was told it missed, in a skipped frame, is counted
// as skipped, not lost, and a reader with nothing else missing has
// caught up.
func TestBench_CountsWhatASkippedFrameSaysAsSkipped(t *testing.T) {
	l := &load{cfg: Config{Publishers: 1}, sent: make([]atomic.Int64, 1)}
	s := &benchSubscriber{received: make([]atomic.Int64, 1),
		seen: make([][]bool, 1)}
	l.subscribers = []*benchSubscriber{s}
	l.sent[0].Store(10)
	for n := range 4 {
		line := fmt.Appendf(nil, `{"type":"message","topic":"bench/0",`+
			`"payload":{"p":0,"n":%d,"t":%d},"seq":%d}`, n,
			time.Now().UnixNano(), n+1)
		l.count(s, line, time.Now().UnixNano(), nil)
	}
	if l.caughtUp() {
		t.Fatal("caught up with 6 of 10 neither received nor skipped")
	}
	l.count(s, []byte(`{"type":"skipped","topic":"bench/0","seq":10,`+
		`"missed":6}`), time.Now().UnixNano(), nil)
	if !l.caughtUp() {
		t.Fatal("not caught up after a skipped frame said the rest")
	}
	r := l.result(time.Second)
	if r.Lost != 0 || r.Skipped != 6 || r.Delivered != 4 {
		t.Fatalf("lost %d, skipped %d, delivered %d; want 0, 6, 4",
			r.Lost, r.Skipped, r.Delivered)
	}
}
