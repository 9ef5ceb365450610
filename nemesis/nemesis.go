// Package nemesis is popsub chaos: real brokers on 127.0.0.1, one on a
// bbolt file or several sharing a NATS JetStream log, each behind a TCP
// proxy of its own, and a seeded nemesis that breaks them while package
// chaos's clients publish and subscribe through it all. Then every fault
// is healed, the clients drain, every log is read from the start, and
// package chaos's checker holds the history to docs/protocol.md's
// promises. Run fails on any violation, and prints the seed that
// replays the nemesis's draws.
//
// # Real processes, not a simulation
//
// The root package's simulation runs the broker in fake time on a disk
// that forgets what it had not synced: fast, seeded, exact. What it
// cannot show is the operating system under a real broker: a SIGKILL
// between a write and its fsync, a process paused with SIGSTOP while its
// clients time out, a socket that stops carrying bytes, a NATS node
// gone. So the brokers here are the popsub binary itself (Config.Popsub),
// started and killed as processes, on real files and ports; the same
// checker judges both drivers, so a violation means the same thing in
// either.
//
// # The faults
//
// Every Every (on average) the nemesis draws one: kill -9 a broker and
// start it again on the same files, also right after a new topic's first
// delivery and twice before a commit; restart one cleanly (SIGTERM);
// pause one (SIGSTOP, then SIGCONT); cut every connection at a proxy, or
// stall them (the proxy stops carrying bytes); on JetStream, kill the
// NATS server or a node of its cluster. Work-queue members join and
// leave a group on their own schedule, and a client narrows an
// overlapping subscription, since restarts, overlaps and floods are
// where promises break.
package nemesis

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/chaos"
)

// chaosSecret signs the run's tokens.
const chaosSecret = "popsub-chaos-secret-of-at-least-32-bytes"

// Config is one run; popsub chaos's flags of the same names set it.
type Config struct {
	// Engine is "bbolt" (one broker on a bbolt file) or "nats" (Brokers
	// brokers sharing a JetStream log on NATSServer, a path to the
	// nats-server program, with Replicas 1 or 3 nodes).
	Engine, NATSServer string
	Brokers, Replicas  int
	// Popsub is the popsub program the brokers run.
	Popsub string
	// Topics each have a durable and a plain subscriber; Publishers
	// spread over them, each with at most Window unconfirmed publishes,
	// and Rate new values a second (0: as fast as the window allows).
	Topics, Publishers, Window int
	Rate                       float64
	// Duration is how long the nemesis injects faults, one every Every
	// on average; NATSEvery, when above 0, also kills the NATS server
	// every that long to twice as long. Drain is how long the clients
	// have to finish after the last fault.
	Duration, Every, NATSEvery, Drain time.Duration
	// Seed seeds the nemesis's draws: the same seed, the same faults in
	// the same order.
	Seed uint64
}

// Defaults is popsub chaos with no flags, but for its seed, which the
// command draws: a minute of faults on one bbolt broker.
var Defaults = Config{Engine: "bbolt", NATSServer: "nats-server",
	Brokers: 3, Replicas: 1, Topics: 2, Publishers: 3, Window: 16,
	Rate: 1000, Duration: time.Minute, Every: 3 * time.Second,
	Drain: 3 * time.Minute}

// Check says what in c Run cannot do, or nil.
func (c Config) Check() error {
	switch {
	case c.Engine != "bbolt" && c.Engine != "nats":
		return fmt.Errorf("--engine %q: bbolt or nats", c.Engine)
	case c.Replicas != 1 && c.Replicas != 3:
		return errors.New("--nats-replicas must be 1 or 3")
	case c.Topics < 1 || c.Publishers < 1 || c.Window < 1:
		return errors.New("--topics, --publishers and --window must " +
			"be at least 1")
	case c.Popsub == "":
		return errors.New("no popsub program for the brokers")
	case c.Every <= 0 || c.Duration < 0 || c.Drain <= 0:
		return errors.New("--every and --drain must be above 0")
	}
	return nil
}

