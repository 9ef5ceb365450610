package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// runNames has one connection subscribe and unsubscribe, in turn, to
// names it never used before, as a client with a reply topic per
// request does, in rounds, and prints the broker's resident memory
// after each round: what the broker keeps of a name nobody subscribes
// to any more. With --wildcards each name is a filter ending in +. With
// --publish the connection publishes one QoS 0 message to each name
// instead, on a broker with --ttl 3s, and each round waits the TTL out
// and prints the size of the broker's file too: what it keeps of a topic
// whose messages expired; with --keep as well, the broker keeps its
// default TTL and the rounds follow each other, and the run ends by
// timing its clean stop. With --nats the broker's log is a NATS
// server's JetStream, as `popsub serve --nats` shares one.
func runNames(args []string) error {
	fs := flag.NewFlagSet("compare names", flag.ContinueOnError)
	popsub := fs.String("popsub", "popsub", "the popsub binary")
	pairs := fs.Int("pairs", 20_000,
		"new names a round: subscribe and unsubscribe pairs, or publishes")
	rounds := fs.Int("rounds", 3, "rounds")
	onNATS := fs.Bool("nats", false, "the log on NATS JetStream")
	wildcards := fs.Bool("wildcards", false, "filters ending in +, not topics")
	publish := fs.Bool("publish", false, "one publish to each name, --ttl 3s")
	keep := fs.Bool("keep", false, "with --publish: the default TTL, and "+
		"rounds back to back")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *publish {
		return runTopics(*popsub, *pairs, *rounds, *keep)
	}
	store, extra := "its own bbolt file", []string(nil)
	if *onNATS {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		_, stop, err := startServer(func(addr, dir string) (*exec.Cmd,
			error) {
			extra = []string{"--nats", "nats://" + addr}
			return exec.Command(self, "nats-server", addr, dir), nil
		})
		if err != nil {
			return err
		}
		defer stop()
		store = "a NATS JetStream log"
	}
	pid, ws, _, stop, err := servePopsub(*popsub, extra...)
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()

	before := rssKiB(pid)
	suffix, kind := "", "name"
	if *wildcards {
		suffix, kind = "/+", "filter"
	}
	fmt.Printf("one connection, %d subscribe and unsubscribe pairs a "+
		"round, each to a new %s; the broker on %s, %.1f MiB resident "+
		"at the start\n\n", *pairs, kind, store, before/1024)
	fmt.Println("| round | resident memory | grown in the round |")
	fmt.Println("|---|---|---|")
	last := before
	for round := 1; round <= *rounds; round++ {
		sent := make(chan error, 1)
		go func() { sent <- sendPairs(ws, round, *pairs, suffix) }()
		for replies := 0; replies < 2**pairs; {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return err
			}
			for line := range bytes.Lines(data) {
				switch {
				case bytes.Contains(line, []byte(`"type":"error"`)):
					return fmt.Errorf("the broker refused: %s", line)
				case bytes.Contains(line, []byte(`subscribed"`)):
					replies++
				}
			}
		}
		if err := <-sent; err != nil {
			return err
		}
		time.Sleep(time.Second) // let the broker's goroutines settle
		now := rssKiB(pid)
		fmt.Printf("| %d | %.1f MiB | %+.0f KiB |\n", round, now/1024,
			now-last)
		last = now
	}
	return nil
}

// sendPairs sends n subscribe and unsubscribe pairs, each to a name of
// round's never used before, ending in suffix.
func sendPairs(ws *websocket.Conn, round, n int, suffix string) error {
	ctx := context.Background()
	for i := range n {
		name := fmt.Sprintf("names/%d/%d%s", round, i, suffix)
		for _, kind := range []string{"subscribe", "unsubscribe"} {
			frame := fmt.Appendf(nil, `{"type":%q,"topic":%q}`, kind, name)
			if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
				return err
			}
		}
	}
	return nil
}

