package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// This file is popsub bench --flood: the floods an outside attack sent
// at the broker's doors, each with a bystander publishing beside it, and
// what the server's memory did. Every flood is bounded in connections
// and in time, and, like the rest of bench, refuses a target that is not
// this machine.
//
//	flood          what each of --connections does for --duration
//	slow-bodies    POST with a stranger's token, a 1 MiB body never sent
//	idle-sockets   one refused request, then nothing, keep-alive open
//	big-headers    900 KiB of headers, a byte now and then, never ended
//	http-publish   POST 1 MiB bodies with a valid token, back to back
//	ws-publish     the same over a WebSocket, for the figure to beat

// Floods lists the floods bench knows, in the order the table above
// gives them.
var Floods = []string{"slow-bodies", "idle-sockets", "big-headers",
	"http-publish", "ws-publish"}

// FloodResult is what a flood did: answers by status (or "error"), the
// bystander's publishes, and the server's peak memory.
type FloodResult struct {
	Flood           string         `json:"flood"`
	Connections     int            `json:"connections"`
	Seconds         float64        `json:"seconds"`
	Answers         map[string]int `json:"answers"`
	BystanderOK     int            `json:"bystander_ok"`
	BystanderFailed int            `json:"bystander_failed"`
	BystanderMaxMs  float64        `json:"bystander_max_ms"`
	ServerPeakMiB   float64        `json:"server_peak_rss_mib,omitempty"`
}

// flood is one flood under way.
type flood struct {
	cfg     Config
	host    string // host:port of the HTTP door
	token   string // a valid token
	mu      sync.Mutex
	answers map[string]int
}

// runFlood runs cfg.flood against the server and reports.
func runFlood(ctx context.Context, cfg Config,
	server *benchServer) (FloodResult, error) {
	if !slices.Contains(Floods, cfg.Flood) {
		return FloodResult{}, fmt.Errorf("--flood: one of %s",
			strings.Join(Floods, ", "))
	}
	u, err := url.Parse(cfg.urls[0])
	if err != nil {
		return FloodResult{}, err
	}
	token, err := cfg.tokenFor("flood")
	if err != nil {
		return FloodResult{}, err
	}
	f := &flood{cfg: cfg, host: u.Host, token: token,
		answers: map[string]int{}}
	ctx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var wg sync.WaitGroup
	for i := range cfg.Connections {
		wg.Go(func() { f.one(ctx, i) })
	}
	var bystander bystanderCount
	wg.Go(func() { f.bystander(ctx, &bystander) })
	start := time.Now()
	wg.Wait()
	r := FloodResult{Flood: cfg.Flood, Connections: cfg.Connections,
		Seconds: time.Since(start).Seconds(), Answers: f.answers,
		BystanderOK:     int(bystander.ok.Load()),
		BystanderFailed: int(bystander.failed.Load()),
		BystanderMaxMs:  float64(bystander.slowest.Load()) / 1e6}
	if server != nil {
		r.ServerPeakMiB = server.peakMemory() / 1024
	}
	return r, nil
}

// count records one answer.
func (f *flood) count(answer string) {
	f.mu.Lock()
	f.answers[answer]++
	f.mu.Unlock()
}

// one is the i-th connection's part of the flood, until ctx ends.
func (f *flood) one(ctx context.Context, i int) {
	switch f.cfg.Flood {
	case "slow-bodies":
		f.raw(ctx, fmt.Sprintf("POST /topics/flood HTTP/1.1\r\nHost: "+
			"popsub\r\nAuthorization: Bearer x\r\nContent-Length: %d\r\n"+
			"\r\n", 1<<20), "x")
	case "idle-sockets":
		f.raw(ctx, "POST /topics/flood HTTP/1.1\r\nHost: popsub\r\n"+
			"Authorization: Bearer x\r\nContent-Length: 1\r\n\r\n1", "")
	case "big-headers":
		f.raw(ctx, "GET /topics/flood HTTP/1.1\r\nHost: popsub\r\n"+
			"X-Pad: "+strings.Repeat("x", 900<<10), "x")
	case "http-publish":
		f.postLoop(ctx)
	case "ws-publish":
		f.socketLoop(ctx, i)
	}
}

