package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
)

// A subscriber that never acks and a publisher: /metrics counts the
// publish, its commit, the delivery, the retry and the dead letter, and
// the gauges say who is connected and subscribed; /healthz and /readyz
// answer.
func TestOperations_CountWhatHappens(t *testing.T) {
	secret := strings.Repeat("operations-secret-", 2)
	wsURL, _, _ := startServe(t, "--secret", secret, "--ack-timeout",
		"200ms", "--max-retries", "1")
	base := "http://" + strings.TrimPrefix(strings.TrimSuffix(wsURL, "/ws"),
		"ws://")
	token, err := localClaims().Sign([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"/healthz": "ok\n",
		"/readyz": "ready\n"} {
		if status, body := fetch(t, base+path); status != 200 || body != want {
			t.Fatalf("%s: %d %q", path, status, body)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	worker := dialAs(ctx, t, wsURL, token)
	wsjson.Write(ctx, worker, map[string]any{"type": "subscribe",
		"topic": "jobs"})
	publisher := dialAs(ctx, t, wsURL, token)
	readType(ctx, t, worker, "subscribed")
	wsjson.Write(ctx, publisher, map[string]any{"type": "publish",
		"topic": "jobs", "payload": "build", "qos": 1, "message_id": "j-1"})
	readType(ctx, t, publisher, "published")
	readType(ctx, t, worker, "message")
	readType(ctx, t, worker, "message") // the retry; never acked

	// The job and its dead letter are two messages, each published,
	// committed and delivered once (the dead letter to nobody).
	want := map[string]float64{
		"popsub_published_total":      2,
		"popsub_committed_total":      2,
		"popsub_delivered_total":      1,
		"popsub_redelivered_total":    1,
		"popsub_dead_lettered_total":  1,
		"popsub_acked_total":          0,
		"popsub_cut_off_total":        0,
		"popsub_connections":          2,
		"popsub_subscriptions":        1,
		"popsub_outbox_bytes":         0,
		"popsub_commit_messages_sum":  2,
		"popsub_commit_seconds_count": -1, // at least one commit
	}
	var got map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; {
		got = scrape(t, base+"/metrics")
		if matches(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n got %v\nwant %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got["go_goroutines"] == 0 || got["process_resident_memory_bytes"] == 0 {
		t.Fatal("the Go and process collectors are missing")
	}
}

// matches reports whether got has every wanted value; -1 wants at
// least one.
func matches(got, want map[string]float64) bool {
	for name, value := range want {
		v, ok := got[name]
		if !ok || (value >= 0 && v != value) || (value < 0 && v < 1) {
			return false
		}
	}
	return true
}

// /readyz says 503 while the broker stops, and while its log cannot be
// read, with the reason.
func TestOperations_ReadyOnlyWhenTheLogAnswers(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "popsub.db"),
		nil)
	if err != nil {
		t.Fatal(err)
	}
	ops := newOperations(store)
	mux := http.NewServeMux()
	ops.register(mux)
	ask := func() (int, string) {
		recorder := httptest.NewRecorder()
		mux.ServeHTTP(recorder, httptest.NewRequest("GET", "/readyz", nil))
		return recorder.Code, recorder.Body.String()
	}
	if code, body := ask(); code != 200 {
		t.Fatalf("a working log: %d %q", code, body)
	}
	ops.stopping.Store(true)
	if code, body := ask(); code != 503 || !strings.Contains(body,
		"shutting down") {
		t.Fatalf("while stopping: %d %q", code, body)
	}
	ops.stopping.Store(false)
	store.Close()
	if code, body := ask(); code != 503 || !strings.Contains(body,
		"log unreadable") {
		t.Fatalf("a closed log: %d %q", code, body)
	}
}

// refusing is a log whose commits fail while refuse is set, as on a
// full disk.
type refusing struct {
	popsub.Store
	refuse atomic.Bool
}

// Commit fails while refuse is set.
func (r *refusing) Commit(batch *popsub.Batch) error {
	if r.refuse.Load() {
		return errors.New("no space left on device")
	}
	return r.Store.Commit(batch)
}

// /readyz says 503 while the log refuses writes, a full disk, though it
// still answers reads: from the failed commit until one succeeds, or
// failureShown has passed, after which only traffic could tell.
func TestOperations_NotReadyWhileTheLogRefusesWrites(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "popsub.db"),
		nil)
	if err != nil {
		t.Fatal(err)
	}
	store := &refusing{Store: bolt}
	ops := newOperations(store)
	clock := time.Now()
	ops.now = func() time.Time { return clock }
	options := popsub.Options{Store: store,
		Secret: []byte(strings.Repeat("s", 32)), Logger: quietLog()}
	options.OnEvent = ops.observe
	broker, err := popsub.New(options)
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Shutdown(context.Background())
	mux := http.NewServeMux()
	ops.register(mux)
	ready := func(want int, says string) {
		t.Helper()
		// The event comes through the x-ray's queue: wait for it.
		var code int
		var body string
		for deadline := time.Now().Add(5 * time.Second); ; {
			recorder := httptest.NewRecorder()
			mux.ServeHTTP(recorder, httptest.NewRequest("GET", "/readyz", nil))
			code, body = recorder.Code, recorder.Body.String()
			if code == want && strings.Contains(body, says) ||
				time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if code != want || !strings.Contains(body, says) {
			t.Fatalf("/readyz: %d %q, want %d saying %q", code, body, want,
				says)
		}
	}
	publish := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := broker.Publish(ctx, "jobs", "x", 1)
		return err
	}

	store.refuse.Store(true)
	if publish() == nil {
		t.Fatal("a publish the log refused was confirmed")
	}
	ready(503, "log refuses writes: no space left on device")
	clock = clock.Add(failureShown)
	ready(200, "ready")
	clock = clock.Add(-failureShown)
	ready(503, "log refuses writes")
	store.refuse.Store(false)
	if err := publish(); err != nil {
		t.Fatal(err)
	}
	ready(200, "ready")
}

// fetch GETs url and returns the status and body.
func fetch(t *testing.T, url string) (int, string) {
	t.Helper()
	response, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	body, _ := io.ReadAll(response.Body)
	return response.StatusCode, string(body)
}

// scrape reads the metrics without labels at url, by name.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	_, body := fetch(t, url)
	values := map[string]float64{}
	lines := bufio.NewScanner(strings.NewReader(body))
	for lines.Scan() {
		name, value, ok := strings.Cut(lines.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		values[name], _ = strconv.ParseFloat(value, 64)
	}
	return values
}

// dialAs connects and authenticates with token.
func dialAs(ctx context.Context, t *testing.T, url,
	token string) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	wsjson.Write(ctx, ws, map[string]string{"type": "auth", "token": token})
	readType(ctx, t, ws, "authenticated")
	return ws
}

// readType reads the next frame and checks its type.
func readType(ctx context.Context, t *testing.T, ws *websocket.Conn,
	want string) {
	t.Helper()
	var frame struct{ Type string }
	if err := wsjson.Read(ctx, ws, &frame); err != nil || frame.Type != want {
		t.Fatalf("read %q, %v; want %q", frame.Type, err, want)
	}
}
