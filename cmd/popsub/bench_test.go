package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// benchAgainst runs popsub bench with args against a server started in
// this process, and returns its JSON summary.
func benchAgainst(t *testing.T, args ...string) benchResult {
	t.Helper()
	url, _, _ := startServe(t, "--secret", benchTestSecret,
		"--max-messages", "100000")
	return benchURL(t, url, args...)
}

// benchTestSecret is the secret of the servers bench tests start.
var benchTestSecret = strings.Repeat("bench-test-secret-", 2)

// benchURL runs popsub bench with args against the server (or servers,
// separated by commas) at url, and returns its JSON summary.
func benchURL(t *testing.T, url string, args ...string) benchResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	all := append([]string{"bench", "--url", url, "--secret",
		benchTestSecret, "--json"}, args...)
	if err := run(ctx, all, &out, io.Discard); err != nil {
		t.Fatalf("bench: %v", err)
	}
	var result benchResult
	if err := json.Unmarshal(out.Bytes(), &result); err != nil {
		t.Fatalf("bench printed %q: %v", out.String(), err)
	}
	return result
}

func TestBench_CountsEveryDelivery(t *testing.T) {
	for _, qos := range []string{"0", "1"} {
		t.Run("qos "+qos, func(t *testing.T) {
			deliveredOnceEach(t, benchAgainst(t, "--subscribers", "3",
				"--qos", qos, "--duration", "300ms", "--window", "50"), 3)
		})
	}
}

// deliveredOnceEach fails the test unless the bench published something
// and each of its subscribers received every message once.
func deliveredOnceEach(t *testing.T, r benchResult, subscribers int64) {
	t.Helper()
	if r.Published == 0 || r.Lost != 0 || r.Duplicated != 0 ||
		r.Delivered != subscribers*r.Published {
		t.Fatalf("published %d, delivered %d, lost %d, duplicated %d; "+
			"want every message to each of %d subscribers once",
			r.Published, r.Delivered, r.Lost, r.Duplicated, subscribers)
	}
}

// bench --idle holds its connections, and one publish reaches each of
// them; the server's /metrics counts them: a descriptor each, and no
// goroutine, since a connection quiet for a second waits in the poller.
// The server runs in the test's process, so the goroutines counted are
// the bench's 50 readers and a fixed few; a reader a connection on the
// server's side would make them over 100.
func TestBench_IdleConnectionsAllHearOnePublish(t *testing.T) {
	r := benchAgainst(t, "--idle", "50")
	if r.IdleConnections != 50 || r.FanOutMillis <= 0 ||
		r.ServerFDs < 50 || r.ServerGoroutines >= 100 {
		t.Fatalf("idle: %+v; want 50 connections, a fan-out time, at "+
			"least 50 descriptors, and under 100 goroutines", r)
	}
}

// bench --bystander-only publishes as the bystander until interrupted,
// and prints each confirm's latency: what --bystander reads from it.
func TestBench_BystanderOnlyPrintsEachConfirm(t *testing.T) {
	url, _, _ := startServe(t, "--secret", benchTestSecret)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := &interruptAfter{lines: 3, interrupt: cancel}
	err := run(ctx, []string{"bench", "--url", url, "--secret",
		benchTestSecret, "--bystander-only"}, out, io.Discard)
	lines := strings.Fields(out.String())
	if err != nil || len(lines) == 0 {
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
	bytes.Buffer
	lines     int
	interrupt func()
}

func (w *interruptAfter) Write(p []byte) (int, error) {
	w.Buffer.Write(p)
	if bytes.Count(w.Bytes(), []byte("\n")) >= w.lines {
		w.interrupt()
	}
	return len(p), nil
}

func TestBench_RefusesOtherMachines(t *testing.T) {
	err := run(context.Background(), []string{"bench", "--url",
		"ws://broker.example.invalid:8080/ws", "--secret",
		strings.Repeat("s", 32)},
		io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not this machine") {
		t.Fatalf("got %v, want a refusal before any connection", err)
	}
}

// A message a reader was told it missed, in a skipped frame, is counted
// as skipped, not lost, and a reader with nothing else missing has
// caught up.
func TestBench_CountsWhatASkippedFrameSaysAsSkipped(t *testing.T) {
	l := &load{cfg: benchConfig{publishers: 1}, sent: make([]atomic.Int64, 1)}
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