// Run runs the brokers, the clients and the nemesis as cfg says, prints
// what happens and the checker's report to stdout, and returns an error
// naming the seed if a promise broke.
func Run(ctx context.Context, cfg Config, stdout io.Writer) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	if cfg.Engine == "bbolt" {
		cfg.Brokers = 1
	}
	dir, err := os.MkdirTemp("", "popsub-chaos")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	run := &chaosRun{cfg: cfg, dir: dir, out: stdout,
		rand:    rand.New(rand.NewPCG(cfg.Seed, 0)),
		history: &chaos.History{}, started: time.Now()}
	fmt.Fprintf(stdout, "popsub chaos --engine %s --seed %d: %d broker(s), "+
		"faults for %s\n", cfg.Engine, cfg.Seed, cfg.Brokers, cfg.Duration)
	defer run.stopAll()
	if err := run.startAll(ctx); err != nil {
		return err
	}
	report, err := run.workload(ctx)
	if err != nil {
		run.tell()
		return err
	}
	fmt.Fprint(stdout, report)
	if !report.OK() {
		run.tell()
		return fmt.Errorf("promises broken (rerun: popsub chaos --engine "+
			"%s --seed %d)", cfg.Engine, cfg.Seed)
	}
	return nil
}

// chaosRun is one run's processes, proxies and history.
type chaosRun struct {
	cfg     Config
	dir     string
	out     io.Writer
	rand    *rand.Rand // the nemesis's; only its goroutine uses it
	history *chaos.History
	started time.Time
	nats    []*process // the NATS servers, with --engine nats
	// natsKills lets one NATS kill happen at a time, from the draw or
	// from --nats-every.
	natsKills sync.Mutex
	brokers   []*process
	proxies   []*chaos.Proxy
	// fresh numbers the new topics the nemesis makes.
	fresh []string
	// mu guards clients, the names of the subscribers and members still
	// reading, for a drain that times out to name.
	mu      sync.Mutex
	clients map[string]bool
}

// process is one server the run started, which the nemesis may kill,
// pause and start again on the same files and, for NATS, the same port.
type process struct {
	name string
	args func() []string // the command line, made anew at each start
	// ready reads the process's first line and returns its address.
	ready func(line string) (string, bool)

	mu      sync.Mutex // guards the fields below
	cmd     *exec.Cmd
	address string    // where it listens, once ready
	exited  chan bool // closed when cmd exits
	// said is the last of what it printed, for a run that fails.
	said []string
}

// start runs the process and waits until it says it is ready.
func (p *process) start(ctx context.Context) error {
	args := p.args()
	cmd := exec.Command(args[0], args[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan bool)
	lines := bufio.NewScanner(out)
	address := ""
	for address == "" && lines.Scan() {
		address, _ = p.ready(lines.Text())
	}
	go func() {
		for lines.Scan() {
			p.remember(lines.Text())
		}
		cmd.Wait()
		close(exited)
	}()
	if address == "" {
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s did not start", p.name)
	}
	p.mu.Lock()
	p.cmd, p.address, p.exited = cmd, address, exited
	p.mu.Unlock()
	return nil
}

// remember keeps one of the last lines the process printed.
func (p *process) remember(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.said = append(p.said, line)
	if len(p.said) > 10 {
		p.said = p.said[1:]
	}
}

// startRetrying starts the process, trying again for up to a minute: a
// broker cannot start while NATS is down.
func (p *process) startRetrying(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := p.start(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		<-exited
	}
}

// signal sends sig to the process.
func (p *process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		syscall.Kill(p.cmd.Process.Pid, sig)
	}
}

// stop ends the process gracefully, or kills it after ten seconds.
func (p *process) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT)
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// addr is where the process listens now.
func (p *process) addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.address
}

// startAll starts the NATS servers, the brokers and their proxies.
func (r *chaosRun) startAll(ctx context.Context) error {
	if r.cfg.Engine == "nats" {
		if err := r.startNATS(ctx); err != nil {
			return err
		}
	}
	for i := range r.cfg.Brokers {
		b := r.broker(i)
		if err := b.startRetrying(ctx); err != nil {
			return err
		}
		r.brokers = append(r.brokers, b)
		p, err := chaos.NewProxy(b.addr)
		if err != nil {
			return err
		}
		r.proxies = append(r.proxies, p)
	}
	return nil
}

// broker describes the i-th broker's process: its own database, and on
// NATS the shared log. Its log keeps every message of the run, so that
// the final read is the whole history: a message retention dropped would
// look lost.
func (r *chaosRun) broker(i int) *process {
	return &process{name: fmt.Sprint("broker-", i+1),
		args: func() []string {
			args := []string{r.cfg.Popsub, "serve", "--addr", "127.0.0.1:0",
				"--secret", chaosSecret, "--log-level", "error",
				"--db", filepath.Join(r.dir, fmt.Sprint("broker-", i+1, ".db")),
				"--ack-timeout", "1s", "--max-messages", "100000000",
				"--max-log-bytes", fmt.Sprint(r.logBytes()), "--ttl", "24h",
				"--max-delayed", fmt.Sprint(chaosMaxDelayed)}
			if r.cfg.Engine == "nats" {
				args = append(args, "--nats", r.natsURLs(),
					"--nats-replicas", fmt.Sprint(r.cfg.Replicas))
			}
			return args
		},
		ready: func(line string) (string, bool) {
			rest, ok := strings.CutPrefix(line, "popsub listening on http://")
			if !ok {
				return "", false
			}
			return strings.Fields(rest)[0], true
		}}
}

// chaosMaxDelayed is the brokers' --max-delayed: above what a topic's
// publishers have waiting at the default rate (about 375 of the values
// two publishers send in 1.5 s at 1,000 a second each, one in eight
// delayed by 1.5 s), below a burst. At higher rates, or while a fault
// holds up what fell due (NATS down, say), some of their delayed values
// may be refused past it too, which the checker allows.
const chaosMaxDelayed = 500

// burstTopic is the topic of the bursts of delayed values.
const burstTopic = "later"

// logBytes is how many bytes each topic's log may keep: everything the
// run can publish, at 256 bytes a message, but at least 64 MiB. Not
// more: JetStream sets aside each stream's limit on its disk.
func (r *chaosRun) logBytes() int64 {
	rate := r.cfg.Rate
	if rate == 0 {
		rate = 20_000 // the most one publisher manages here
	}
	perTopic := rate * float64(r.cfg.Publishers) *
		(r.cfg.Duration + r.cfg.Drain).Seconds() * 256 /
		float64(r.cfg.Topics)
	return max(64<<20, int64(perTopic))
}

// startNATS starts one NATS server, or a cluster of three, each on a
// port it keeps across restarts.
func (r *chaosRun) startNATS(ctx context.Context) error {
	nodes := r.cfg.Replicas
	ports, err := freePorts(2 * nodes)
	if err != nil {
		return err
	}
	var routes []string
	for i := range nodes {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d",
			ports[nodes+i]))
	}
	for i := range nodes {
		// JetStream's default syncs every two minutes and acknowledges
		// before: a kill -9 of the NATS server then loses what it
		// acknowledged and not yet wrote (a CI run lost one confirmed
		// value so; nats-server issue 7564). A confirm's promise needs
		// sync_interval: always, as tutorial 7 says.
		config := filepath.Join(r.dir, fmt.Sprint("nats-", i+1, ".conf"))
		err := os.WriteFile(config, fmt.Appendf(nil,
			"jetstream { store_dir: %q, sync_interval: always }\n",
			filepath.Join(r.dir, fmt.Sprint("nats-", i+1))), 0o644)
		if err != nil {
			return err
		}
		args := []string{r.cfg.NATSServer, "-c", config, "-a", "127.0.0.1",
			"-p", fmt.Sprint(ports[i]), "--server_name",
			fmt.Sprint("nats-", i+1)}
		if nodes > 1 {
			args = append(args, "--cluster_name", "popsub-chaos", "--cluster",
				routes[i], "--routes", strings.Join(routes, ","))
		}
		address := fmt.Sprintf("127.0.0.1:%d", ports[i])
		n := &process{name: fmt.Sprint("nats-", i+1),
			args: func() []string { return args },
			ready: func(line string) (string, bool) {
				return address, strings.Contains(line, "Server is ready")
			}}
		r.nats = append(r.nats, n)
	}
	// A cluster's nodes wait for each other: they start side by side.
	errs := make(chan error, nodes)
	for _, n := range r.nats {
		go func() { errs <- n.start(ctx) }()
	}
	for range nodes {
		if err := <-errs; err != nil {
			return fmt.Errorf("%w (is %s installed? go install "+
				"github.com/nats-io/nats-server/v2@v2.15.2)", err,
				r.cfg.NATSServer)
		}
	}
	return nil
}

// natsURLs lists the NATS servers for --nats.
func (r *chaosRun) natsURLs() string {
	var urls []string
	for _, n := range r.nats {
		urls = append(urls, "nats://"+n.addr())
	}
	return strings.Join(urls, ",")
}

// freePorts finds n ports free on 127.0.0.1 now, below Linux's
// ephemeral range (32768 and up). A port the kernel picked for a
// listener on port 0 goes back to that range once closed, where an
// outgoing connection may take it before a NATS node binds it, or
// before a node killed with -9 binds it again.
func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, errors.New("no free ports on 127.0.0.1 " +
				"between 20000 and 32000")
		}
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprint("127.0.0.1:", port))
		if err == nil {
			listeners = append(listeners, l)
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// tell prints the last words of every server, for a run that failed.
func (r *chaosRun) tell() {
	for _, p := range append(slices.Clone(r.nats), r.brokers...) {
		p.mu.Lock()
		for _, line := range p.said {
			fmt.Fprintf(r.out, "%s: %s\n", p.name, line)
		}
		p.mu.Unlock()
	}
}

// stopAll stops every process and proxy.
func (r *chaosRun) stopAll() {
	for _, p := range r.proxies {
		p.Close()
	}
	for _, b := range r.brokers {
		b.stop()
	}
	for _, n := range r.nats {
		n.stop()
	}
}

// workload runs the clients and the nemesis, drains, reads every log
// and checks the history.
func (r *chaosRun) workload(ctx context.Context) (chaos.Report, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var topics []string
	for i := range r.cfg.Topics {
		topics = append(topics, fmt.Sprint("topic-", i+1))
	}

	// Publishers spread over the topics and the brokers; on each topic a
	// durable subscriber with a wildcard beside it on the same
	// connection, a plain one, each on a broker of its own, and, on
	// bbolt, a work queue of two members (groups need the broker's own
	// log), one with a wildcard beside it, both narrowing their sessions
	// to fewer grants now and then while they hold a job.
	stop := make(chan struct{})
	var publishers, subscribers sync.WaitGroup
	for i := range r.cfg.Publishers {
		p := r.client(fmt.Sprint("p", i+1), i)
		if r.cfg.Rate > 0 {
			p.Pace = time.Duration(float64(time.Second) / r.cfg.Rate)
		}
		topic := topics[i%len(topics)]
		publishers.Go(func() { p.Publish(ctx, stop, topic, r.cfg.Window) })
	}
	var members sync.WaitGroup
	for i, topic := range topics {
		for j, durable := range []string{"d-" + topic, ""} {
			s := r.client(cmp.Or(durable, "s-"+topic), 2*i+j+1)
			if durable != "" {
				s.Overlap = topic + "/#"
			}
			subscribers.Go(func() {
				defer r.running(s.Name)()
				s.Subscribe(ctx, topic, durable, "end-"+topic)
			})
		}
		if r.cfg.Engine == "bbolt" {
			r.join(ctx, &members, topic)
		}
	}
	// A durable name begun for new messages only, two seconds in, and
	// left before anything came: resumed, it starts where it began. It
	// stays on one broker: brokers on a shared log do not hand a durable
	// name over between them (tutorial 7).
	begin := r.pinned("b-"+topics[0], 0)
	subscribers.Go(func() {
		defer r.running(begin.Name)()
		select {
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
			return
		}
		begin.Begin(ctx, topics[0], begin.Name, "end-"+topics[0])
	})
	// Bursts of delayed values past the bound on what waits, to a topic
	// of their own, each confirmed up to the bound and refused past it.
	// They stay on one broker: on a shared log the bound is each
	// broker's (docs/protocol.md).
	burst := r.pinned("burst", 0)
	publishers.Go(func() {
		burst.Burst(ctx, stop, burstTopic, chaosMaxDelayed*5/4,
			chaosMaxDelayed)
	})
	// A client whose topics come and go, as reply topics do: a topic, a
	// wildcard over it, a name nobody publishes to and names the nemesis
	// makes later. The brokers, and a shared log, forget each name and
	// filter as it goes, and make it again.
	churn := r.client("churn", 0)
	churn.Pace = 20 * time.Millisecond
	publishers.Go(func() {
		churn.Churn(ctx, stop, []string{topics[0], topics[0] + "/#",
			"reply-1", "fresh-1", "fresh-2"})
	})
	r.nemesis(ctx)
	if err := r.heal(ctx); err != nil {
		return chaos.Report{}, err
	}

	// The drain: publishers finish what they sent, a marker goes behind
	// everything, every subscriber reads up to it, then the logs are read.
	fmt.Fprintf(r.out, "%s  healed; draining\n", r.clock())
	drainCtx, cancelDrain := context.WithTimeout(ctx, r.cfg.Drain)
	defer cancelDrain()
	close(stop)
	if !waitGroup(drainCtx, &publishers) {
		return chaos.Report{}, fmt.Errorf("%w: publishers",
			chaos.ErrUnfinished)
	}
	drain := r.client("drain", 0)
	drain.Token = r.token("drain", true)
	all := append([]string{burstTopic}, append(topics, r.fresh...)...)
	for _, topic := range all {
		if err := drain.Mark(drainCtx, topic, "end-"+topic); err != nil {
			return chaos.Report{}, err
		}
	}
	if !waitGroup(drainCtx, &subscribers) || !waitGroup(drainCtx, &members) {
		return chaos.Report{}, fmt.Errorf("%w: %s", chaos.ErrUnfinished,
			r.stillRunning())
	}
	for _, topic := range all {
		if err := drain.ReadLog(drainCtx, topic, "end-"+topic); err != nil {
			return chaos.Report{}, err
		}
		if err := drain.ReadDeadLetters(drainCtx, topic); err != nil {
			return chaos.Report{}, err
		}
	}
	return chaos.Check(r.history), nil
}

// running notes that the client called name is under way, until the
// function it returns is called.
func (r *chaosRun) running(name string) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.clients == nil {
		r.clients = map[string]bool{}
	}
	r.clients[name] = true
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.clients, name)
	}
}

// stillRunning names the clients under way, for a drain that timed out.
func (r *chaosRun) stillRunning() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return "still reading: " + strings.Join(slices.Sorted(maps.Keys(
		r.clients)), ", ")
}

