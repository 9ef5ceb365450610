package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// runIdle holds n idle PopSub connections, all subscribed to one topic,
// publishes once, and times until every connection has the message. It
// prints each broker's open files, goroutines and resident memory per
// connection, and the fan-out time.
//
// A process may hold only so many open files (RLIMIT_NOFILE), and each
// connection is one in the broker and one in its client. When n is more
// than one process may hold, the connections are spread over as many
// brokers as it takes, which share their log through a NATS server
// (popsub serve --nats), so that one publish still reaches every
// connection; and the clients over as many processes, each dialing from
// a source address of its own (127.0.0.2, .3, …) so that ports do not
// run out. Where the limit allows, one broker holds them all, on its
// own bbolt file, as popsub bench --idle measures it.
func runIdle(args []string) error {
	fs := flag.NewFlagSet("compare idle", flag.ContinueOnError)
	popsub := fs.String("popsub", "popsub", "the popsub binary")
	n := fs.Int("connections", 100_000, "idle connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 {
		return fmt.Errorf("--connections must be at least 1")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Each process keeps room for its other files: the database, the
	// listener, NATS, /proc reads.
	each := raiseOpenFileLimit() - 100
	if each < 1 {
		return fmt.Errorf("a process may open only %d files", each+100)
	}
	brokers := (*n + each - 1) / each
	fmt.Printf("%d connections, at most %d a process (RLIMIT_NOFILE), "+
		"over %d broker(s)\n", *n, each, brokers)

	store := "its own bbolt file"
	var extra []string
	if brokers > 1 {
		pid, stop, err := startServer(func(addr, dir string) (*exec.Cmd,
			error) {
			extra = []string{"--nats", "nats://" + addr}
			store = "one NATS JetStream log, shared"
			return exec.Command(self, "nats-server", addr, dir), nil
		})
		if err != nil {
			return err
		}
		defer stop()
		defer func() {
			fmt.Printf("NATS server: %.0f MiB resident\n", rssKiB(pid)/1024)
		}()
	}
	type broker struct {
		url, token string
		pid        int
		before     float64 // resident KiB before the connections
		clients    *exec.Cmd
		lines      *bufio.Scanner
		// hold is the clients' stdin, never written: when this process
		// ends, however it ends, it closes, and they end too.
		hold io.WriteCloser
	}
	var all []*broker
	for i := range brokers {
		var b broker
		pid, stop, err := startServer(func(addr, dir string) (*exec.Cmd,
			error) {
			cmd, token, err := popsubServe(*popsub, addr, dir, extra...)
			b.url, b.token = "ws://"+addr+"/ws", token
			return cmd, err
		})
		if err != nil {
			return err
		}
		defer stop()
		b.pid, b.before = pid, rssKiB(pid)
		count := share(*n, brokers, i)
		// The clients of broker i dial from 127.0.0.(2+i).
		b.clients = exec.Command(self, "idle-clients", b.url, b.token,
			strconv.Itoa(count), fmt.Sprintf("127.0.0.%d", 2+i))
		b.clients.Stderr = os.Stderr
		stdout, err := b.clients.StdoutPipe()
		if err != nil {
			return err
		}
		b.lines = bufio.NewScanner(stdout)
		if b.hold, err = b.clients.StdinPipe(); err != nil {
			return err
		}
		if err := b.clients.Start(); err != nil {
			return err
		}
		defer b.clients.Process.Kill()
		all = append(all, &b)
	}
	// The clients connect side by side; each says "ready" once its
	// connections are all subscribed.
	start := time.Now()
	for i, b := range all {
		if !b.lines.Scan() || b.lines.Text() != "ready" {
			return fmt.Errorf("the clients of broker %d did not connect", i)
		}
	}
	fmt.Printf("connected in %.1f s\n", time.Since(start).Seconds())
	// A connection quiet for a second parks its reader (socket.IdleAfter):
	// wait until the last one has, and then some.
	time.Sleep(3 * time.Second)

	fmt.Println("| broker | store | connections | open files | goroutines | " +
		"resident memory per connection | clients' resident memory |")
	fmt.Println("|---|---|---|---|---|---|---|")
	var files, resident float64
	for i, b := range all {
		count := share(*n, brokers, i)
		metrics, rss := serverMetrics(b.url), rssKiB(b.pid)
		files += metrics["process_open_fds"]
		resident += rss
		fmt.Printf("| %d | %s | %d | %.0f | %.0f | %.1f KiB | %.0f MiB |\n",
			i+1, store, count, metrics["process_open_fds"],
			metrics["go_goroutines"], (rss-b.before)/float64(count),
			rssKiB(b.clients.Process.Pid)/1024)
	}
	fmt.Printf("the broker(s) together: %.0f open files, %.0f MiB resident\n",
		files, resident/1024)

	// One publish, to the first broker, which every connection waits for;
	// each client process answers with the time its last one had it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, err := dialPopsub(ctx, all[0].url, all[0].token, nil, false)
	if err != nil {
		return err
	}
	defer ws.CloseNow()
	sent := time.Now()
	err = ws.Write(ctx, websocket.MessageText,
		[]byte(`{"type":"publish","topic":"idle","payload":"all of you"}`))
	if err != nil {
		return err
	}
	var last int64
	for i, b := range all {
		if !b.lines.Scan() {
			return fmt.Errorf("the clients of broker %d did not all get "+
				"the publish", i+1)
		}
		arrived, _ := strconv.ParseInt(b.lines.Text(), 10, 64)
		last = max(last, arrived)
	}
	fmt.Printf("one publish reached all %d in %.0f ms\n", *n,
		float64(last-sent.UnixNano())/1e6)
	return nil
}

// share is broker i's share of n connections over brokers.
func share(n, brokers, i int) int {
	if i < n%brokers {
		return n/brokers + 1
	}
	return n / brokers
}

// runIdleClients is a child of runIdle: it opens count connections to
// url from source, each subscribed to idle and reading, prints "ready",
// then, once every connection has had a message, the time the last one
// had it, in Unix nanoseconds; and holds the connections until its
// stdin closes, when runIdle ends.
func runIdleClients(url, token, count, source string) error {
	n, err := strconv.Atoi(count)
	if err != nil {
		return err
	}
	raiseOpenFileLimit()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	client := &http.Client{Transport: &http.Transport{
		DialContext: dialer.DialContext}}
	ctx := context.Background()
	var arrived sync.WaitGroup
	var last atomic.Int64
	connect := func() error {
		ws, err := dialPopsub(ctx, url, token, client, false)
		if err != nil {
			return err
		}
		err = ws.Write(ctx, websocket.MessageText,
			[]byte(`{"type":"subscribe","topic":"idle"}`))
		if err != nil {
			return err
		}
		if _, _, err := ws.Read(ctx); err != nil {
			return err
		}
		// Reading from the start, as a real client does, answers the
		// broker's pings.
		arrived.Go(func() {
			if _, _, err := ws.Read(ctx); err == nil {
				now := time.Now().UnixNano()
				for old := last.Load(); now > old &&
					!last.CompareAndSwap(old, now); old = last.Load() {
				}
			}
		})
		return nil
	}
	// Eight dial at a time: one at a time, a connection's round trips
	// left the cores idle, and 100,000 took seven minutes.
	var dialers sync.WaitGroup
	var failed atomic.Pointer[error]
	for d := range 8 {
		dialers.Go(func() {
			for i := d; i < n && failed.Load() == nil; i += 8 {
				if err := connect(); err != nil {
					err = fmt.Errorf("connection %d: %w", i+1, err)
					failed.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	dialers.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	fmt.Println("ready")
	arrived.Wait()
	fmt.Println(last.Load())
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// dialPopsub connects to url through client (nil for the default) and
// authenticates with token, opting into batches if batch.
func dialPopsub(ctx context.Context, url, token string,
	client *http.Client, batch bool) (*websocket.Conn, error) {
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dialCtx, url,
		&websocket.DialOptions{HTTPClient: client})
	if err != nil {
		return nil, err
	}
	auth := fmt.Appendf(nil, `{"type":"auth","token":%q,"batch":%v}`,
		token, batch)
	err = ws.Write(dialCtx, websocket.MessageText, auth)
	var data []byte
	if err == nil {
		_, data, err = ws.Read(dialCtx)
	}
	if err != nil || !bytes.Contains(data, []byte("authenticated")) {
		ws.CloseNow()
		return nil, fmt.Errorf("auth: %s %v", data, err)
	}
	return ws, nil
}

// raiseOpenFileLimit raises this process's soft open-file limit to its
// hard one, which children inherit, and returns the limit now in force.
func raiseOpenFileLimit() int {
	var limit syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit) != nil {
		return 0
	}
	limit.Cur = limit.Max
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit) != nil {
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit)
	}
	return int(limit.Cur)
}

// rssKiB is a process's resident memory, from /proc, in KiB.
func rssKiB(pid int) float64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid),
		"status"))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return kib
		}
	}
	return 0
}

// serverMetrics reads the gauges of a PopSub server's /metrics, by name.
func serverMetrics(wsURL string) map[string]float64 {
	gauges := map[string]float64{}
	target := "http" + strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws"),
		"/ws")
	response, err := http.Get(target + "/metrics")
	if err != nil {
		return gauges
	}
	defer response.Body.Close()
	for lines := bufio.NewScanner(response.Body); lines.Scan(); {
		name, value, ok := strings.Cut(lines.Text(), " ")
		if n, err := strconv.ParseFloat(value, 64); ok && err == nil {
			gauges[name] = n
		}
	}
	return gauges
}
