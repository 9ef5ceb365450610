// Package bench is popsub bench, the load generator: it drives a
// PopSub server with publishers and subscribers, as an outsider's client
// would, and reports throughput, losses, duplicates, latency, and, when
// it started the server itself, the server's CPU time per delivery and
// memory per connection, read from /proc. docs/performance.md's own
// figures come from it and from docs/compare.
//
// # What it measures, and how it keeps out of the way
//
// A load generator shares the machine with the server it measures, so
// every choice here is about not measuring itself. Subscribers read each
// frame into one buffer they reuse and count it by scanning for the
// fields they need, never decoding it whole: a new buffer a frame spent
// a third of a core on the bench. Latency samples have their room made
// before the run (at most a million a subscriber). The bystander, a QoS
// 1 publisher beside a burst whose confirms are timed, runs as a process
// of its own (popsub bench --bystander-only): inside the bench it waited
// up to 130 ms for a core behind the bench's readers.
//
// Load comes in the shapes that break brokers, not only the one that
// flatters them. A publisher either stays at most Window messages ahead
// of the slowest subscriber (a closed loop, the steady figure), or, with
// Window 0, publishes as fast as the server reads (an open loop: a
// burst). Stuck subscribers never read, beside the others. Idle opens
// connections that say nothing (on one topic, or a topic each) and times
// one publish reaching them all. Delayed leaves messages waiting, none
// due, and reads the server's CPU while they wait.
// Flood runs one of the doors' attacks (Floods) beside a bystander.
//
// A message a reader was told it missed, in a skipped frame, counts as
// skipped, not lost: the contract is to say it. Lost is what was
// confirmed or published and never arrived, nor was said to be missed.
//
// Every loop is bounded in count or time, and Run refuses to load a host
// other than this machine unless AllowRemote says so: a load generator
// pointed at the wrong host is an attack.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/wire"
)

// benchSecret signs the tokens of a server bench starts itself.
const benchSecret = "popsub-bench-secret-of-at-least-32-bytes"

// Config is one run's shape; popsub bench's flags of the same names set
// it. The zero value of a field means what its flag's default says only
// where the field says so.
type Config struct {
	// URL is the server to load (ws://…/ws), or several separated by
	// commas, which connections take in turn. Empty: start Brokers
	// servers from Popsub on 127.0.0.1, and measure their CPU and
	// memory too.
	URL string
	// Popsub is the popsub binary, for the servers Run starts and the
	// bystander's process.
	Popsub string
	// Secret signs the clients' tokens; Token is used instead when the
	// secret is unknown.
	Secret, Token string
	// NATS, with no URL, makes the started brokers keep their log on
	// NATS JetStream there, which Brokers above 1 need to share one.
	NATS    string
	Brokers int
	// Publishers, Subscribers and Topics are connections and topics;
	// each subscriber takes every topic.
	Publishers, Subscribers, Topics int
	// Size is each payload's bytes; QoS 0 or 1 (subscribers ack QoS 1).
	Size, QoS int
	// Rate is messages a second for all publishers; 0: as fast as the
	// window allows.
	Rate float64
	// Window is the most messages a publisher may be ahead of the
	// slowest subscriber; 0: an open loop.
	Window int
	// Burst, when above 0, publishes that many messages in all, then
	// stops; Duration bounds the publishing either way.
	Burst    int
	Duration time.Duration
	// Stuck subscribers never read. Bystander adds a QoS 1 publisher on
	// a topic of its own every 10 ms, in a process of its own, and
	// reports its confirm latency; BystanderOnly is that process: it
	// publishes against URL until ctx ends, printing each confirm's µs.
	Stuck                    int
	Bystander, BystanderOnly bool
	// Idle, when above 0, runs the idle measure instead: that many
	// connections subscribed to one topic, or each to a topic of its own
	// with IdleTopicEach, then IdleWatch of watching the server's memory
	// through a round of its pings.
	Idle          int
	IdleTopicEach bool
	IdleWatch     time.Duration
	// Delayed, when above 0, runs the delayed measure instead: that many
	// QoS 1 messages due in an hour, 10,000 a topic and a token (the
	// default bound on what waits), each confirmed; then IdleWatch of
	// the server's CPU with nothing due, on a server Run started.
	Delayed int
	// Flood, when set, runs one of Floods instead, with Connections
	// strangers.
	Flood       string
	Connections int
	// Batch sends up to 64 publishes a frame, takes runs of deliveries
	// a frame and acks many at once.
	Batch bool
	// JSON prints the summary as one JSON object.
	JSON bool
	// AllowRemote allows a URL that is not this machine.
	AllowRemote bool

	urls []string // URL, split at commas
}

