package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
)

// This file is popsub bench, the load generator. It drives a server with
// publishers and subscribers and reports throughput, losses, duplicates,
// latency, and, when it started the server itself, the server's CPU time
// per delivery and memory per connection, read from /proc. Every loop is
// bounded in count or time, and it refuses to load a host other than
// this machine unless told to.

// benchSecret signs the tokens of a server bench starts itself.
const benchSecret = "popsub-bench-secret-of-at-least-32-bytes"

// benchConfig is what the flags ask for.
type benchConfig struct {
	url, secret, token, nats        string
	urls                            []string // url, split at commas
	brokers                         int
	publishers, subscribers, topics int
	size, qos, window, idle, burst  int
	stuck                           int
	bystander, bystanderOnly        bool
	rate                            float64
	duration, idleWatch             time.Duration
	jsonOut, allowRemote, batch     bool
	flood                           string // benchflood.go
	connections                     int
}

// benchResult is the summary, printed as text or as one JSON object.
type benchResult struct {
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
}

// benchCommand runs popsub bench.
func benchCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	cfg, err := parseBench(args, stderr)
	if err != nil {
		return err
	}
	var server *benchServer
	if cfg.url == "" {
		server, err = startBenchServers(ctx, cfg.brokers, cfg.nats)
		if err != nil {
			return err
		}
		defer server.stop()
		cfg.url, cfg.secret = strings.Join(server.urls, ","), benchSecret
	}
	cfg.urls = strings.Split(cfg.url, ",")
	for _, target := range cfg.urls {
		if err := checkLoopback(target, cfg.allowRemote); err != nil {
			return err
		}
	}
	if cfg.bystanderOnly {
		return bystand(ctx, cfg, func(d time.Duration) {
			fmt.Fprintln(stdout, d.Microseconds())
		})
	}
	if cfg.flood != "" {
		result, err := runFlood(ctx, cfg, server)
		if err != nil {
			return err
		}
		if cfg.jsonOut {
			return json.NewEncoder(stdout).Encode(result)
		}
		printFlood(stdout, result)
		return nil
	}
	var result benchResult
	if cfg.idle > 0 {
		result, err = runIdle(ctx, cfg, server)
	} else {
		result, err = runLoad(ctx, cfg, server, stderr)
	}
	if err != nil {
		return err
	}
	return printBench(stdout, cfg.jsonOut, result)
}

