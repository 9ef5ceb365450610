package popsub

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/chaos"
)

// This file is the simulation. A broker runs in fake time on a disk that
// loses whatever it had not committed (crash_test.go's disk), its
// clients on pipes; a seeded nemesis kills it (also on a new topic's
// first delivery, and twice before a commit), stops and starts it as
// SIGTERM would, cuts every connection or a random half of them (one
// work-queue member dies, the other stays), and stalls them all, some
// for longer than the write timeout. The workload mixes delayed,
// expiring and nakked values; durable, plain and group subscribers,
// one durable subscriber and one member with a wildcard beside their
// topic on the same connection, members whose sessions are narrowed to
// fewer grants while they hold a job, and a durable name begun for new
// messages only and resumed before its first delivery. A second world
// keeps its logs for two seconds only, so that the broker forgets its
// topics between two values and makes them again, through the same
// faults. The clients and the checker are package chaos's, which `popsub
// chaos` runs against real processes: a schedule that breaks a promise
// here breaks the same invariant there. Each schedule is one seed:
//
//	go test -run Simulation -sim.seed=42 -v .
//
// reruns the schedule of seed 42 (the same faults at the same fake
// times; goroutines still interleave as they will).

var (
	simSchedules = flag.Int("sim.schedules", 20,
		"how many seeded schedules the simulation runs")
	simSeed = flag.Uint64("sim.seed", 0,
		"run only the simulation's schedule of this seed")
)

func TestSimulation_PromisesHoldUnderFaults(t *testing.T) {
	// The release loop reads the disk's DueIndex a second ahead, four
	// records at a time: a marker, due 11.5 s on, waits on disk alone,
	// and is found by a read across crashes and restarts.
	lookingAhead(t, time.Second, 4)
	// The bursts past the bound must have been refused somewhere, or the
	// check of the bound judged nothing.
	pastBound := 0
	defer func() {
		if !t.Failed() && pastBound == 0 {
			t.Error("no delayed burst was refused past its bound")
		}
	}()
	eachSchedule(t, func(t *testing.T, seed uint64) {
		report, err := simulate(t, seed)
		pastBound += report.Refused["delayed_limit"]
		judge(t, seed, report, err)
	})
}

// eachSchedule runs schedule in fake time, a subtest for each seed.
func eachSchedule(t *testing.T, schedule func(t *testing.T, seed uint64)) {
	for _, seed := range simSeeds() {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { schedule(t, seed) })
		})
	}
}

// simSeeds are the seeds of the schedules to run: -sim.seed's alone, or
// the first -sim.schedules.
func simSeeds() []uint64 {
	if *simSeed != 0 {
		return []uint64{*simSeed}
	}
	var seeds []uint64
	for seed := range uint64(*simSchedules) {
		seeds = append(seeds, seed+1)
	}
	return seeds
}

// judge fails t if the schedule of seed broke a promise, saying how to
// rerun it; a schedule run alone logs its report.
func judge(t *testing.T, seed uint64, report chaos.Report, err error) {
	t.Helper()
	if *simSeed != 0 {
		t.Logf("seed %d:\n%s", seed, report)
	}
	if err != nil || !report.OK() {
		t.Fatalf("seed %d (rerun: go test -run Simulation -sim.seed=%d "+
			"-v .): %v\n%s", seed, seed, err, report)
	}
}

// A topic forgotten and made again goes through the same faults: every
// value expires, and the TTL, shorter than a publisher's pace, empties
// its topic's log between two values, so the broker forgets the topic
// and makes it again, its seqs past the floor (Retention); a client
// subscribes and unsubscribes in turn, so that a pin holds some forgets
// off, and the nemesis kills the broker on a remade topic's first
// delivery. The broker holds fewer topics than there are (MaxTopics):
// a publish or subscribe to a topic it does not hold waits for a forget
// to make room, and the cap's count goes through the same forgets,
// crashes and restarts. No seq may name two values, across forgets and
// crashes.
func TestSimulation_ForgottenTopicsGiveNoSeqTwice(t *testing.T) {
	var floors uint64
	var capped int
	defer func() {
		if !t.Failed() && floors == 0 {
			t.Error("no schedule forgot a topic that had a message")
		}
		if !t.Failed() && capped == 0 {
			t.Error("no schedule met the cap on topics")
		}
	}()
	eachSchedule(t, func(t *testing.T, seed uint64) {
		report, floor, err := simulateForgetting(t, seed)
		floors += floor
		capped += report.Refused["topic_limit"]
		judge(t, seed, report, err)
	})
}