// Result is the summary, printed as text or as one JSON object.
type Result struct {
	Publishers      int     `json:"publishers"`
	Subscribers     int     `json:"subscribers"`
	Topics          int     `json:"topics"`
	PayloadBytes    int     `json:"payload_bytes"`
	QoS             int     `json:"qos"`
	Seconds         float64 `json:"seconds"`
	Published       int64   `json:"published"`
	Delivered       int64   `json:"delivered"`
	PublishedPerSec float64 `json:"published_per_sec"`
	DeliveredPerSec float64 `json:"delivered_per_sec"`
	Lost            int64   `json:"lost"`
	// Skipped counts what the broker told subscribers they missed, in
	// skipped frames: a reader overtaken by more than the log keeps
	// hears of it and goes on. It is not lost: it was said.
	Skipped           int64   `json:"skipped,omitempty"`
	Duplicated        int64   `json:"duplicated"`
	CutOff            int64   `json:"cut_off"`
	LatencyP50Micros  float64 `json:"latency_p50_us"`
	LatencyP90Micros  float64 `json:"latency_p90_us"`
	LatencyP99Micros  float64 `json:"latency_p99_us"`
	LatencyMaxMicros  float64 `json:"latency_max_us"`
	ServerCPUPerDeliv float64 `json:"server_cpu_us_per_delivery,omitempty"`
	ServerKiBPerConn  float64 `json:"server_kib_per_connection,omitempty"`
	ServerKiBWatched  float64 `json:"server_kib_per_connection_watched,omitempty"`
	IdleConnections   int     `json:"idle_connections,omitempty"`
	ServerFDs         float64 `json:"server_fds,omitempty"`
	ServerGoroutines  float64 `json:"server_goroutines,omitempty"`
	FanOutMillis      float64 `json:"fan_out_ms,omitempty"`
	Stuck             int     `json:"stuck,omitempty"`
	StuckCutOff       int64   `json:"stuck_cut_off,omitempty"`
	BystanderP50Milli float64 `json:"bystander_confirm_p50_ms,omitempty"`
	BystanderP99Milli float64 `json:"bystander_confirm_p99_ms,omitempty"`
	BystanderMaxMilli float64 `json:"bystander_confirm_max_ms,omitempty"`
	Bystanders        int     `json:"bystander_confirms,omitempty"`
	ServerPeakRSSMiB  float64 `json:"server_peak_rss_mib,omitempty"`
	// DelayedWaiting is the delayed measure's confirmed messages, and
	// ServerIdleCorePct the server's CPU while they wait, in percent of
	// one core.
	DelayedWaiting    int     `json:"delayed_waiting,omitempty"`
	ServerIdleCorePct float64 `json:"server_idle_core_pct,omitempty"`
}

// Defaults is popsub bench's run with no flags: ten subscribers to one
// publisher, a window of 1,000, 64-byte payloads for five seconds, on a
// server Run starts itself.
var Defaults = Config{Brokers: 1, Publishers: 1, Subscribers: 10,
	Topics: 1, Size: 64, Window: 1000, Duration: 5 * time.Second,
	IdleWatch: 25 * time.Second, Batch: true, Connections: 1000}

// Check says what in c Run cannot do, or nil.
func (c Config) Check() error {
	switch {
	case c.Publishers < 1 || c.Subscribers < 0 || c.Topics < 1:
		return errors.New("need at least one publisher and one topic")
	case c.QoS != 0 && c.QoS != 1:
		return errors.New("--qos must be 0 or 1")
	case c.Duration <= 0 || c.Duration > time.Hour || c.Window < 0:
		return errors.New("--duration must be in (0, 1h], --window ≥ 0")
	case c.Burst < 0 || c.Stuck < 0:
		return errors.New("--burst and --stuck may not be negative")
	case c.Brokers < 1 || c.Brokers > 1 && c.NATS == "":
		return errors.New("--brokers above 1 share a log: give --nats")
	case c.Connections < 1 || c.Connections > 20_000:
		return errors.New("--connections: 1 to 20000")
	case c.BystanderOnly && c.URL == "":
		return errors.New("--bystander-only needs --url")
	case c.URL == "" && c.Popsub == "":
		return errors.New("no server: give a URL, or the popsub binary " +
			"to start one")
	case c.IdleWatch < 0:
		return errors.New("--idle-watch may not be negative")
	case c.Idle < 0 || c.Idle > 100_000 || c.Size < 16 || c.Size > 1<<20:
		return errors.New("--idle ≤ 100000, 16 ≤ --size ≤ 1 MiB")
	case c.Delayed < 0 || c.Delayed > 1_000_000 ||
		c.Delayed > 0 && (c.URL != "" || c.IdleWatch == 0):
		return errors.New("--delayed: up to 1000000, on a server bench " +
			"starts (no --url), with an --idle-watch to measure over")
	}
	return nil
}

