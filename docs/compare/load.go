package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	centrifugeclient "github.com/centrifugal/centrifuge-go"
	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// target is one server as the client sees it: subscribers that count
// what they receive, and a publisher.
type target interface {
	// subscribe connects a subscriber that calls got for each message,
	// with its payload (for PopSub, the frame that holds it), which is
	// only valid during the call.
	subscribe(got func(payload []byte)) error
	// publish sends n messages of payload.
	publish(n int, payload []byte) error
	// close drops every connection.
	close()
}

// popsubTarget speaks PopSub's protocol over raw WebSockets. The
// publisher sends one publish per frame, as an outsider's client does;
// with batch, subscribers opt into "batch":true and get many deliveries
// a frame.
type popsubTarget struct {
	url, token string
	batch      bool
	// coalesce makes the publisher send each call's publishes joined by
	// newlines in one frame, as popsub.js sends what one tick sends
	// (16 Ki characters a frame at most), and opt into batches for it.
	coalesce bool
	// joined is the most publishes a frame holds, joined once: a frame
	// of k is its first k lines.
	joined    []byte
	mu        sync.Mutex
	conns     []*websocket.Conn
	publisher *websocket.Conn
}

// dial connects and authenticates, opting into batches if batch.
func (p *popsubTarget) dial(batch bool) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, err := dialPopsub(ctx, p.url, p.token, nil, batch)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(-1)
	p.mu.Lock()
	p.conns = append(p.conns, ws)
	p.mu.Unlock()
	return ws, nil
}

// subscribe subscribes live to bench and counts each delivery line.
func (p *popsubTarget) subscribe(got func([]byte)) error {
	ws, err := p.dial(p.batch)
	if err != nil {
		return err
	}
	ctx := context.Background()
	err = ws.Write(ctx, websocket.MessageText,
		[]byte(`{"type":"subscribe","topic":"bench","last":0}`))
	if err != nil {
		return err
	}
	if _, _, err := ws.Read(ctx); err != nil {
		return err
	}
	go func() {
		var buf bytes.Buffer
		for {
			data, err := readInto(ctx, ws, &buf)
			if err != nil {
				return
			}
			for range bytes.Count(data, []byte(`"type":"message"`)) {
				got(data)
			}
		}
	}()
	return nil
}

// readInto reads ws's next message into buf, emptied first, and returns
// it: one buffer reused, as nats.go reads into one, where ws.Read would
// allocate every message anew, and spend on this client CPU the server
// it measures shares.
func readInto(ctx context.Context, ws *websocket.Conn,
	buf *bytes.Buffer) ([]byte, error) {
	_, r, err := ws.Reader(ctx)
	if err != nil {
		return nil, err
	}
	buf.Reset()
	_, err = buf.ReadFrom(r)
	return buf.Bytes(), err
}

// publish sends n publishes, one frame each.
func (p *popsubTarget) publish(n int, payload []byte) error {
	if p.publisher == nil {
		ws, err := p.dial(p.coalesce)
		if err != nil {
			return err
		}
		p.publisher = ws
		go func() {
			for {
				if _, _, err := ws.Read(context.Background()); err != nil {
					return
				}
			}
		}()
	}
	line := []byte(`{"type":"publish","topic":"bench","payload":` +
		string(payload) + `}`)
	if p.coalesce {
		per := max(1, (16<<10)/(len(line)+1))
		if len(p.joined) != per*(len(line)+1)-1 {
			p.joined = bytes.Join(slices.Repeat([][]byte{line}, per),
				[]byte("\n"))
		}
		for sent := 0; sent < n; sent += per {
			k := min(per, n-sent)
			err := p.publisher.Write(context.Background(),
				websocket.MessageText, p.joined[:k*(len(line)+1)-1])
			if err != nil {
				return err
			}
		}
		return nil
	}
	for range n {
		err := p.publisher.Write(context.Background(), websocket.MessageText,
			line)
		if err != nil {
			return err
		}
	}
	return nil
}