// join starts topic's work queue: two members, on brokers of their own,
// one with a wildcard beside it; the member that gets the marker ends
// the group a few seconds later, so that jobs moved from a member cut
// off at the end still come.
func (r *chaosRun) join(ctx context.Context, members *sync.WaitGroup,
	topic string) {
	group, end := context.WithCancel(ctx)
	finished := sync.OnceFunc(func() { time.AfterFunc(5*time.Second, end) })
	for i := range 2 {
		m := r.client(fmt.Sprintf("g%d-%s", i+1, topic), i)
		if i == 0 {
			m.Overlap = topic + "/#"
		}
		m.Narrow = r.narrow(m.Name)
		members.Go(func() {
			defer r.running(m.Name)()
			m.Join(group, topic, "workers", "end-"+topic, finished)
		})
	}
}

// narrow signs a day's token for name that may read nothing the
// workload uses.
func (r *chaosRun) narrow(name string) string {
	claims := popsub.Claims{Subscribe: []string{"nothing"}}
	claims.Subject = name
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(24 * time.Hour))
	token, _ := claims.Sign([]byte(chaosSecret))
	return token
}

// waitGroup waits for wg, or for ctx; it reports whether wg finished.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// client is a workload client that starts on the proxy of broker first
// (modulo their number) and moves to the next one at each dial.
func (r *chaosRun) client(name string, first int) *chaos.Client {
	next := first
	var mu sync.Mutex
	dial := func(ctx context.Context) (*websocket.Conn, error) {
		mu.Lock()
		p := r.proxies[next%len(r.proxies)]
		next++
		mu.Unlock()
		ws, _, err := websocket.Dial(ctx, "ws://"+p.Addr()+"/ws", nil)
		return ws, err
	}
	return &chaos.Client{Name: name, Dial: dial, History: r.history,
		Token: r.token(name, false)}
}

// pinned is a client that always dials broker i's proxy.
func (r *chaosRun) pinned(name string, i int) *chaos.Client {
	c := r.client(name, i)
	c.Dial = func(ctx context.Context) (*websocket.Conn, error) {
		ws, _, err := websocket.Dial(ctx, "ws://"+r.proxies[i].Addr()+"/ws",
			nil)
		return ws, err
	}
	return c
}

// token signs a day's token for name; an operator's may mark and read
// dead letters too.
func (r *chaosRun) token(name string, operator bool) string {
	claims := popsub.Claims{}
	if operator {
		claims.Publish = []string{"#", "$dead/#"}
		claims.Subscribe = []string{"#", "$dead/#"}
	}
	claims.Subject = name
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(24 * time.Hour))
	token, _ := claims.Sign([]byte(chaosSecret))
	return token
}

// clock is the time since the run started, for its log lines.
func (r *chaosRun) clock() string {
	return fmt.Sprintf("%7.1fs", time.Since(r.started).Seconds())
}

// nemesis injects one fault at a time, at random intervals around
// --every, until --duration has passed. Each heals itself before the
// next begins, but for a paused broker or a stalled proxy, which the
// next fault may find still paused or stalled; heal undoes those.
func (r *chaosRun) nemesis(ctx context.Context) {
	faults := []func(context.Context){r.kill, r.killOnNewTopic,
		r.killTwice, r.restartClean, r.pause, r.cut, r.stall}
	if r.cfg.Engine == "nats" {
		faults = append(faults, r.killNATS, r.afterNATSRestart)
	}
	if r.cfg.Engine == "nats" && r.cfg.NATSEvery > 0 {
		done := make(chan struct{})
		defer func() { <-done }()
		go r.killNATSEvery(ctx, done)
	}
	for start := time.Now(); time.Since(start) < r.cfg.Duration; {
		wait := r.cfg.Every/2 + time.Duration(r.rand.Int64N(
			int64(r.cfg.Every)))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		faults[r.rand.IntN(len(faults))](ctx)
	}
}

// note prints a fault and records it; the function it returns records
// it healed.
func (r *chaosRun) note(kind, target, how string) func() {
	fmt.Fprintf(r.out, "%s  %-16s %-9s %s\n", r.clock(), kind, target, how)
	return r.history.Fault(kind, target)
}

