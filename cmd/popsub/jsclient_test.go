package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
)

// These tests run popsub.js, the JavaScript client the broker serves, in
// Node and in Chromium: the same suite (jsclient/testdata/suite.mjs)
// against a real broker on 127.0.0.1, which the suite may restart.

// jsSuite is the suite's folder.
const jsSuite = "../../jsclient/testdata"

// jsServer serves what the suite needs: the broker at /ws, which a
// restart replaces with a new broker on the same bbolt file; a relay to
// it that can drop a confirm; a scripted server that closes with a
// chosen code; popsub.js as serve serves it; the suite; and controls.
type jsServer struct {
	t    *testing.T
	url  string
	path string // the bbolt file

	mu     sync.Mutex
	broker *popsub.Broker // nil while restarting

	dropConfirm atomic.Bool // the relay drops the next confirm
	// mute is closed to make the relays open now carry nothing more,
	// either way, without closing: a half-open connection.
	mute chan struct{}

	// serve is a real popsub serve, run in this process on a port of
	// its own, that the suite stops (its port closed) and starts again.
	serve *serveProcess
	// tls is a broker's address over TLS with a certificate nobody
	// trusts: a client must refuse it, and say so.
	tls string
}

// serveProcess is one popsub serve on a fixed address and file, which
// can be stopped and started again.
type serveProcess struct {
	t          *testing.T
	addr, db   string
	closedAddr string // a port nothing listens on
	mu         sync.Mutex
	stop       func() error // nil while stopped
}

// start runs serve until stop; it returns once serve listens.
func (p *serveProcess) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		return nil
	}
	args := []string{"serve", "--addr", p.addr, "--db", p.db,
		"--secret", string(jsSecret), "--log-level", "error",
		"--origins", "127.0.0.1:*"}
	ctx, cancel := context.WithCancel(context.Background())
	out, in := io.Pipe()
	result := make(chan error, 1)
	go func() {
		result <- run(ctx, args, in, io.Discard)
		in.Close()
	}()
	banner, err := bufio.NewReader(out).ReadString('\n')
	go io.Copy(io.Discard, out)
	if !strings.HasPrefix(banner, "popsub listening") {
		cancel()
		return fmt.Errorf("serve did not start: %q %v %v", banner, err,
			<-result)
	}
	p.stop = func() error {
		cancel()
		return <-result
	}
	return nil
}

// halt stops serve, and returns once its port is closed.
func (p *serveProcess) halt() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop == nil {
		return nil
	}
	err := p.stop()
	p.stop = nil
	return err
}

// jsSecret signs the suite's tokens.
var jsSecret = []byte("javascript-client-test-secret-32-bytes")