// raw opens a socket, sends head, then drip (if any) every 100 ms, and
// reads whatever comes, until the server answers or closes the socket
// ("held" if it had not by the end). Like the outside attack, it does
// not reconnect: what is measured is what the server lets it hold.
func (f *flood) raw(ctx context.Context, head, drip string) {
	conn, err := net.Dial("tcp", f.host)
	if err != nil {
		f.count("error")
		return
	}
	defer conn.Close()
	context.AfterFunc(ctx, func() { conn.Close() })
	answered := make(chan string, 1)
	go func() {
		status := make([]byte, 12)
		if _, err := io.ReadFull(conn, status); err != nil {
			answered <- "closed"
			return
		}
		answered <- string(status[9:12])
		io.Copy(io.Discard, conn)
	}()
	conn.Write([]byte(head))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case answer := <-answered:
			f.count(answer)
			return
		case <-ctx.Done():
			f.count("held")
			return
		case <-tick.C:
			if drip != "" {
				conn.Write([]byte(drip))
			}
		}
	}
}

// body is what a publishing flood sends each time: a string as large as
// serve's defaults take over HTTP, 1 MiB less the 1 KiB the gateway
// keeps for the frame around it.
var body = append(append([]byte(`"`), bytes.Repeat([]byte("x"),
	1<<20-1024-2)...), '"')

// postLoop publishes body by POST with a valid token, back to back.
func (f *flood) postLoop(ctx context.Context) {
	client := &http.Client{}
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "POST",
			"http://"+f.host+"/topics/flood", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+f.token)
		res, err := client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				f.count("error")
			}
			continue
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		f.count(fmt.Sprint(res.StatusCode))
	}
}

// socketLoop publishes body over a WebSocket at QoS 1, waiting for each
// confirm.
func (f *flood) socketLoop(ctx context.Context, i int) {
	ws, err := benchDial(ctx, f.cfg, fmt.Sprint("flood-", i), i, false)
	if err != nil {
		f.count("error")
		return
	}
	defer ws.CloseNow()
	ws.SetReadLimit(-1)
	frame := append(append([]byte(
		`{"type":"publish","topic":"flood","qos":1,"payload":`), body...), '}')
	for ctx.Err() == nil {
		if ws.Write(ctx, websocket.MessageText, frame) != nil {
			return
		}
		_, reply, err := ws.Read(ctx)
		if err != nil {
			return
		}
		answer := "refused"
		if bytes.Contains(reply, []byte(`"published"`)) {
			answer = "published"
		}
		f.count(answer)
	}
}

// bystanderCount is what the bystander saw.
type bystanderCount struct {
	ok, failed, slowest atomic.Int64 // slowest in nanoseconds
}

// bystander publishes a small QoS 1 message by POST every 100 ms, each
// on a connection of its own, as a newcomer's curl would.
func (f *flood) bystander(ctx context.Context, count *bystanderCount) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		req, _ := http.NewRequest("POST", "http://"+f.host+
			"/topics/bystander", strings.NewReader(`"hello"`))
		req.Header.Set("Authorization", "Bearer "+f.token)
		req.Close = true
		client := &http.Client{Timeout: 30 * time.Second}
		res, err := client.Do(req)
		took := time.Since(start)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		if err != nil || res.StatusCode != 200 {
			count.failed.Add(1)
		} else {
			count.ok.Add(1)
		}
		if took.Nanoseconds() > count.slowest.Load() {
			count.slowest.Store(took.Nanoseconds())
		}
	}
}

// printFlood prints a flood's result.
func printFlood(w io.Writer, r FloodResult) {
	fmt.Fprintf(w, "flood %s: %d connections, %.1fs\n", r.Flood,
		r.Connections, r.Seconds)
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range r.Answers {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		fmt.Fprintf(w, "  %-10s %d\n", k, r.Answers[k])
	}
	fmt.Fprintf(w, "bystander: %d published, %d failed, slowest %.0f ms\n",
		r.BystanderOK, r.BystanderFailed, r.BystanderMaxMs)
	if r.ServerPeakMiB > 0 {
		fmt.Fprintf(w, "server peak RSS %.1f MiB\n", r.ServerPeakMiB)
	}
}
