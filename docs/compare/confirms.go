package main

// confirms measures durable confirms: how many publishes a second each
// server confirms, and how long a confirm takes, with 1, 16 and 256
// publishers at once, each keeping up to a window of unconfirmed
// publishes in flight. PopSub confirms a QoS 1 publish once its batch is
// synced; NATS JetStream with sync_interval: always makes the same
// promise, and its default (a sync every two minutes) a weaker one, which
// is measured beside it and labelled so.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// confirmer is one server's publishers, as the confirms measure sees
// them.
type confirmer interface {
	// run starts publishers, each with window publishes in flight, until
	// stop is closed, and records each confirm's latency.
	run(publishers, window int, stop <-chan struct{},
		record func(time.Duration)) error
}

// runConfirms is the confirms command.
func runConfirms(args []string) error {
	fs := flag.NewFlagSet("compare confirms", flag.ContinueOnError)
	f := addFlags(fs)
	counts := fs.String("publishers", "1,16,256", "publisher counts")
	window := fs.Int("window", 16, "unconfirmed publishes each publisher "+
		"may have in flight")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	servers := []struct {
		name  string
		start func(addr, dir string) (*exec.Cmd, confirmer, error)
	}{
		{"PopSub, QoS 1 (confirmed after its sync)", func(addr, dir string) (
			*exec.Cmd, confirmer, error) {
			cmd, token, err := popsubServe(*f.popsub, addr, dir,
				"--max-messages", "100000")
			return cmd, &popsubConfirmer{url: "ws://" + addr + "/ws",
				token: token}, err
		}},
		{"NATS JetStream, sync_interval: always (the same promise)",
			func(addr, dir string) (*exec.Cmd, confirmer, error) {
				return exec.Command(self, "nats-server", addr, dir, "always"),
					&natsConfirmer{url: "nats://" + addr}, nil
			}},
		{"NATS JetStream, default sync (a weaker promise)",
			func(addr, dir string) (*exec.Cmd, confirmer, error) {
				return exec.Command(self, "nats-server", addr, dir),
					&natsConfirmer{url: "nats://" + addr}, nil
			}},
	}
	fmt.Println("| server | publishers | window | confirmed/s | p50 | p99 " +
		"| server CPU per confirm |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, s := range servers {
		if !strings.Contains(s.name, *f.only) {
			continue
		}
		for _, field := range strings.Split(*counts, ",") {
			n, err := strconv.Atoi(field)
			if err != nil {
				return err
			}
			row, err := measureConfirms(s.start, n, *window, *f.duration)
			if err != nil {
				return fmt.Errorf("%s, %d publishers: %w", s.name, n, err)
			}
			fmt.Printf("| %s | %d | %d | %s |\n", s.name, n, *window, row)
		}
	}
	return nil
}

// measureConfirms starts a server (startServer), runs n publishers for
// duration, and returns the table row's last four cells.
func measureConfirms(start func(addr, dir string) (*exec.Cmd, confirmer,
	error), n, window int, duration time.Duration) (string, error) {
	var c confirmer
	pid, stopServer, err := startServer(func(addr, dir string) (*exec.Cmd,
		error) {
		cmd, started, err := start(addr, dir)
		c = started
		return cmd, err
	})
	if err != nil {
		return "", err
	}
	defer stopServer()

	// Room for a million confirms is made up front: growing the slice
	// would copy it while confirms wait to be timed.
	var mu sync.Mutex
	all := make([]time.Duration, 0, 1<<20)
	record := func(d time.Duration) {
		mu.Lock()
		all = append(all, d)
		mu.Unlock()
	}
	stop := make(chan struct{})
	before, began := cpuTime(pid), time.Now()
	time.AfterFunc(duration, func() { close(stop) })
	if err := c.run(n, window, stop, record); err != nil {
		return "", err
	}
	elapsed, cpu := time.Since(began), cpuTime(pid)-before
	mu.Lock()
	defer mu.Unlock()
	if len(all) == 0 {
		return "", fmt.Errorf("nothing confirmed")
	}
	slices.Sort(all)
	l := latencies{sorted: all}
	return fmt.Sprintf("%.0f | %s | %s | %.1f µs",
			float64(len(all))/elapsed.Seconds(), ms(l.at(0.50)),
			ms(l.at(0.99)), float64(cpu.Microseconds())/float64(len(all))),
		nil
}

// popsubConfirmer publishes at QoS 1 over raw WebSockets, one publish a
// frame, each publisher on a connection of its own.
type popsubConfirmer struct{ url, token string }

func (p *popsubConfirmer) run(publishers, window int,
	stop <-chan struct{}, record func(time.Duration)) error {
	target := &popsubTarget{url: p.url, token: p.token}
	defer target.close()
	loops := make([]func() error, publishers)
	for i := range publishers {
		ws, err := target.dial(false)
		if err != nil {
			return err
		}
		loops[i] = func() error {
			return confirmLoop(ws, i, window, stop, record)
		}
	}
	return together(loops)
}

// together runs every loop on a goroutine of its own, waits for all of
// them, and returns the first error any returned.
func together(loops []func() error) error {
	errs := make([]error, len(loops))
	var wg sync.WaitGroup
	for i, loop := range loops {
		wg.Go(func() { errs[i] = loop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// confirmLoop keeps window publishes in flight on ws until stop, then
// waits for the last confirms.
func confirmLoop(ws *websocket.Conn, publisher, window int,
	stop <-chan struct{}, record func(time.Duration)) error {
	ctx := context.Background()
	sentAt := sync.Map{}
	room := make(chan struct{}, window)
	var inFlight atomic.Int64
	readDone := make(chan error, 1)
	go func() {
		var buf bytes.Buffer
		for {
			data, err := readInto(ctx, ws, &buf)
			if err != nil {
				readDone <- err
				return
			}
			for _, line := range bytes.Split(data, []byte("\n")) {
				_, id, ok := between(line, `"message_id":"`, `"`)
				if !ok || !bytes.Contains(line, []byte(`"published"`)) {
					continue
				}
				if at, ok := sentAt.LoadAndDelete(string(id)); ok {
					record(time.Since(at.(time.Time)))
					inFlight.Add(-1)
					<-room
				}
			}
		}
	}()
	payload := `{"x":"` + strings.Repeat("x", 56) + `"}`
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			for end := time.Now(); inFlight.Load() > 0 &&
				time.Since(end) < 10*time.Second; {
				time.Sleep(time.Millisecond)
			}
			return nil
		case room <- struct{}{}:
		case err := <-readDone:
			return err
		}
		id := fmt.Sprintf("p%d-%d", publisher, seq)
		frame := fmt.Sprintf(`{"type":"publish","topic":"bench",`+
			`"qos":1,"message_id":%q,"payload":%s}`, id, payload)
		sentAt.Store(id, time.Now())
		inFlight.Add(1)
		if err := ws.Write(ctx, websocket.MessageText,
			[]byte(frame)); err != nil {
			return err
		}
	}
}

// between returns what lies in line between open and the next close.
func between(line []byte, open, close string) ([]byte, []byte, bool) {
	_, rest, ok := bytes.Cut(line, []byte(open))
	if !ok {
		return nil, nil, false
	}
	value, _, ok := bytes.Cut(rest, []byte(close))
	return rest, value, ok
}

// natsConfirmer publishes into a JetStream file stream with nats.go's
// PublishAsync, each publisher on a connection of its own, up to window
// unacknowledged.
type natsConfirmer struct{ url string }

func (t *natsConfirmer) run(publishers, window int, stop <-chan struct{},
	record func(time.Duration)) error {
	loops := make([]func() error, publishers)
	for i := range publishers {
		nc, err := nats.Connect(t.url)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc,
			jetstream.WithPublishAsyncMaxPending(window))
		if err != nil {
			return err
		}
		_, err = js.CreateOrUpdateStream(context.Background(),
			jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench"},
				Storage: jetstream.FileStorage, MaxMsgs: 100_000})
		if err != nil {
			return err
		}
		loops[i] = func() error { return natsLoop(js, window, stop, record) }
	}
	return together(loops)
}

// natsLoop keeps window publishes in flight until stop.
func natsLoop(js jetstream.JetStream, window int, stop <-chan struct{},
	record func(time.Duration)) error {
	payload := []byte(`{"x":"` + strings.Repeat("x", 56) + `"}`)
	room := make(chan struct{}, window)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-stop:
			return nil
		case room <- struct{}{}:
		}
		at := time.Now()
		future, err := js.PublishAsync("bench", payload)
		if err != nil {
			return err
		}
		wg.Go(func() {
			select {
			case <-future.Ok():
				record(time.Since(at))
			case <-future.Err():
			}
			<-room
		})
	}
}