// startJSServer serves the suite's broker on 127.0.0.1.
func startJSServer(t *testing.T) *jsServer {
	t.Helper()
	s := &jsServer{t: t, path: filepath.Join(t.TempDir(), "js.db"),
		mute: make(chan struct{})}
	s.serve = &serveProcess{t: t, addr: keptAddress(t),
		db: filepath.Join(t.TempDir(), "serve.db"), closedAddr: keptAddress(t)}
	t.Cleanup(func() { s.serve.halt() })
	s.broker = s.newBroker()
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", s.serveBroker)
	mux.HandleFunc("/relay/ws", s.relay)
	mux.HandleFunc("/fake/ws", fakeBroker)
	mux.Handle("GET /popsub.js", javascriptClient())
	mux.HandleFunc("GET /testdata/{name}", func(w http.ResponseWriter,
		r *http.Request) {
		if strings.HasSuffix(r.PathValue("name"), ".mjs") {
			w.Header().Set("Content-Type", "text/javascript")
		}
		http.ServeFile(w, r, filepath.Join(jsSuite, r.PathValue("name")))
	})
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter,
		_ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /control/token", s.token)
	mux.HandleFunc("POST /control/restart", s.restart)
	mux.HandleFunc("POST /control/drop-next-confirm", func(
		http.ResponseWriter, *http.Request) {
		s.dropConfirm.Store(true)
	})
	mux.HandleFunc("POST /control/silence-relay", func(
		http.ResponseWriter, *http.Request) {
		s.mu.Lock()
		close(s.mute)
		s.mute = make(chan struct{})
		s.mu.Unlock()
	})
	mux.HandleFunc("POST /control/serve", s.serveURLs)
	mux.HandleFunc("POST /control/serve-stop", func(w http.ResponseWriter,
		_ *http.Request) {
		if err := s.serve.halt(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("POST /control/serve-start", func(w http.ResponseWriter,
		_ *http.Request) {
		if err := s.serve.start(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	// The untrusted broker is set up before the server whose handlers
	// name it. Its refused handshakes are the point: net/http need not
	// log them.
	untrusted := httptest.NewUnstartedServer(http.HandlerFunc(s.serveBroker))
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0)
	untrusted.StartTLS()
	t.Cleanup(untrusted.Close)
	s.tls = untrusted.URL
	web := httptest.NewServer(mux)
	s.url = web.URL
	t.Cleanup(func() {
		web.CloseClientConnections()
		web.Close()
		if b := s.current(); b != nil {
			ctx, cancel := context.WithTimeout(context.Background(),
				10*time.Second)
			defer cancel()
			b.Shutdown(ctx)
		}
	})
	return s
}

// newBroker opens a broker on the server's file: a 200 ms ack timeout,
// so that the suite sees retries quickly.
func (s *jsServer) newBroker() *popsub.Broker {
	store, err := boltstore.Open(s.path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	b, err := popsub.New(popsub.Options{Secret: jsSecret, Store: store,
		AckTimeout: 200 * time.Millisecond, Logger: quietLog()})
	if err != nil {
		s.t.Fatal(err)
	}
	return b
}

// current is the broker now serving, or nil during a restart.
func (s *jsServer) current() *popsub.Broker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.broker
}

// serveBroker hands /ws to the current broker.
func (s *jsServer) serveBroker(w http.ResponseWriter, r *http.Request) {
	b := s.current()
	if b == nil {
		http.Error(w, "restarting", http.StatusServiceUnavailable)
		return
	}
	b.ServeHTTP(w, r)
}

// restart shuts the broker down, as serve does on SIGTERM (clients hear
// 1001), and starts another on the same file.
func (s *jsServer) restart(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	old := s.broker
	s.broker = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := old.Shutdown(ctx); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	b := s.newBroker()
	s.mu.Lock()
	s.broker = b
	s.mu.Unlock()
}

// serveURLs starts the real serve if need be, and answers its WebSocket
// URL and one where nothing listens.
func (s *jsServer) serveURLs(w http.ResponseWriter, _ *http.Request) {
	if err := s.serve.start(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	json.NewEncoder(w).Encode(map[string]string{
		"ws":        "ws://" + s.serve.addr + "/ws",
		"closed":    "ws://" + s.serve.closedAddr + "/ws",
		"untrusted": strings.Replace(s.tls, "https://", "wss://", 1) + "/ws"})
}

// token signs a token: ?sub=…&ttl=seconds&publish=a,b&subscribe=c.
func (s *jsServer) token(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ttl, _ := strconv.Atoi(q.Get("ttl"))
	var claims popsub.Claims
	claims.Subject = q.Get("sub")
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(
		time.Duration(ttl) * time.Second))
	if p := q.Get("publish"); p != "" {
		claims.Publish = strings.Split(p, ",")
	}
	if p := q.Get("subscribe"); p != "" {
		claims.Subscribe = strings.Split(p, ",")
	}
	token, err := claims.Sign(jsSecret)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Write([]byte(token))
}

// relay passes frames between a client and the broker. When told, it
// drops the next confirm and the connection with it, as a network that
// fails at the wrong moment would: the broker stored the message, and
// the client never heard.
func (s *jsServer) relay(w http.ResponseWriter, r *http.Request) {
	client, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	s.mu.Lock()
	mute := s.mute
	s.mu.Unlock()
	muted := func() bool {
		select {
		case <-mute:
			return true
		default:
			return false
		}
	}
	defer client.CloseNow()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	upstream, _, err := websocket.Dial(ctx, "ws://"+r.Host+"/ws", nil)
	if err != nil {
		return
	}
	defer upstream.CloseNow()
	client.SetReadLimit(-1)
	upstream.SetReadLimit(-1)
	go func() {
		defer cancel()
		for {
			typ, data, err := client.Read(ctx)
			if err != nil {
				return
			}
			if !muted() && upstream.Write(ctx, typ, data) != nil {
				return
			}
		}
	}()
	for {
		typ, data, err := upstream.Read(ctx)
		if err != nil {
			return
		}
		if bytes.Contains(data, []byte(`"type":"published"`)) &&
			s.dropConfirm.CompareAndSwap(true, false) {
			return
		}
		if muted() {
			continue
		}
		if client.Write(ctx, typ, data) != nil {
			return
		}
	}
}

// fakeBroker answers any auth frame, then closes with the code in
// ?close=, as the broker does for a slow consumer (4008) or an expired
// token (4003). With ?skipped=T instead, it answers the next frame, a
// subscribe to a wildcard, and says that the wildcard missed messages of
// T, as a broker on a shared log does when its own feed missed them
// (the suite's broker, on bbolt, never does); then it waits for the
// client to go.
func fakeBroker(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer ws.CloseNow()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if _, _, err := ws.Read(ctx); err != nil {
		return
	}
	ws.Write(ctx, websocket.MessageText,
		[]byte(`{"type":"authenticated","sub":"any","conn":7}`))
	if topic := r.URL.Query().Get("skipped"); topic != "" {
		var f struct{ Topic string }
		if _, data, err := ws.Read(ctx); err != nil ||
			json.Unmarshal(data, &f) != nil {
			return
		}
		for _, frame := range []map[string]any{
			{"type": "subscribed", "topic": f.Topic},
			{"type": "skipped", "topic": topic, "seq": 6, "missed": 2,
				"filter": f.Topic},
		} {
			data, _ := json.Marshal(frame)
			ws.Write(ctx, websocket.MessageText, data)
		}
		ws.Read(ctx)
		return
	}
	code, _ := strconv.Atoi(r.URL.Query().Get("close"))
	ws.Close(websocket.StatusCode(code), "scripted close")
}

// jsResult is one test's outcome, as the suite reports it.
type jsResult struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error"`
}

// report turns the suite's results into subtests.
func report(t *testing.T, results []jsResult) {
	if len(results) < 10 {
		t.Fatalf("the suite reported %d tests: %+v", len(results), results)
	}
	for _, r := range results {
		t.Run(r.Name, func(t *testing.T) {
			if !r.OK {
				t.Fatal(r.Error)
			}
		})
	}
}

// nodeBinary finds Node. Without it the test is skipped on a developer
// machine, and fails under CI=true: the machines CI runs on have it.
func nodeBinary(t *testing.T) string {
	path, err := exec.LookPath("node")
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no node on PATH")
	}
	t.Skip("no node on PATH")
	return ""
}

func TestJavaScriptClient_InNode(t *testing.T) {
	node := nodeBinary(t)
	s := startJSServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Node 20 has WebSocket behind a flag; later versions accept it. The
	// npm eventsource package stands for a browser's EventSource.
	command := exec.CommandContext(ctx, node, "--experimental-websocket",
		"--no-warnings", filepath.Join(jsSuite, "node.mjs"), s.url,
		npmTools(t))
	var stderr bytes.Buffer
	command.Stderr = &stderr
	out, err := command.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s\n%s", err, out, stderr.String())
	}
	var results []jsResult
	lines := bufio.NewScanner(bytes.NewReader(out))
	for lines.Scan() {
		var r jsResult
		if err := json.Unmarshal(lines.Bytes(), &r); err != nil {
			t.Fatalf("node printed %q", lines.Text())
		}
		results = append(results, r)
	}
	report(t, results)
}

func TestJavaScriptClient_InChromium(t *testing.T) {
	chromium := browser(t)
	s := startJSServer(t)
	ctx, problems := startBrowser(t, chromium)
	do(t, ctx, "open the suite", chromedp.Navigate(s.url+
		"/testdata/page.html"))
	until(t, ctx, "the suite ends", `window.results !== undefined`)
	results, err := chromedp.Run(ctx, chromedp.Evaluate[[]jsResult](
		`window.results`))
	if err != nil {
		t.Fatal(err)
	}
	report(t, results)
	for _, p := range problems() {
		// The browser's own lines about refused sockets are the
		// restart's; anything else is an error the client let escape.
		if !strings.Contains(p, "WebSocket connection to") {
			t.Errorf("console: %s", p)
		}
	}
}

// quietLog is a logger that drops everything.
func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }
