package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/queue"
)

// drainTimeout bounds the wait for the last deliveries after publishing.
const drainTimeout = 10 * time.Second

// load is one throughput run: its connections and what they counted.
type load struct {
	cfg         Config
	subscribers []*benchSubscriber
	sent        []atomic.Int64 // per publisher: messages sent
	confirmed   atomic.Int64   // QoS 1 confirms received
	progress    chan struct{}  // signalled as subscribers receive
	cutOff      atomic.Int64
	stuck       []*websocket.Conn // subscribers that never read
	bystander   []time.Duration   // confirm latencies, the bystander's
}

// benchSubscriber is one subscribing connection.
type benchSubscriber struct {
	ws       *websocket.Conn
	received []atomic.Int64 // per publisher: messages received
	mu       sync.Mutex     // guards seen and toAck
	seen     [][]bool       // per publisher: which indexes arrived
	toAck    map[string]uint64
	acking   chan struct{} // wakes ackLoop; closed when reading ends
	latency  latencies     // the reader's alone until the run ends
	dups     atomic.Int64
	// skipped counts the messages skipped frames said it missed.
	skipped atomic.Int64
	closed  atomic.Bool
}

// runLoad publishes for the configured duration and reports.
func runLoad(ctx context.Context, cfg Config, server *benchServer,
	stderr io.Writer) (Result, error) {
	l := &load{cfg: cfg, sent: make([]atomic.Int64, cfg.Publishers),
		progress: make(chan struct{}, 1)}
	if err := l.subscribe(ctx); err != nil {
		return Result{}, err
	}
	publishers, err := l.connectPublishers(ctx)
	if err != nil {
		return Result{}, err
	}
	if err := l.connectStuck(ctx); err != nil {
		return Result{}, err
	}

	// Publish until the deadline, then wait (bounded) for the tail.
	var cpuBefore time.Duration
	if server != nil {
		cpuBefore = server.cpu()
	}
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	done := make(chan struct{})
	go l.showProgress(stderr, start, done)
	var wg sync.WaitGroup
	for i, ws := range publishers {
		wg.Go(func() { l.publish(ctx, i, ws, start, deadline) })
	}
	bystanderDone, confirmed := make(chan struct{}), make(chan struct{})
	if cfg.Bystander {
		go l.runBystander(ctx, done, confirmed, bystanderDone)
	} else {
		close(bystanderDone)
		close(confirmed)
	}
	wg.Wait()
	l.drain()
	elapsed := time.Since(start)
	// The bystander starts with the load, as a client beside a burst
	// would, and times at least one confirm: a burst over in 70 ms ended
	// before its process had dialled.
	select {
	case <-confirmed:
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	close(done)
	<-bystanderDone

	result := l.result(elapsed)
	result.Stuck, result.StuckCutOff = len(l.stuck), l.stuckCutOff()
	l.bystanderResult(&result)
	if server != nil {
		result.ServerPeakRSSMiB = server.peakMemory() / 1024
	}
	if server != nil && result.Delivered > 0 {
		cpu := server.cpu() - cpuBefore
		result.ServerCPUPerDeliv = float64(cpu.Microseconds()) /
			float64(result.Delivered)
	}
	for _, s := range l.subscribers {
		s.ws.CloseNow()
	}
	for _, ws := range publishers {
		ws.CloseNow()
	}
	return result, nil
}

// subscribe connects the subscribers and starts their readers.
func (l *load) subscribe(ctx context.Context) error {
	for i := range l.cfg.Subscribers {
		ws, err := benchDial(ctx, l.cfg, fmt.Sprintf("sub-%d", i), i,
			l.cfg.Batch)
		if err != nil {
			return err
		}
		if err := subscribeAll(ctx, ws, l.cfg.Topics); err != nil {
			return err
		}
		s := &benchSubscriber{ws: ws,
			received: make([]atomic.Int64, l.cfg.Publishers),
			seen:     make([][]bool, l.cfg.Publishers),
			toAck:    map[string]uint64{}, acking: make(chan struct{}, 1),
			latency: newLatencies(maxSamples / l.cfg.Subscribers)}
		l.subscribers = append(l.subscribers, s)
		go l.read(s)
		go s.ackLoop()
	}
	return nil
}

// connectPublishers connects the publishers and drains their replies.
func (l *load) connectPublishers(ctx context.Context) ([]*websocket.Conn,
	error) {
	var list []*websocket.Conn
	for i := range l.cfg.Publishers {
		ws, err := benchDial(ctx, l.cfg, fmt.Sprintf("pub-%d", i), i,
			l.cfg.Batch)
		if err != nil {
			return nil, err
		}
		list = append(list, ws)
		go func() {
			var buf bytes.Buffer
			for {
				data, err := readInto(context.Background(), ws, &buf)
				if err != nil {
					return
				}
				l.confirmed.Add(int64(bytes.Count(data, []byte(`"published"`))))
			}
		}()
	}
	return list, nil
}

// publishBatch is the most publishes a batching publisher puts in one
// frame, and publishBatchBytes the most bytes, well under the server's
// default frame limit of 1 MiB.
const (
	publishBatch      = 64
	publishBatchBytes = 256 << 10
)

// publish sends messages from publisher p until the deadline, paced by
// the rate or held within the window of the slowest subscriber. With
// --batch it sends up to publishBatch messages a frame, as a client that
// publishes fast would, and sends what it has before any wait.
func (l *load) publish(ctx context.Context, p int, ws *websocket.Conn,
	start, deadline time.Time) {
	padding := strings.Repeat("x", max(l.cfg.Size-48, 1))
	perPublisher := l.cfg.Rate / float64(l.cfg.Publishers)
	var frame []byte
	queued := 0
	send := func() bool {
		if queued == 0 {
			return true
		}
		err := ws.Write(ctx, websocket.MessageText, frame)
		l.sent[p].Add(int64(queued))
		frame, queued = frame[:0], 0
		return err == nil
	}
	defer send()
	limit := int64(math.MaxInt64)
	if l.cfg.Burst > 0 {
		limit = int64((l.cfg.Burst + l.cfg.Publishers - 1) / l.cfg.Publishers)
	}
	for n := int64(0); n < limit && time.Now().Before(deadline); n++ {
		if perPublisher > 0 {
			due := start.Add(time.Duration(float64(n) / perPublisher *
				float64(time.Second)))
			if time.Until(due) > 0 && !send() {
				return
			}
			time.Sleep(time.Until(due))
		}
		if !l.inWindow(p, n) && (!send() || !l.waitForWindow(p, n, deadline)) {
			return
		}
		if queued > 0 {
			frame = append(frame, '\n')
		}
		topic := (p + int(n)) % l.cfg.Topics
		frame = fmt.Appendf(frame, `{"type":"publish","topic":"bench/%d",`+
			`"qos":%d,"payload":{"p":%d,"n":%d,"t":%d,"x":"%s"}}`, topic,
			l.cfg.QoS, p, n, time.Now().UnixNano(), padding)
		queued++
		full := queued == publishBatch || len(frame) >= publishBatchBytes
		if (!l.cfg.Batch || full) && !send() {
			return
		}
	}
}

// inWindow reports whether publisher p's message n is within the window
// of every live subscriber. A window of 0 is an open loop: always.
func (l *load) inWindow(p int, n int64) bool {
	if l.cfg.Window == 0 {
		return true
	}
	slowest := n
	for _, s := range l.subscribers {
		if !s.closed.Load() {
			slowest = min(slowest, s.received[p].Load())
		}
	}
	return n-slowest < int64(l.cfg.Window)
}

// waitForWindow holds publisher p until its message n is within the
// window of every live subscriber, or the deadline passes.
func (l *load) waitForWindow(p int, n int64, deadline time.Time) bool {
	for {
		if l.inWindow(p, n) {
			return true
		}
		select {
		case <-l.progress:
		case <-time.After(time.Until(deadline)):
			return false
		}
	}
}

// read counts a subscriber's deliveries until its connection ends.
func (l *load) read(s *benchSubscriber) {
	defer s.closed.Store(true)
	defer close(s.acking)
	acks := map[string]uint64{}
	var buf bytes.Buffer
	for {
		data, err := readInto(context.Background(), s.ws, &buf)
		if err != nil {
			if websocket.CloseStatus(err) == 4008 {
				l.cutOff.Add(1)
			}
			return
		}
		now := time.Now().UnixNano()
		clear(acks)
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			l.count(s, line, now, acks)
		}
		if len(acks) > 0 {
			s.mu.Lock()
			for topic, seq := range acks {
				s.toAck[topic] = max(s.toAck[topic], seq)
			}
			s.mu.Unlock()
			queue.Notify(s.acking)
		}
		queue.Notify(l.progress)
	}
}