// Run loads the server at cfg.URL, or the brokers it starts itself when
// cfg.URL is empty, as cfg asks, and prints the summary to stdout, its
// progress to stderr.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	var server *benchServer
	var err error
	if cfg.URL == "" {
		server, err = startBenchServers(ctx, cfg)
		if err != nil {
			return err
		}
		defer server.stop()
		cfg.URL, cfg.Secret = strings.Join(server.urls, ","), benchSecret
	}
	cfg.urls = strings.Split(cfg.URL, ",")
	for _, target := range cfg.urls {
		if err := checkLoopback(target, cfg.AllowRemote); err != nil {
			return err
		}
	}
	if cfg.BystanderOnly {
		return bystand(ctx, cfg, func(d time.Duration) {
			fmt.Fprintln(stdout, d.Microseconds())
		})
	}
	if cfg.Flood != "" {
		result, err := runFlood(ctx, cfg, server)
		if err != nil {
			return err
		}
		if cfg.JSON {
			return json.NewEncoder(stdout).Encode(result)
		}
		printFlood(stdout, result)
		return nil
	}
	var result Result
	switch {
	case cfg.Idle > 0:
		result, err = runIdle(ctx, cfg, server)
	case cfg.Delayed > 0:
		result, err = runDelayed(ctx, cfg, server)
	default:
		result, err = runLoad(ctx, cfg, server, stderr)
	}
	if err != nil {
		return err
	}
	return printBench(stdout, cfg.JSON, result)
}

// checkLoopback refuses a target off this machine unless allowed: a load
// generator pointed at the wrong host is an attack.
func checkLoopback(target string, allowed bool) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("--url: %w", err)
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	if allowed || host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%s is not this machine; pass --allow-remote if you "+
		"own it", host)
}

// benchServer is the popsub serve child processes bench started, one or
// several brokers, measured together from /proc.
type benchServer struct {
	cmds []*exec.Cmd
	urls []string
	dir  string
}