// close drops every connection.
func (p *popsubTarget) close() {
	for _, ws := range p.conns {
		ws.CloseNow()
	}
}

// natsTarget publishes into a JetStream stream on file storage and
// gives each subscriber an ordered consumer of new messages, its own
// cursor on the stream as a PopSub subscriber has, or, when plain, a
// core NATS subscription to the stream's subject.
type natsTarget struct {
	url   string
	plain bool
	// unacked publishes with core NATS into the stream's subject: the
	// stream stores each, and sends no ack back, as PopSub sends no
	// confirm for QoS 0.
	unacked bool
	conns   []*nats.Conn
	js      jetstream.JetStream
	pub     *nats.Conn // the publisher's connection
}

// connect connects and makes the stream on first use.
func (t *natsTarget) connect() (jetstream.JetStream, error) {
	nc, err := nats.Connect(t.url)
	if err != nil {
		return nil, err
	}
	t.conns = append(t.conns, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	_, err = js.CreateOrUpdateStream(context.Background(),
		jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench"},
			Storage: jetstream.FileStorage, MaxMsgs: 100_000})
	return js, err
}

// subscribe starts an ordered consumer of new messages.
func (t *natsTarget) subscribe(got func([]byte)) error {
	js, err := t.connect()
	if err != nil {
		return err
	}
	if t.plain {
		nc := t.conns[len(t.conns)-1]
		if _, err := nc.Subscribe("bench", func(m *nats.Msg) { got(m.Data) }); err != nil {
			return err
		}
		return nc.Flush()
	}
	consumer, err := js.OrderedConsumer(context.Background(), "BENCH",
		jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return err
	}
	_, err = consumer.Consume(func(m jetstream.Msg) { got(m.Data()) })
	return err
}

// publish publishes n messages asynchronously, acked by the stream.
func (t *natsTarget) publish(n int, payload []byte) error {
	if t.js == nil {
		js, err := t.connect()
		if err != nil {
			return err
		}
		t.js, t.pub = js, t.conns[len(t.conns)-1]
	}
	for range n {
		if t.unacked {
			if err := t.pub.Publish("bench", payload); err != nil {
				return err
			}
			continue
		}
		if _, err := t.js.PublishAsync("bench", payload); err != nil {
			return err
		}
	}
	return nil
}

// close drops every connection.
func (t *natsTarget) close() {
	for _, nc := range t.conns {
		nc.Close()
	}
}

// centrifugeTarget speaks centrifuge's JSON protocol through its Go
// client; publishes go through the client too, several at a time, since
// each is a request awaiting its reply.
type centrifugeTarget struct {
	url       string
	clients   []*centrifugeclient.Client
	publisher *centrifugeclient.Client
	// api, if set, is the server API's address: publishes go there, a
	// request per chunk, as an application's backend sends them.
	api string
	// apiConns carry one message a request (pipelined), in turn; sent
	// counts those requests, each written from request, one buffer
	// reused; apiErr is the first error a reply brought.
	apiConns []net.Conn
	sent     int
	request  []byte
	apiErr   atomic.Pointer[error]
}

// connect makes a connected client.
func (t *centrifugeTarget) connect() (*centrifugeclient.Client, error) {
	c := centrifugeclient.NewJsonClient(t.url, centrifugeclient.Config{})
	connected := make(chan struct{})
	c.OnConnected(func(centrifugeclient.ConnectedEvent) { close(connected) })
	if err := c.Connect(); err != nil {
		return nil, err
	}
	select {
	case <-connected:
	case <-time.After(5 * time.Second):
		return nil, errors.New("centrifuge: no connect")
	}
	t.clients = append(t.clients, c)
	return c, nil
}