// ackLoop acks what a subscriber received, each topic up to its highest
// seq, from a goroutine of its own, as a client that keeps reading while
// it acks would: the reader never waits for an ack to be written, and
// what arrives meanwhile is covered by the next one.
func (s *benchSubscriber) ackLoop() {
	for range s.acking {
		s.mu.Lock()
		acks := s.toAck
		s.toAck = map[string]uint64{}
		s.mu.Unlock()
		for topic, seq := range acks {
			ack := fmt.Sprintf(`{"type":"ack","topic":%q,"seq":%d}`, topic, seq)
			if s.ws.Write(context.Background(), websocket.MessageText,
				[]byte(ack)) != nil {
				return
			}
		}
	}
}

// count records one delivery: who sent it, whether it came before, how
// long it took, and what to ack. The fields are looked for in the order
// the broker writes them, each search starting where the last ended, so
// that a line is read once: the bench must not spend the CPU it is trying
// to measure.
func (l *load) count(s *benchSubscriber, line []byte, now int64,
	acks map[string]uint64) {
	if bytes.Contains(line, []byte(`"type":"skipped"`)) {
		if missed, _, ok := field(line, `"missed":`); ok {
			s.skipped.Add(missed)
		}
		return
	}
	topic, rest := between(line, `"topic":"`, `"`)
	p, rest, okP := field(rest, `"p":`)
	n, rest, okN := field(rest, `"n":`)
	sent, rest, okT := field(rest, `"t":`)
	if !okP || !okN || !okT || int(p) >= len(s.received) {
		return
	}
	s.latency.add(time.Duration(now - sent))
	s.mu.Lock()
	for int64(len(s.seen[p])) <= n {
		s.seen[p] = append(s.seen[p], make([]bool, 1024)...)
	}
	if s.seen[p][n] {
		s.dups.Add(1)
	} else {
		s.seen[p][n] = true
		s.received[p].Add(1)
	}
	s.mu.Unlock()
	if l.cfg.QoS == 1 {
		seq, _, _ := field(rest, `"seq":`)
		if uint64(seq) > acks[string(topic)] {
			acks[string(topic)] = uint64(seq)
		}
	}
}