// startBenchServers runs cfg.Popsub serve cfg.Brokers times on free
// ports, with limits wide enough that the bench, not the limits, is what
// is measured: on a bbolt file, or on the JetStream at cfg.NATS.
func startBenchServers(ctx context.Context, cfg Config) (*benchServer,
	error) {
	dir, err := os.MkdirTemp("", "popsub-bench")
	if err != nil {
		return nil, err
	}
	s := &benchServer{dir: dir}
	for i := range cfg.Brokers {
		if err := s.start(ctx, cfg, i); err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

// start runs the i-th broker.
func (s *benchServer) start(ctx context.Context, cfg Config, i int) error {
	args := []string{"serve", "--addr", "127.0.0.1:0", "--secret",
		benchSecret, "--log-level", "error",
		"--db", filepath.Join(s.dir, fmt.Sprint("bench", i, ".db"))}
	if cfg.NATS != "" {
		args = append(args, "--nats", cfg.NATS)
	}
	cmd := exec.CommandContext(ctx, cfg.Popsub, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	go io.Copy(io.Discard, out)
	rest, ok := strings.CutPrefix(line, "popsub listening on http://")
	if err != nil || !ok {
		cmd.Process.Kill()
		return fmt.Errorf("bench server did not start: %q", line)
	}
	s.cmds = append(s.cmds, cmd)
	address := strings.Fields(rest)[0]
	s.urls = append(s.urls, "ws://"+address+"/ws")
	return awaitPages(ctx, "http://"+address)
}

// awaitPages waits until the server at base has built its pages'
// WebAssembly: serve from a checkout compiles it in the background as it
// starts, a few seconds of both cores even from Go's build cache. A
// measure taken meanwhile had a p99 of 27-35 ms at 10,000 messages a
// second, against 0.7-0.8 ms once the build was done.
func awaitPages(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, asset := range []string{"/static/popsub.wasm", "/lab/lab.wasm.gz"} {
		request, _ := http.NewRequestWithContext(ctx, "GET", base+asset, nil)
		response, err := http.DefaultClient.Do(request)
		if err != nil {
			return fmt.Errorf("the server's pages: %w", err)
		}
		io.Copy(io.Discard, response.Body)
		response.Body.Close()
		if response.StatusCode != http.StatusOK {
			return fmt.Errorf("the server's %s: %s", asset, response.Status)
		}
	}
	return nil
}

// stop ends the servers and removes their databases.
func (s *benchServer) stop() {
	for _, cmd := range s.cmds {
		cmd.Process.Signal(os.Interrupt)
	}
	for _, cmd := range s.cmds {
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	}
	os.RemoveAll(s.dir)
}

// cpu is the servers' user and system CPU time so far.
func (s *benchServer) cpu() time.Duration {
	var total time.Duration
	for _, cmd := range s.cmds {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat",
			cmd.Process.Pid))
		if err != nil {
			continue
		}
		text := string(data)
		fields := strings.Fields(text[strings.LastIndexByte(text, ')')+2:])
		user, _ := strconv.ParseInt(fields[11], 10, 64)
		system, _ := strconv.ParseInt(fields[12], 10, 64)
		const ticksPerSecond = 100 // Linux's USER_HZ
		total += time.Duration(user+system) * time.Second / ticksPerSecond
	}
	return total
}

// memory is the servers' resident set, in KiB.
func (s *benchServer) memory() float64 {
	return s.status("VmRSS:")
}

// peakMemory is the most the servers' resident sets have been, in KiB.
func (s *benchServer) peakMemory() float64 {
	return s.status("VmHWM:")
}

// status adds up one KiB figure from the servers' /proc status.
func (s *benchServer) status(key string) float64 {
	total := 0.0
	for _, cmd := range s.cmds {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status",
			cmd.Process.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, key); ok {
				kib, _ := strconv.ParseFloat(strings.Fields(rest)[0], 64)
				total += kib
			}
		}
	}
	return total
}

// tokenFor signs a bench token, or uses the one given.
func (c Config) tokenFor(name string) (string, error) {
	if c.Secret == "" {
		if c.Token == "" {
			return "", errors.New("bench needs --secret or --token for --url")
		}
		return c.Token, nil
	}
	var claims popsub.Claims
	claims.Subject = name
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(24 * time.Hour))
	return claims.Sign([]byte(c.Secret))
}

// benchDial connects and authenticates one bench connection, the i-th
// of its kind, to the broker whose turn it is.
func benchDial(ctx context.Context, c Config, name string, i int,
	batch bool) (*websocket.Conn, error) {
	token, err := c.tokenFor(name)
	if err != nil {
		return nil, err
	}
	target := c.URL
	if len(c.urls) > 0 {
		target = c.urls[i%len(c.urls)]
	}
	return dial(ctx, target, nil, map[string]any{"token": token,
		"batch": batch, "client": name})
}

// dial connects to url and sends an auth frame of auth's fields, and
// returns once the broker has said "authenticated". Its reads are
// unlimited: the bench measures the server's limits, not its own.
func dial(ctx context.Context, url string, options *websocket.DialOptions,
	auth map[string]any) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, options)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	ws.SetReadLimit(-1)
	auth["type"] = "auth"
	var reply wire.Received
	if err = wsjson.Write(ctx, ws, auth); err == nil {
		err = wsjson.Read(ctx, ws, &reply)
	}
	if err == nil && reply.Type != "authenticated" {
		err = fmt.Errorf("authentication refused: %s", reply.Message)
	}
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	return ws, nil
}

// subscribeAll subscribes ws to every bench topic, live only, and waits
// for each reply.
func subscribeAll(ctx context.Context, ws *websocket.Conn, topics int) error {
	for i := range topics {
		frame := fmt.Appendf(nil,
			`{"type":"subscribe","topic":"bench/%d","last":0}`, i)
		err := ws.Write(ctx, websocket.MessageText, frame)
		if err != nil {
			return err
		}
	}
	for got := 0; got < topics; {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return err
		}
		got += strings.Count(string(data), `"subscribed"`)
	}
	return nil
}