// subscribe subscribes a new client to bench.
func (t *centrifugeTarget) subscribe(got func([]byte)) error {
	c, err := t.connect()
	if err != nil {
		return err
	}
	sub, err := c.NewSubscription("bench")
	if err != nil {
		return err
	}
	subscribed := make(chan struct{})
	sub.OnSubscribed(func(centrifugeclient.SubscribedEvent) {
		close(subscribed)
	})
	sub.OnPublication(func(e centrifugeclient.PublicationEvent) {
		got(e.Data)
	})
	if err := sub.Subscribe(); err != nil {
		return err
	}
	<-subscribed
	return nil
}

// publish sends n publishes, 16 in flight at a time, or, through the
// server API, in one request.
func (t *centrifugeTarget) publish(n int, payload []byte) error {
	if t.api != "" && n == 1 {
		// One message is written without waiting for the reply before
		// it, as through the client below: a request at a time held
		// 4,700 messages a second where 10,000 were due.
		return t.pipelined(payload)
	}
	if t.api != "" {
		return t.post(n, payload)
	}
	if t.publisher == nil {
		c, err := t.connect()
		if err != nil {
			return err
		}
		t.publisher = c
	}
	// One message is published without waiting for its reply, as
	// PopSub's and NATS's publishers do not wait: a fixed rate of them
	// must not be paced by round trips.
	if n == 1 {
		go t.publisher.Publish(context.Background(), "bench", payload)
		return nil
	}
	var wg sync.WaitGroup
	var failed atomic.Value
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	for range min(16, n) {
		wg.Go(func() {
			for range work {
				_, err := t.publisher.Publish(context.Background(), "bench",
					payload)
				if err != nil {
					failed.Store(err)
				}
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return err
	}
	return nil
}

// post publishes n copies of payload through the server API, in one
// request.
func (t *centrifugeTarget) post(n int, payload []byte) error {
	resp, err := http.Post(fmt.Sprintf("%s?n=%d", t.api, n),
		"application/json", bytes.NewReader(payload))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("centrifuge API: %s", resp.Status)
	}
	return nil
}

// pipelines is how many connections to the server API one message a
// request takes turns on.
const pipelines = 4

// pipelined writes one publish request to the server API on the next of
// its kept-alive connections, without waiting for the replies of those
// before it (HTTP/1.1 pipelining): the publisher neither waits for a
// round trip nor hands the request to a goroutine, which would delay it
// (p99 at 1,000 msg/s 1.2–1.5 ms that way, against 0.8–1.1 waiting for
// each reply). A goroutine a connection reads the replies; the first
// error ends the run.
func (t *centrifugeTarget) pipelined(payload []byte) error {
	if err := t.apiErr.Load(); err != nil {
		return *err
	}
	if t.apiConns == nil {
		if err := t.openPipelines(); err != nil {
			return err
		}
	}
	conn := t.apiConns[t.sent%pipelines]
	t.sent++
	head := len(t.request)
	t.request = strconv.AppendInt(t.request, int64(len(payload)), 10)
	t.request = append(append(t.request, "\r\n\r\n"...), payload...)
	_, err := conn.Write(t.request)
	t.request = t.request[:head]
	return err
}

// openPipelines dials the server API's connections for pipelined, each
// with a goroutine that reads its replies, and writes the head that
// every request begins with into t.request.
func (t *centrifugeTarget) openPipelines() error {
	api, err := url.Parse(t.api)
	if err != nil {
		return err
	}
	t.request = fmt.Appendf(nil, "POST %s?n=1 HTTP/1.1\r\nHost: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: ",
		api.Path, api.Host)
	for range pipelines {
		conn, err := net.Dial("tcp", api.Host)
		if err != nil {
			return err
		}
		t.apiConns = append(t.apiConns, conn)
		go func() {
			replies := bufio.NewReader(conn)
			for {
				resp, err := http.ReadResponse(replies, nil)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("centrifuge API: %s", resp.Status)
					}
				}
				if err != nil {
					t.apiErr.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	return nil
}

// close drops every client.
func (t *centrifugeTarget) close() {
	for _, c := range t.clients {
		c.Close()
	}
	for _, conn := range t.apiConns {
		conn.Close()
	}
}