// anyBroker picks a broker.
func (r *chaosRun) anyBroker() (int, *process) {
	i := r.rand.IntN(len(r.brokers))
	return i, r.brokers[i]
}

// kill kills a broker with SIGKILL and starts it again soon after.
func (r *chaosRun) kill(ctx context.Context) {
	_, b := r.anyBroker()
	r.restart(ctx, b, "kill", "kill -9")
}

// restart kills b and starts it again on the same files.
func (r *chaosRun) restart(ctx context.Context, b *process, kind,
	how string) {
	healed := r.note(kind, b.name, how)
	b.kill()
	time.Sleep(time.Duration(r.rand.Int64N(int64(500 * time.Millisecond))))
	r.startAgain(ctx, b, healed)
}

// restartClean stops a broker gracefully (SIGINT, which it takes as
// SIGTERM), as a deploy does, and starts it again on the same files.
func (r *chaosRun) restartClean(ctx context.Context) {
	_, b := r.anyBroker()
	healed := r.note("restart", b.name, "SIGINT, then start")
	b.stop()
	r.startAgain(ctx, b, healed)
}

// startAgain starts b, stopped, and notes the fault healed once it is up.
func (r *chaosRun) startAgain(ctx context.Context, b *process,
	healed func()) {
	if err := b.startRetrying(ctx); err != nil {
		fmt.Fprintf(r.out, "%s  %s did not restart: %v\n", r.clock(),
			b.name, err)
		return
	}
	healed()
}

// killOnNewTopic publishes to a brand-new topic and kills the broker the
// moment it delivers the message, before its first commit.
func (r *chaosRun) killOnNewTopic(ctx context.Context) {
	i, _ := r.anyBroker()
	r.killOnNewTopicOf(ctx, i)
}

// killOnNewTopicOf is killOnNewTopic on broker i.
func (r *chaosRun) killOnNewTopicOf(ctx context.Context, i int) {
	b := r.brokers[i]
	topic := fmt.Sprint("fresh-", len(r.fresh)+1)
	r.fresh = append(r.fresh, topic)
	watcher := r.pinned("watch-"+topic, i)
	wait, cancel := context.WithTimeout(ctx, chaos.AnswerBound)
	defer cancel()
	err := watcher.OnFirstDelivery(wait, topic, "first-"+topic, b.kill)
	if err != nil {
		r.stalled(ctx, fmt.Sprintf("%s delivered nothing on %s, a new "+
			"topic, within %v of its publish", b.name, topic,
			chaos.AnswerBound))
		return
	}
	r.restart(ctx, b, "kill-new-topic", "kill -9 on "+topic+"'s first "+
		"delivery")
}

// killTwice kills a broker, and kills it again on the first delivery
// after its restart, before that topic's next commit.
func (r *chaosRun) killTwice(ctx context.Context) {
	i, b := r.anyBroker()
	r.restart(ctx, b, "kill-twice", "kill -9, and again on the first "+
		"delivery after")
	watcher := r.pinned(fmt.Sprint("watch-", r.rand.Uint64()), i)
	wait, cancel := context.WithTimeout(ctx, chaos.AnswerBound)
	defer cancel()
	if watcher.OnFirstDelivery(wait, "topic-1", "", b.kill) != nil {
		r.stalled(ctx, fmt.Sprintf("%s delivered nothing on topic-1 "+
			"within %v of its restart", b.name, chaos.AnswerBound))
	} else {
		r.restart(ctx, b, "kill-again", "killed again, on the first "+
			"delivery since")
	}
}

// stalled records, and prints, a probe that waited in vain while nothing
// failed: a liveness violation, unless the run itself was ending.
func (r *chaosRun) stalled(ctx context.Context, what string) {
	if ctx.Err() != nil {
		return
	}
	fmt.Fprintf(r.out, "%s  STALLED: %s\n", r.clock(), what)
	r.history.Stalled(what)
}