// drain waits, at most drainTimeout, for every subscriber to receive
// everything sent.
func (l *load) drain() {
	deadline := time.Now().Add(drainTimeout)
	for time.Now().Before(deadline) {
		if l.caughtUp() {
			return
		}
		select {
		case <-l.progress:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// caughtUp reports whether every live subscriber has everything sent,
// or was told it skipped it.
func (l *load) caughtUp() bool {
	for _, s := range l.subscribers {
		if !s.closed.Load() && s.missing(l.sent) > 0 {
			return false
		}
	}
	return true
}

// missing is how many of the messages sent s neither received nor was
// told it skipped. Skipped frames say how many, not whose, so they are
// counted against all publishers together.
func (s *benchSubscriber) missing(sent []atomic.Int64) int64 {
	n := -s.skipped.Load()
	for p := range sent {
		n += sent[p].Load() - s.received[p].Load()
	}
	return max(n, 0)
}

// result summarizes the run.
func (l *load) result(elapsed time.Duration) Result {
	r := Result{Publishers: l.cfg.Publishers,
		Subscribers: l.cfg.Subscribers, Topics: l.cfg.Topics,
		PayloadBytes: l.cfg.Size, QoS: l.cfg.QoS,
		Seconds: elapsed.Seconds(), CutOff: l.cutOff.Load()}
	for p := range l.sent {
		r.Published += l.sent[p].Load()
	}
	for _, s := range l.subscribers {
		r.Duplicated += s.dups.Load()
		r.Skipped += s.skipped.Load()
		for p := range l.sent {
			r.Delivered += s.received[p].Load()
		}
		if !s.closed.Load() {
			r.Lost += s.missing(l.sent)
		}
	}
	r.PublishedPerSec = float64(r.Published) / elapsed.Seconds()
	r.DeliveredPerSec = float64(r.Delivered) / elapsed.Seconds()
	sorted := sortedLatencies(l.subscribers)
	r.LatencyP50Micros = percentile(sorted, 0.50)
	r.LatencyP90Micros = percentile(sorted, 0.90)
	r.LatencyP99Micros = percentile(sorted, 0.99)
	if len(sorted) > 0 {
		r.LatencyMaxMicros = percentile(sorted, 1)
	}
	return r
}

// showProgress draws a progress bar on a terminal until done.
func (l *load) showProgress(w io.Writer, start time.Time,
	done chan struct{}) {
	if !isTerminal(w) {
		return
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			fmt.Fprint(w, "\r\033[K")
			return
		case <-tick.C:
			part := min(time.Since(start).Seconds()/l.cfg.Duration.Seconds(), 1)
			bar := strings.Repeat("#", int(part*30)) +
				strings.Repeat(" ", 30-int(part*30))
			var sent int64
			for p := range l.sent {
				sent += l.sent[p].Load()
			}
			fmt.Fprintf(w, "\r[%s] %.1fs, %d published", bar,
				time.Since(start).Seconds(), sent)
		}
	}
}

// runIdle opens idle connections, all subscribed to one topic (or each
// to one of its own, idle/<n>), and reports the server's file
// descriptors and goroutines, and its memory per connection if the bench
// started it; then one publish to the topic (or to each), and how long
// until every connection has it. Each connection
// reads from the start, as a real client does, so that it answers the
// server's pings. Each 20,000 come from a source address of their own,
// 127.0.0.1, then .2, …: ports run out near 28,000 a source.
func runIdle(ctx context.Context, cfg Config,
	server *benchServer) (Result, error) {
	memory := func() float64 { return 0 }
	if server != nil {
		memory = server.memory
	}
	before := memory()
	open := make([]*websocket.Conn, 0, cfg.Idle)
	defer func() {
		for _, ws := range open {
			ws.CloseNow()
		}
	}()
	topic := func(i int) string {
		if cfg.IdleTopicEach {
			return "idle/" + strconv.Itoa(i)
		}
		return "idle"
	}
	var arrived sync.WaitGroup
	for i := range cfg.Idle {
		dialer := &net.Dialer{}
		if i >= 20_000 {
			dialer.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0,
				byte(1+i/20_000))}
		}
		options := &websocket.DialOptions{HTTPClient: &http.Client{
			Transport: &http.Transport{DialContext: dialer.DialContext}}}
		token, err := cfg.tokenFor("idle-" + strconv.Itoa(i))
		if err != nil {
			return Result{}, err
		}
		ws, err := dial(ctx, cfg.urls[0], options,
			map[string]any{"token": token})
		if err != nil {
			return Result{}, fmt.Errorf("connection %d: %w", i+1, err)
		}
		open = append(open, ws)
		ws.Write(ctx, websocket.MessageText, fmt.Appendf(nil,
			`{"type":"subscribe","topic":%q}`, topic(i)))
		if _, _, err := ws.Read(ctx); err != nil {
			return Result{}, err
		}
		arrived.Go(func() { ws.Read(ctx) })
	}
	// A connection quiet for a second (socket.IdleAfter) hands its
	// reader to the poller: wait until the last one has, and then some.
	time.Sleep(2 * time.Second)
	perConnection := func() float64 {
		return (memory() - before) / float64(cfg.Idle)
	}
	r := Result{IdleConnections: cfg.Idle,
		ServerKiBPerConn: perConnection()}
	metrics := serverMetrics(ctx, cfg.urls[0])
	r.ServerFDs, r.ServerGoroutines = metrics["process_open_fds"],
		metrics["go_goroutines"]
	// Each ping wakes every reader with its pong, for a second: the
	// memory that costs is part of what an idle connection costs.
	r.ServerKiBWatched = r.ServerKiBPerConn
	for end := time.Now().Add(cfg.IdleWatch); server != nil &&
		ctx.Err() == nil && time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		r.ServerKiBWatched = max(r.ServerKiBWatched, perConnection())
	}

	// One publish, which every connection is waiting for.
	publisher, err := benchDial(ctx, cfg, "idle-publisher", 0, false)
	if err != nil {
		return r, err
	}
	defer publisher.CloseNow()
	start := time.Now()
	for i := range cfg.Idle {
		publisher.Write(ctx, websocket.MessageText, fmt.Appendf(nil,
			`{"type":"publish","topic":%q,"payload":"all of you"}`, topic(i)))
		if !cfg.IdleTopicEach {
			break
		}
	}
	arrived.Wait()
	r.FanOutMillis = float64(time.Since(start).Microseconds()) / 1000
	return r, ctx.Err()
}