// readInto reads ws's next message into buf, emptied first, and returns
// it: one buffer reused, where ws.Read allocates every message anew, and
// a reader of a burst must not spend the CPU the bench is measuring.
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

// printBench prints the summary.
func printBench(w io.Writer, asJSON bool, r Result) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	if r.IdleConnections > 0 {
		fmt.Fprintf(w, "idle connections: %d\nserver memory per connection: "+
			"%.1f KiB, at most %.1f KiB while watched\nserver file "+
			"descriptors %.0f, goroutines %.0f\none publish reached all in "+
			"%.1f ms\n", r.IdleConnections, r.ServerKiBPerConn,
			r.ServerKiBWatched, r.ServerFDs, r.ServerGoroutines,
			r.FanOutMillis)
		return nil
	}
	if r.DelayedWaiting > 0 {
		fmt.Fprintf(w, "delayed messages waiting: %d, none due\nserver "+
			"CPU while they wait: %.2f %% of a core, over %.0f s\nserver "+
			"resident memory at most %.0f MiB\n", r.DelayedWaiting,
			r.ServerIdleCorePct, r.Seconds, r.ServerPeakRSSMiB)
		return nil
	}
	fmt.Fprintf(w, "publishers %d, subscribers %d, topics %d, payload %d B, "+
		"qos %d, %.1fs\n", r.Publishers, r.Subscribers, r.Topics,
		r.PayloadBytes, r.QoS, r.Seconds)
	fmt.Fprintf(w, "published  %d (%.0f/s)\ndelivered  %d (%.0f/s)\n",
		r.Published, r.PublishedPerSec, r.Delivered, r.DeliveredPerSec)
	fmt.Fprintf(w, "lost %d, duplicated %d, cut off %d, skipped (and "+
		"said) %d\n", r.Lost, r.Duplicated, r.CutOff, r.Skipped)
	if r.Stuck > 0 {
		fmt.Fprintf(w, "stuck subscribers %d, cut off %d\n", r.Stuck,
			r.StuckCutOff)
	}
	if r.Bystanders > 0 {
		fmt.Fprintf(w, "bystander confirms %d: p50 %.2fms, p99 %.2fms, "+
			"max %.2fms\n", r.Bystanders, r.BystanderP50Milli,
			r.BystanderP99Milli, r.BystanderMaxMilli)
	}
	fmt.Fprintf(w, "latency p50 %.0fµs, p90 %.0fµs, p99 %.0fµs, "+
		"max %.0fµs\n", r.LatencyP50Micros, r.LatencyP90Micros, r.LatencyP99Micros,
		r.LatencyMaxMicros)
	if r.ServerCPUPerDeliv > 0 {
		fmt.Fprintf(w, "server CPU per delivery %.2fµs\n", r.ServerCPUPerDeliv)
	}
	if r.ServerPeakRSSMiB > 0 {
		fmt.Fprintf(w, "server peak RSS %.1f MiB\n", r.ServerPeakRSSMiB)
	}
	return nil
}

// isTerminal reports whether f is a terminal, where a progress bar helps;
// in pipes and CI logs it would only be noise.
func isTerminal(f io.Writer) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	info, err := file.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// percentile returns the p-th percentile of sorted durations, in µs.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(float64(len(sorted))*p), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Microsecond)
}

// maxSamples is how many latency samples a run keeps, over all its
// subscribers.
const maxSamples = 1_000_000

// latencies are one subscriber's samples, up to limit. Each subscriber
// keeps its own, so that a hundred of them recording do not contend for
// one lock; they are merged at the end (sortedLatencies).
type latencies struct {
	samples []time.Duration
	limit   int
}

// newLatencies makes room for limit samples up front: growing the slice
// as they came would copy it while deliveries wait to be timed.
func newLatencies(limit int) latencies {
	return latencies{samples: make([]time.Duration, 0, limit), limit: limit}
}

// add records one sample, unless the limit is reached.
func (l *latencies) add(d time.Duration) {
	if len(l.samples) < l.limit {
		l.samples = append(l.samples, d)
	}
}

// sortedLatencies merges the subscribers' samples, in order.
func sortedLatencies(subscribers []*benchSubscriber) []time.Duration {
	var all []time.Duration
	for _, s := range subscribers {
		all = append(all, s.latency.samples...)
	}
	slices.Sort(all)
	return all
}