// simulateForgetting runs a schedule of the nemesis on a broker whose
// TTL forgets its topics, and returns its history's report and the
// floor the disk kept.
func simulateForgetting(t *testing.T, seed uint64) (chaos.Report, uint64,
	error) {
	opts := simOptions
	opts.TTL = 2 * time.Second // the values' delay fits within it
	brief := []string{"brief/1", "brief/2", "brief/3", "brief/4"}
	// Room for three of the four, and for nothing else the broker makes.
	opts.MaxTopics = len(brief) - 1
	w := &world{t: t, history: &chaos.History{}, disk: newDisk(),
		conns: map[*simConn]struct{}{}, opts: opts, brief: brief}
	w.server = w.startBroker(w.disk)
	defer func() { w.current().stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()

	stop := make(chan struct{})
	var clients sync.WaitGroup
	// Paces just past the TTL and its trim's tick, a tenth of it, send
	// the next value as the last one's topic is forgotten.
	paces := []time.Duration{2100, 2200, 2600, 3000}
	for i, topic := range brief {
		p := w.client(fmt.Sprint("p", i+1))
		p.Pace, p.Fleeting = paces[i]*time.Millisecond, true
		clients.Go(func() { p.Publish(ctx, stop, topic, 1) })
	}
	churn := w.client("churn")
	churn.Pace = 700 * time.Millisecond
	clients.Go(func() { churn.Churn(ctx, stop, brief) })
	w.nemesis(ctx, rand.New(rand.NewPCG(seed, 1)))
	close(stop)
	clients.Wait()
	if ctx.Err() != nil {
		return chaos.Report{}, 0, chaos.ErrUnfinished
	}
	floor, err := w.disk.Floor()
	return chaos.Check(w.history), floor, err
}

// simRun is how long, in fake time, the nemesis works on one schedule.
const simRun = 20 * time.Second

// simOptions are the simulated broker's: retries within the run, and a
// log that keeps every message, so that the final log is the whole run.
var simOptions = Options{AckTimeout: time.Second, MaxMessages: 1 << 20,
	TTL: 24 * time.Hour, FeatureOptions: FeatureOptions{
		MaxDelayed: simMaxDelayed}}

// simMaxDelayed bounds the delayed messages waiting for each topic and
// each token: about three times what a topic's publishers have waiting,
// and less than a burst (simBurst).
const simMaxDelayed = 64

// simBurst is how many delayed values one burst sends at once.
const simBurst = 80

// world is one schedule's broker, disk and network.
type world struct {
	t       *testing.T
	history *chaos.History
	// opts are the brokers' options; brief, if set, are the topics the
	// TTL forgets, which the nemesis watches instead of making new ones.
	opts  Options
	brief []string

	// mu guards the fields below.
	mu sync.Mutex
	// server is the broker running now, on disk.
	server *pipeServer
	disk   *disk
	// conns are the server ends of the broker's pipes, for cut.
	conns map[*simConn]struct{}
	// stall, while not nil, holds every write to a client until closed.
	stall chan struct{}
}

// simulate runs the schedule of seed and checks its history.
func simulate(t *testing.T, seed uint64) (chaos.Report, error) {
	w := &world{t: t, history: &chaos.History{}, disk: newDisk(),
		conns: map[*simConn]struct{}{}, opts: simOptions}

	w.server = w.startBroker(w.disk)
	defer func() { w.current().stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()

	// The workload: two topics, three publishers, and on each topic a
	// durable subscriber (with a wildcard beside), a plain one, and a
	// work queue of two members (one with a wildcard beside), whose
	// sessions are narrowed now and then; a client that subscribes and
	// unsubscribes in turn to jobs and to the new topics the nemesis
	// will make, so that the broker forgets them and makes them again
	// beside their first publishes; and bursts of delayed values past
	// the bound on what waits, to a third topic.
	topics := []string{"jobs", "chat"}
	stop := make(chan struct{})
	var publishers, subscribers sync.WaitGroup
	for i, topic := range []string{"jobs", "chat", "jobs"} {
		p := w.client(fmt.Sprint("p", i+1))
		p.Pace = pace
		publishers.Go(func() { p.Publish(ctx, stop, topic, 8) })
	}
	churn := w.client("churn")
	churn.Pace = 5 * pace
	publishers.Go(func() {
		churn.Churn(ctx, stop, []string{"jobs", "fresh-1", "fresh-2",
			"fresh-3", "fresh-4", "fresh-5"})
	})
	for _, topic := range topics {
		for _, durable := range []string{"d-" + topic, ""} {
			s := w.client(cmp.Or(durable, "s-"+topic))
			if durable != "" {
				s.Overlap = topic + "/#"
			}
			subscribers.Go(func() {
				s.Subscribe(ctx, topic, durable, "end-"+topic)
			})
		}
		// The member that gets the marker ends the group a few seconds
		// of fake time later: jobs moved from a member cut off at the end
		// still come.
		group, end := context.WithCancel(ctx)
		finished := sync.OnceFunc(func() { time.AfterFunc(5*time.Second, end) })
		for i := range 2 {
			m := w.client(fmt.Sprintf("g%d-%s", i+1, topic))
			if i == 0 {
				m.Overlap = topic + "/#"
			}
			m.Narrow = signed(w.t, m.Name, Claims{
				Subscribe: []string{"other"}})
			subscribers.Go(func() {
				m.Join(group, topic, "workers", "end-"+topic, finished)
			})
		}
	}

	// Bursts of delayed values past the bound, on a topic of their own:
	// each is confirmed up to the bound, and refused past it.
	burst := w.client("burst")
	publishers.Go(func() {
		burst.Burst(ctx, stop, "later", simBurst, simMaxDelayed)
	})

	// A durable name begun with new messages only, a second in, and left
	// before anything came: resumed, it starts where it began.
	begin := w.client("b-chat")
	subscribers.Go(func() {
		time.Sleep(time.Second)
		begin.Begin(ctx, "chat", "b-chat", "end-chat")
	})

	// The nemesis, then the drain: publishers finish what they sent, a
	// marker goes behind everything, and every subscriber reads up to
	// it before the logs are read.
	fresh := w.nemesis(ctx, rand.New(rand.NewPCG(seed, 0)))
	close(stop)
	publishers.Wait()
	drain := w.client("drain")
	drain.Token = w.operatorToken()
	read := append([]string{"later"}, append(topics, fresh...)...)
	for _, topic := range read {
		if err := drain.Mark(ctx, topic, "end-"+topic); err != nil {
			return chaos.Report{}, err
		}
	}
	subscribers.Wait()
	for _, topic := range read {
		if err := drain.ReadLog(ctx, topic, "end-"+topic); err != nil {
			return chaos.Report{}, err
		}
		if err := drain.ReadDeadLetters(ctx, topic); err != nil {
			return chaos.Report{}, err
		}
	}
	if ctx.Err() != nil {
		return chaos.Report{}, chaos.ErrUnfinished
	}
	return chaos.Check(w.history), nil
}

// pace is how long a simulated publisher waits between new values, in
// fake time: a rate, since fake time passes for nothing else.
const pace = 20 * time.Millisecond

// nemesis injects a fault every 0.2 to 2 s of fake time for simRun, and
// returns the new topics it made.
func (w *world) nemesis(ctx context.Context, r *rand.Rand) []string {
	var fresh []string
	for start := time.Now(); time.Since(start) < simRun; {
		time.Sleep(200*time.Millisecond +
			time.Duration(r.Int64N(int64(1800*time.Millisecond))))
		switch r.IntN(8) {
		case 0:
			w.crash()
		case 7:
			w.restart()
		case 1:
			// A new topic, killed on its first delivery; in a world whose
			// topics the TTL forgets, one made again.
			if len(w.brief) > 0 {
				w.client(fmt.Sprint("watch-", r.Uint64())).OnFirstDelivery(
					ctx, w.brief[r.IntN(len(w.brief))], "", w.crash)
				continue
			}
			topic := fmt.Sprint("fresh-", len(fresh)+1)
			fresh = append(fresh, topic)
			w.client("watch-"+topic).OnFirstDelivery(ctx, topic,
				"first-"+topic, w.crash)
		case 2:
			// Killed, and killed again on the first delivery after.
			w.crash()
			topic := "jobs"
			if len(w.brief) > 0 {
				topic = w.brief[r.IntN(len(w.brief))]
			}
			w.client(fmt.Sprint("watch-", r.Uint64())).OnFirstDelivery(ctx,
				topic, "", w.crash)
		case 3:
			w.cut()
		case 6:
			// Some connections, not all: one member of a work queue
			// dies while the other stays, and its jobs must move.
			w.cutSome(r)
		case 4, 5:
			// Half the stalls outlast the write timeout (10 s): their
			// subscribers are cut off with 4008.
			w.stallFor(time.Duration(r.Int64N(int64(20 * time.Second))))
		}
	}
	return fresh
}

// startBroker starts a broker on d, its pipes tracked for the nemesis.
func (w *world) startBroker(d *disk) *pipeServer {
	opts := w.opts
	opts.Store = d
	return startPipeBrokerWrapped(w.t, opts, w.track)
}

// client is a workload client of this world.
func (w *world) client(name string) *chaos.Client {
	return &chaos.Client{Name: name, Dial: w.dial, History: w.history,
		Token: tokenUntil(w.t, name, time.Now().Add(24*time.Hour))}
}

// operatorToken may read and mark dead letters too.
func (w *world) operatorToken() string {
	claims := Claims{Publish: []string{"#", "$dead/#"},
		Subscribe: []string{"#", "$dead/#"}}
	claims.Subject, claims.ExpiresAt = "drain", jwtTime(time.Now().Add(
		24*time.Hour))
	token, err := claims.Sign(testSecret)
	if err != nil {
		w.t.Fatal(err)
	}
	return token
}

// current is the broker running now.
func (w *world) current() *pipeServer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.server
}

// dial opens a WebSocket to the broker running now.
func (w *world) dial(ctx context.Context) (*websocket.Conn, error) {
	ws, _, err := websocket.Dial(ctx, "ws://pipe/ws",
		&websocket.DialOptions{HTTPClient: w.current().client})
	return ws, err
}

// crash kills the broker as kill -9 would, and starts the next one on
// what the disk kept.
func (w *world) crash() {
	healed := w.history.Fault("kill", "broker")
	w.mu.Lock()
	old, kept := w.server, w.disk.crash()
	conns := w.conns
	w.conns = map[*simConn]struct{}{}
	w.mu.Unlock()

	// The sockets go first: a broker killed says nothing to anyone.
	for c := range conns {
		c.Close()
	}
	old.stop()
	next := w.startBroker(kept)
	w.mu.Lock()
	w.server, w.disk = next, kept
	w.mu.Unlock()
	healed()
}

// restart stops the broker as SIGTERM would (Shutdown: its clients are
// told 1001, and everything queued is committed), and starts the next
// one on the same disk.
func (w *world) restart() {
	healed := w.history.Fault("restart", "broker")
	w.mu.Lock()
	old, d := w.server, w.disk
	w.mu.Unlock()
	old.stop()
	kept := &disk{memoryStore: d.memoryStore.Copy(), delay: d.delay}
	next := w.startBroker(kept)
	w.mu.Lock()
	w.server, w.disk = next, kept
	w.mu.Unlock()
	healed()
}

// cut closes every connection, as a proxy dropping them all would.
func (w *world) cut() {
	healed := w.history.Fault("cut", "every connection")
	w.mu.Lock()
	conns := w.conns
	w.conns = map[*simConn]struct{}{}
	w.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	healed()
}

// cutSome closes each connection with a chance of one in two.
func (w *world) cutSome(r *rand.Rand) {
	healed := w.history.Fault("cut", "some connections")
	w.mu.Lock()
	var some []*simConn
	for c := range w.conns {
		if r.IntN(2) == 0 {
			some = append(some, c)
			delete(w.conns, c)
		}
	}
	w.mu.Unlock()
	for _, c := range some {
		c.Close()
	}
	healed()
}

// stallFor holds every write to a client for d, as a network that stops
// carrying packets would: the broker's writes wait, and time out.
func (w *world) stallFor(d time.Duration) {
	healed := w.history.Fault("stall", "every connection")
	gate := make(chan struct{})
	w.mu.Lock()
	w.stall = gate
	w.mu.Unlock()
	time.Sleep(d)
	w.mu.Lock()
	w.stall = nil
	w.mu.Unlock()
	close(gate)
	healed()
}

// track wraps a pipe's server end so that the nemesis can cut and stall
// it.
func (w *world) track(conn net.Conn) net.Conn {
	c := &simConn{Conn: conn, world: w, closed: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conns[c] = struct{}{}
	return c
}

// simConn is a broker's end of a simulated connection.
type simConn struct {
	net.Conn
	world *world
	// closed is closed by Close, once.
	closed chan struct{}
	once   sync.Once
	// mu guards deadline, the write deadline the broker set.
	mu       sync.Mutex
	deadline time.Time
}

// Write waits while the world stalls, until its deadline, then writes.
func (c *simConn) Write(p []byte) (int, error) {
	c.world.mu.Lock()
	gate := c.world.stall
	c.world.mu.Unlock()
	if gate != nil {
		c.mu.Lock()
		deadline := c.deadline
		c.mu.Unlock()
		var expired <-chan time.Time
		if !deadline.IsZero() {
			expired = time.After(time.Until(deadline))
		}
		select {
		case <-gate:
		case <-c.closed:
			return 0, net.ErrClosed
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
	return c.Conn.Write(p)
}

// SetWriteDeadline keeps the deadline for Write, and sets it on the pipe.
func (c *simConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline is SetWriteDeadline, and the read deadline too.
func (c *simConn) SetDeadline(t time.Time) error {
	c.SetWriteDeadline(t)
	return c.Conn.SetDeadline(t)
}

// Close closes the pipe, and wakes a stalled Write.
func (c *simConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