// serverMetrics reads the gauges of the server's /metrics, by name.
func serverMetrics(ctx context.Context, wsURL string) map[string]float64 {
	gauges := map[string]float64{}
	target := strings.Replace(strings.TrimSuffix(wsURL, "/ws"), "ws", "http", 1)
	request, _ := http.NewRequestWithContext(ctx, "GET", target+"/metrics", nil)
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		return gauges
	}
	defer response.Body.Close()
	lines := bufio.NewScanner(response.Body)
	for lines.Scan() {
		name, value, ok := strings.Cut(lines.Text(), " ")
		if n, err := strconv.ParseFloat(value, 64); ok && err == nil {
			gauges[name] = n
		}
	}
	return gauges
}

// field reads the integer after key in a frame, without a JSON decoder,
// and returns it with the rest of the line after it.
func field(line []byte, key string) (int64, []byte, bool) {
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0, line, false
	}
	rest := line[i+len(key):]
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	n, err := strconv.ParseInt(string(rest[:end]), 10, 64)
	return n, rest[end:], err == nil
}

// between returns the bytes after open up to the next close, and the
// rest of the line from that close on.
func between(line []byte, open, close string) ([]byte, []byte) {
	i := bytes.Index(line, []byte(open))
	if i < 0 {
		return nil, line
	}
	rest := line[i+len(open):]
	if j := bytes.Index(rest, []byte(close)); j >= 0 {
		return rest[:j], rest[j:]
	}
	return nil, line
}