// parseBench reads bench's flags.
func parseBench(args []string, stderr io.Writer) (benchConfig, error) {
	var c benchConfig
	fs := newFlagSet("popsub bench", stderr)
	fs.StringVar(&c.url, "url", "", "server to load, or several separated "+
		"by commas, which connections take in turn (default: start one on "+
		"127.0.0.1 and measure its CPU and memory)")
	fs.IntVar(&c.brokers, "brokers", 1, "brokers to start, sharing the "+
		"log on --nats; connections take them in turn")
	fs.StringVar(&c.nats, "nats", "", "the brokers bench starts keep the "+
		"log on NATS JetStream at this URL (their CPU is measured, the NATS "+
		"server's is not)")
	secret := secretFlag(fs, "secret", "POPSUB_SECRET",
		"the server's secret, to sign tokens")
	token := secretFlag(fs, "token", "POPSUB_TOKEN",
		"a token to use when the secret is unknown")
	fs.IntVar(&c.publishers, "publishers", 1, "publishing connections")
	fs.IntVar(&c.subscribers, "subscribers", 10, "subscribing connections")
	fs.IntVar(&c.topics, "topics", 1, "topics; each subscriber takes them all")
	fs.IntVar(&c.size, "size", 64, "payload bytes")
	fs.IntVar(&c.qos, "qos", 0, "0 or 1 (subscribers ack QoS 1)")
	fs.Float64Var(&c.rate, "rate", 0, "messages per second for all "+
		"publishers; 0: as fast as the slowest subscriber allows")
	fs.IntVar(&c.window, "window", 1000, "most messages a publisher may be "+
		"ahead of the slowest subscriber; 0: open loop, as fast as the "+
		"server reads")
	fs.IntVar(&c.burst, "burst", 0, "publish this many messages in all, "+
		"then stop (with --window 0: an open-loop burst)")
	fs.IntVar(&c.stuck, "stuck", 0, "subscribers that never read, beside "+
		"the others")
	fs.BoolVar(&c.bystander, "bystander", false, "a QoS 1 publisher on "+
		"another topic, every 10ms: its confirm latency")
	fs.BoolVar(&c.bystanderOnly, "bystander-only", false, "instead, be "+
		"only the bystander, against --url, until interrupted, and print "+
		"each confirm's latency in µs (--bystander runs one so, in a "+
		"process of its own, so that the bench's readers do not delay it)")
	fs.DurationVar(&c.duration, "duration", 5*time.Second,
		"how long to publish")
	fs.IntVar(&c.idle, "idle", 0, "instead, open N idle connections "+
		"subscribed to one topic, report server memory per connection, "+
		"and time one publish reaching them all")
	fs.DurationVar(&c.idleWatch, "idle-watch", 25*time.Second, "with "+
		"--idle, then watch the server's memory this long, through a "+
		"round of its pings (every 20 s by default), and report its most")
	fs.BoolVar(&c.batch, "batch", true, "several messages a frame: "+
		"publishers send up to 64, subscribers take runs and ack many at once")
	fs.StringVar(&c.flood, "flood", "", "instead, run one of the doors' "+
		"floods ("+strings.Join(floods, ", ")+") with a bystander "+
		"publishing beside it, and report the server's peak memory")
	fs.IntVar(&c.connections, "connections", 1000, "the flood's "+
		"connections")
	fs.BoolVar(&c.jsonOut, "json", false, "print the summary as JSON")
	fs.BoolVar(&c.allowRemote, "allow-remote", false, "allow a target that "+
		"is not this machine")
	if _, err := parseInterleaved(fs, args); err != nil {
		return c, err
	}
	c.secret, c.token = secret(""), token("")
	switch {
	case c.publishers < 1 || c.subscribers < 0 || c.topics < 1:
		return c, errors.New("need at least one publisher and one topic")
	case c.qos != 0 && c.qos != 1:
		return c, errors.New("--qos must be 0 or 1")
	case c.duration <= 0 || c.duration > time.Hour || c.window < 0:
		return c, errors.New("--duration must be in (0, 1h], --window ≥ 0")
	case c.burst < 0 || c.stuck < 0:
		return c, errors.New("--burst and --stuck may not be negative")
	case c.brokers < 1 || c.brokers > 1 && c.nats == "":
		return c, errors.New("--brokers above 1 share a log: give --nats")
	case c.connections < 1 || c.connections > 20_000:
		return c, errors.New("--connections: 1 to 20000")
	case c.bystanderOnly && c.url == "":
		return c, errors.New("--bystander-only needs --url")
	case c.idleWatch < 0:
		return c, errors.New("--idle-watch may not be negative")
	case c.idle < 0 || c.idle > 100_000 || c.size < 16 || c.size > 1<<20:
		return c, errors.New("--idle ≤ 100000, 16 ≤ --size ≤ 1 MiB")
	}
	return c, nil
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

// startBenchServers runs this binary's serve n times on free ports, with
// limits wide enough that the bench, not the limits, is what is
// measured: on a bbolt file, or on the JetStream at nats.
func startBenchServers(ctx context.Context, n int,
	nats string) (*benchServer, error) {
	dir, err := os.MkdirTemp("", "popsub-bench")
	if err != nil {
		return nil, err
	}
	s := &benchServer{dir: dir}
	for i := range n {
		if err := s.start(ctx, i, nats); err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

// start runs the i-th broker.
func (s *benchServer) start(ctx context.Context, i int, nats string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"serve", "--addr", "127.0.0.1:0", "--secret",
		benchSecret, "--log-level", "error",
		"--db", filepath.Join(s.dir, fmt.Sprint("bench", i, ".db"))}
	if nats != "" {
		args = append(args, "--nats", nats)
	}
	cmd := exec.CommandContext(ctx, self, args...)
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
	s.urls = append(s.urls, "ws://"+strings.Fields(rest)[0]+"/ws")
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
func (c benchConfig) tokenFor(name string) (string, error) {
	if c.secret == "" {
		if c.token == "" {
			return "", errors.New("bench needs --secret or --token for --url")
		}
		return c.token, nil
	}
	var claims popsub.Claims
	claims.Subject = name
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(24 * time.Hour))
	return claims.Sign([]byte(c.secret))
}

// benchDial connects and authenticates one bench connection, the i-th
// of its kind, to the broker whose turn it is.
func benchDial(ctx context.Context, c benchConfig, name string, i int,
	batch bool) (*websocket.Conn, error) {
	token, err := c.tokenFor(name)
	if err != nil {
		return nil, err
	}
	target := c.url
	if len(c.urls) > 0 {
		target = c.urls[i%len(c.urls)]
	}
	return dialAuthenticated(ctx, target, nil, map[string]any{"token": token,
		"batch": batch, "client": name})
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
func printBench(w io.Writer, asJSON bool, r benchResult) error {
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