// runTopics is runNames --publish: one connection publishes one QoS 0
// message to each of n new names a round and prints how long the broker
// took to read them (from the round's first publish to the pong of a
// ping sent after its last), how many it refused (--max-topics), its
// resident memory and the size of its file. The broker's log keeps
// messages 3 s, and each round waits the TTL's trim out; with keep, it
// keeps them its default hour and the rounds follow each other, so the
// names pile up, and the run ends by timing the broker's clean stop.
func runTopics(popsub string, n, rounds int, keep bool) error {
	const ttl = 3 * time.Second
	extra, wait := []string{"--ttl", ttl.String()}, ttl+1500*time.Millisecond
	if keep {
		extra, wait = nil, 0
	}
	pid, ws, file, stop, err := servePopsub(popsub, extra...)
	if err != nil {
		return err
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	ctx := context.Background()
	// Read all along, so that the broker's keepalive pings are answered.
	var refused atomic.Int64
	pongs := make(chan error, 1)
	go func() {
		for {
			_, data, err := ws.Read(ctx)
			switch {
			case err != nil:
				pongs <- err
				return
			case bytes.Contains(data, []byte(`"type":"error"`)):
				refused.Add(1)
			case bytes.Contains(data, []byte(`"type":"pong"`)):
				pongs <- nil
			}
		}
	}()

	kept := fmt.Sprintf("with --ttl %s, read %s after the round's last "+
		"publish", ttl, wait)
	if keep {
		kept = "with its default TTL, the rounds back to back"
	}
	fmt.Printf("one connection, one QoS 0 publish to each of %d new "+
		"names a round; the broker on its own bbolt file %s; %.1f MiB "+
		"resident at the start\n\n", n, kept, rssKiB(pid)/1024)
	fmt.Println("| round | read in | names a second | refused | " +
		"resident memory | file |")
	fmt.Println("|---|---|---|---|---|---|")
	for round := 1; round <= rounds; round++ {
		start, before := time.Now(), refused.Load()
		for i := range n {
			frame := fmt.Appendf(nil, `{"type":"publish","topic":`+
				`"readings/%d/%d","payload":%d,"qos":0}`, round, i, i)
			if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
				return err
			}
		}
		// The pong comes once the broker has read every publish before it.
		err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"ping"}`))
		if err != nil {
			return err
		}
		if err := <-pongs; err != nil {
			return err
		}
		took := time.Since(start)
		time.Sleep(wait)
		info, err := os.Stat(file)
		if err != nil {
			return err
		}
		fmt.Printf("| %d | %.2f s | %.0f | %d | %.1f MiB | %.1f MB |\n",
			round, took.Seconds(), float64(n)/took.Seconds(),
			refused.Load()-before, rssKiB(pid)/1024, float64(info.Size())/1e6)
	}
	if keep {
		start := time.Now()
		stop()
		stop = nil
		fmt.Printf("\nthe broker's clean stop (SIGINT to exit) took %.1f s\n",
			time.Since(start).Seconds())
	}
	return nil
}

// servePopsub starts popsub serve, with extra flags, on a file of its
// own, and connects to it: it returns the server's pid, the connection,
// the file's path, and what closes the one and stops the other.
func servePopsub(popsub string, extra ...string) (int, *websocket.Conn,
	string, func(), error) {
	var url, token, file string
	pid, stop, err := startServer(func(addr, dir string) (*exec.Cmd,
		error) {
		cmd, t, err := popsubServe(popsub, addr, dir, extra...)
		url, token = "ws://"+addr+"/ws", t
		file = filepath.Join(dir, "popsub.db")
		return cmd, err
	})
	if err != nil {
		return 0, nil, "", nil, err
	}
	ws, err := dialPopsub(context.Background(), url, token, nil, false)
	if err != nil {
		stop()
		return 0, nil, "", nil, err
	}
	return pid, ws, file, func() { ws.CloseNow(); stop() }, nil
}