// connectStuck connects the subscribers that never read.
func (l *load) connectStuck(ctx context.Context) error {
	for i := range l.cfg.Stuck {
		ws, err := benchDial(ctx, l.cfg, fmt.Sprintf("stuck-%d", i), i,
			false)
		if err != nil {
			return err
		}
		if err := subscribeAll(ctx, ws, l.cfg.Topics); err != nil {
			return err
		}
		l.stuck = append(l.stuck, ws)
	}
	return nil
}

// stuckCutOff counts the stuck subscribers the server has closed: each
// reads its backlog now, for at most two seconds; one still open then
// was not cut off.
func (l *load) stuckCutOff() int64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, ws := range l.stuck {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(),
				2*time.Second)
			defer cancel()
			for {
				if _, _, err := ws.Read(ctx); err != nil {
					if ctx.Err() == nil {
						n.Add(1)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	return n.Load()
}

// runBystander runs the bystander in a process of its own (popsub bench
// --bystander-only) until done, and keeps its confirm latencies. In this
// process it waited for a CPU behind the bench's own readers: up to 130
// ms between the server's write of a confirm and its read here, with
// the server's part under 20 ms. confirmed is closed at its first
// confirm, or once it has failed.
func (l *load) runBystander(ctx context.Context, done, confirmed,
	finished chan struct{}) {
	defer close(finished)
	var first sync.Once
	hasOne := func() { first.Do(func() { close(confirmed) }) }
	defer hasOne()
	cmd := exec.CommandContext(ctx, l.cfg.Popsub, "bench", "--bystander-only",
		"--url", l.cfg.urls[0], "--allow-remote="+
			strconv.FormatBool(l.cfg.AllowRemote))
	cmd.Env = append(os.Environ(), "POPSUB_SECRET="+l.cfg.Secret,
		"POPSUB_TOKEN="+l.cfg.Token)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil || cmd.Start() != nil {
		return
	}
	// Read its lines as they come, so that it never waits for room in
	// the pipe, however long the run.
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer hasOne() // it ended without a confirm
		for lines := bufio.NewScanner(out); lines.Scan(); {
			if micros, err := strconv.Atoi(lines.Text()); err == nil {
				l.bystander = append(l.bystander,
					time.Duration(micros)*time.Microsecond)
				hasOne()
			}
		}
	}()
	<-done
	cmd.Process.Signal(os.Interrupt)
	<-read
	cmd.Wait()
}

// bystand publishes one QoS 1 message every 10ms to a topic of its own
// until ctx ends, and reports how long each confirm took.
func bystand(ctx context.Context, cfg Config,
	report func(time.Duration)) error {
	ws, err := benchDial(ctx, cfg, "bystander", 0, false)
	if err != nil {
		return err
	}
	defer ws.CloseNow()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	frame := []byte(`{"type":"publish","topic":"bystander","qos":1,` +
		`"payload":"still here"}`)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		sent := time.Now()
		if ws.Write(ctx, websocket.MessageText, frame) != nil {
			return nil
		}
		if _, _, err := ws.Read(ctx); err != nil {
			return nil
		}
		report(time.Since(sent))
	}
}

// bystanderResult adds the bystander's confirm latencies to r.
func (l *load) bystanderResult(r *Result) {
	sorted := slices.Sorted(slices.Values(l.bystander))
	if len(sorted) == 0 {
		return
	}
	r.Bystanders = len(sorted)
	r.BystanderP50Milli = percentile(sorted, 0.50) / 1000
	r.BystanderP99Milli = percentile(sorted, 0.99) / 1000
	r.BystanderMaxMilli = percentile(sorted, 1) / 1000
}
