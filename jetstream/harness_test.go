package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/jetstream/natstest"
	"github.com/popsub/popsub/wire"
)

// This file holds the harness: NATS servers in the test process, PopSub
// brokers on them served on 127.0.0.1, and clients over real WebSockets.

// secret signs every token; every broker shares it, as a deployment would.
var secret = []byte("jetstream-test-secret-at-least-32-bytes")

// quiet discards logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startNATS runs one NATS server with JetStream for the test.
func startNATS(tb testing.TB) *server.Server { return natstest.Start(tb) }

// broker is one PopSub broker on a shared log, served on 127.0.0.1.
type broker struct {
	t      *testing.T
	popsub *popsub.Broker
	log    *Log
	http   *httptest.Server
	conns  *tracked
	url    string
	killed bool
}

// tracked is a listener that remembers its connections, so that kill can
// drop them: httptest forgets a connection once it is a WebSocket.
type tracked struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// Accept accepts and remembers a connection.
func (l *tracked) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, conn)
		l.mu.Unlock()
	}
	return conn, err
}

// drop closes every connection accepted so far.
func (l *tracked) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, conn := range l.conns {
		conn.Close()
	}
}

// startBroker runs a broker on the JetStream at url with opts (Secret,
// Store and Logger are filled in).
func startBroker(t *testing.T, url string, opts popsub.Options) *broker {
	t.Helper()
	// A cluster that has only just elected its leader may take longer
	// than a request's timeout to create the first replicated bucket on
	// a loaded machine (go test -race ./... runs packages side by side):
	// open again, as an operator would.
	var log *Log
	err := context.DeadlineExceeded
	for try := 0; try < 3 && errors.Is(err, context.DeadlineExceeded); try++ {
		log, err = Open(Options{URL: url, MaxMessages: opts.MaxMessages,
			MaxBytes: int64(opts.MaxLogBytes), Logger: quiet,
			Replicas: replicasFor(url)})
	}
	if err != nil {
		t.Fatalf("open log: %v", err)
	}
	opts.Secret, opts.Store, opts.Logger = secret, log, quiet
	b, err := popsub.New(opts)
	if err != nil {
		t.Fatalf("new broker: %v", err)
	}
	srv := httptest.NewUnstartedServer(b)
	conns := &tracked{Listener: srv.Listener}
	srv.Listener = conns
	srv.Start()
	br := &broker{t: t, popsub: b, log: log, http: srv, conns: conns,
		url: "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws"}
	t.Cleanup(br.stop)
	return br
}

// restartable returns the options of a NATS server on a port and in a
// folder of its own: one started again with them is the same server to
// its clients, which reconnect, and its streams are still there.
func restartable(t *testing.T) func() *server.Options {
	port, dir := natstest.FreePort(t), t.TempDir()
	return func() *server.Options {
		return &server.Options{Host: "127.0.0.1", Port: port,
			JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true}
	}
}

// replicasFor is 3 for a cluster's URL list, else 1.
func replicasFor(url string) int {
	if strings.Contains(url, ",") {
		return 3
	}
	return 1
}

// stop shuts the broker down as serve does on SIGTERM.
func (b *broker) stop() {
	if b.killed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.http.CloseClientConnections()
	b.popsub.Shutdown(ctx)
	b.http.Close()
}

// kill stops the broker the way kill -9 would look from outside: its
// sockets and its NATS connection drop, and nothing is flushed.
func (b *broker) kill() {
	b.killed = true
	b.http.Listener.Close()
	b.conns.drop()
	b.log.nc.Close()
}

// frame is any frame the broker sends: the protocol's own type.
type frame = wire.Received

// client is one WebSocket client, authenticated as sub.
type client struct {
	t  *testing.T
	ws *websocket.Conn
}

// dial connects to b as sub and authenticates.
func (b *broker) dial(sub string) *client {
	b.t.Helper()
	return dialURL(b.t, b.url, sub)
}

// dialURL connects to url as sub and authenticates.
func dialURL(t *testing.T, url, sub string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	ws.SetReadLimit(1 << 20)
	c := &client{t: t, ws: ws}
	t.Cleanup(func() { ws.CloseNow() })
	token, err := popsub.NewToken(secret, sub, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c.send(map[string]any{"type": "auth", "token": token})
	c.expect("authenticated")
	return c
}

// send writes one frame.
func (c *client) send(v any) {
	c.t.Helper()
	data, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, data); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// next reads the next frame, failing the test after ten seconds.
func (c *client) next() frame {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		c.t.Fatalf("decode %s: %v", data, err)
	}
	return f
}

// expect reads the next frame and fails unless its type is typ.
func (c *client) expect(typ string) frame {
	c.t.Helper()
	f := c.next()
	if f.Type != typ {
		c.t.Fatalf("got %+v, want a %q frame", f, typ)
	}
	return f
}

// publish publishes payload with QoS 1 and id and returns the confirm.
func (c *client) publish(topic, id string, payload any) frame {
	c.t.Helper()
	c.send(map[string]any{"type": "publish", "topic": topic, "qos": 1,
		"message_id": id, "payload": payload})
	return c.expect("published")
}

// subscribe subscribes with the extra fields given and returns the reply.
func (c *client) subscribe(topic string, extra map[string]any) frame {
	c.t.Helper()
	f := map[string]any{"type": "subscribe", "topic": topic}
	for k, v := range extra {
		f[k] = v
	}
	c.send(f)
	return c.expect("subscribed")
}

// messages reads n deliveries and returns their seqs.
func (c *client) messages(n int) []frame {
	c.t.Helper()
	var got []frame
	for len(got) < n {
		got = append(got, c.expect("message"))
	}
	return got
}

// seqs lists the seqs of frames.
func seqs(frames []frame) string {
	var s []string
	for _, f := range frames {
		s = append(s, fmt.Sprint(f.Seq))
	}
	return strings.Join(s, ",")
}

// confirmsUntilCut reads confirms until the connection drops, and
// returns each confirmed id's seq.
func (c *client) confirmsUntilCut() map[string]uint64 {
	confirmed := map[string]uint64{}
	for {
		f, ok := c.tryNext()
		if !ok {
			return confirmed
		}
		if f.Type == "published" {
			confirmed[f.MessageID] = f.Seq
		}
	}
}

// drainUntilCut reads deliveries until the connection drops, into seen,
// and keeps the newest seq in last.
func (c *client) drainUntilCut(seen map[string]uint64, last *uint64) {
	for {
		f, ok := c.tryNext()
		if !ok {
			return
		}
		if f.Type == "message" {
			seen[f.MessageID], *last = f.Seq, f.Seq
		}
	}
}

// tryNext reads the next frame, or reports false once the connection is
// gone.
func (c *client) tryNext() (frame, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		return frame{}, false
	}
	var f frame
	json.Unmarshal(data, &f)
	return f, true
}

// clientURLs joins the nodes' client URLs, as --nats takes them.
func clientURLs(nodes []*server.Server) string {
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.ClientURL())
	}
	return strings.Join(urls, ",")
}