// pause stops a broker with SIGSTOP for up to eight seconds.
func (r *chaosRun) pause(ctx context.Context) {
	_, b := r.anyBroker()
	d := time.Duration(r.rand.Int64N(int64(8 * time.Second)))
	healed := r.note("pause", b.name, fmt.Sprintf("SIGSTOP for %.1fs",
		d.Seconds()))
	b.signal(syscall.SIGSTOP)
	sleep(ctx, d)
	b.signal(syscall.SIGCONT)
	healed()
}

// cut drops every connection at a broker's proxy.
func (r *chaosRun) cut(context.Context) {
	i, b := r.anyBroker()
	healed := r.note("cut", b.name, "every connection dropped at its proxy")
	r.proxies[i].Cut()
	healed()
}

// stall stops a proxy carrying bytes either way for up to fifteen
// seconds: past the write timeout (10 s), the broker cuts its readers
// off.
func (r *chaosRun) stall(ctx context.Context) {
	i, b := r.anyBroker()
	d := time.Duration(r.rand.Int64N(int64(15 * time.Second)))
	healed := r.note("stall", b.name, fmt.Sprintf("its proxy carries "+
		"nothing for %.1fs", d.Seconds()))
	r.proxies[i].Hold()
	sleep(ctx, d)
	r.proxies[i].Resume()
	healed()
}

// killNATS kills a NATS server (one node of a cluster) and starts it
// again after up to five seconds, on its files and its port.
func (r *chaosRun) killNATS(ctx context.Context) {
	r.killNATSWith(ctx, r.rand)
}

// killNATSWith is killNATS drawing from random.
func (r *chaosRun) killNATSWith(ctx context.Context, random *rand.Rand) {
	r.natsKills.Lock()
	defer r.natsKills.Unlock()
	n := r.nats[random.IntN(len(r.nats))]
	d := time.Duration(random.Int64N(int64(5 * time.Second)))
	healed := r.note("kill-nats", n.name, fmt.Sprintf("kill -9, back after "+
		"%.1fs", d.Seconds()))
	n.kill()
	sleep(ctx, d)
	if err := n.startRetrying(ctx); err != nil {
		fmt.Fprintf(r.out, "%s  %s did not restart: %v\n", r.clock(),
			n.name, err)
		return
	}
	healed()
}

// killNATSEvery kills the NATS server every --nats-every to twice that,
// until --duration has passed, beside the other faults; it closes done.
// Its own random source, seeded from the run's, keeps the other faults'
// draws what the seed says.
func (r *chaosRun) killNATSEvery(ctx context.Context, done chan struct{}) {
	defer close(done)
	random := rand.New(rand.NewPCG(r.cfg.Seed, 1))
	for start := time.Now(); time.Since(start) < r.cfg.Duration; {
		wait := r.cfg.NATSEvery + time.Duration(random.Int64N(
			int64(r.cfg.NATSEvery)))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		r.killNATSWith(ctx, random)
	}
}

// afterNATSRestart is the schedule that once left a publish with no
// answer at all: the NATS server killed and back, then a broker killed
// and back, then a publish to a new topic on that broker, killed on its
// first delivery. killOnNewTopicOf holds the publish to AnswerBound.
func (r *chaosRun) afterNATSRestart(ctx context.Context) {
	r.killNATS(ctx)
	i, b := r.anyBroker()
	r.restart(ctx, b, "kill", "kill -9, NATS restarted since its start")
	r.killOnNewTopicOf(ctx, i)
}

// heal makes sure every server runs and no proxy stalls.
func (r *chaosRun) heal(ctx context.Context) error {
	for _, p := range r.proxies {
		p.Resume()
	}
	for _, b := range r.brokers {
		b.signal(syscall.SIGCONT)
	}
	return ctx.Err()
}

// sleep waits for d or for ctx.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}
