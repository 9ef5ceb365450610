package main

import (
	"bytes"
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
	"sync/atomic"
	"time"
)

// setup is one server to measure and how the client talks to it.
type setup struct {
	name  string
	start func(addr, dir string) (*exec.Cmd, target, error)
}

// runAll measures every setup at every subscriber count and prints a
// table of deliveries per second and server CPU per delivery.
func runAll(args []string) error {
	fs := flag.NewFlagSet("compare run", flag.ContinueOnError)
	f := addFlags(fs)
	counts := fs.String("subscribers", "1,10,100", "subscriber counts")
	window := fs.Int64("window", 2000, "most messages the publisher may "+
		"be ahead of the slowest subscriber")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Println("| server | subscribers | deliveries/s | server CPU per delivery |")
	fmt.Println("|---|---|---|---|")
	for _, s := range setups(*f.popsub, self, *f.only) {
		for _, field := range strings.Split(*counts, ",") {
			n, _ := strconv.Atoi(field)
			rate, cpu, err := measure(s, n, *window, *f.duration)
			if err != nil {
				return fmt.Errorf("%s, %d subscribers: %w", s.name, n, err)
			}
			fmt.Printf("| %s | %d | %.0f | %.2f µs |\n", s.name, n, rate, cpu)
		}
	}
	return nil
}

// setups are the servers compared whose names contain only: PopSub with
// one object per frame, with batch:true subscribers, and with a tick's
// publishes in one frame; NATS with JetStream on file storage (ordered
// consumers, plain subscribers, and plain subscribers with publishes the
// stream does not ack, as nobody confirms PopSub's QoS 0); and
// centrifuge, publishing through its client or, as its applications do,
// through the server API.
func setups(popsub, self, only string) []setup {
	var chosen []setup
	for _, s := range allSetups(popsub, self) {
		if strings.Contains(s.name, only) {
			chosen = append(chosen, s)
		}
	}
	return chosen
}

// popsubServe returns the command that serves popsub on addr with its
// database in dir, and a token for it. extra are more serve flags.
func popsubServe(popsub, addr, dir string, extra ...string) (*exec.Cmd,
	string, error) {
	const secret = "compare-secret-of-at-least-32-bytes-long"
	token, err := exec.Command(popsub, "token", "--sub", "bench",
		"--secret", secret).Output()
	if err != nil {
		return nil, "", fmt.Errorf("popsub token: %w", err)
	}
	args := append([]string{"serve", "--addr", addr, "--db",
		filepath.Join(dir, "popsub.db"), "--secret", secret,
		"--log-level", "error"}, extra...)
	return exec.Command(popsub, args...), strings.TrimSpace(string(token)),
		nil
}

// allSetups are every server compared.
func allSetups(popsub, self string) []setup {
	popsubSetup := func(batch, coalesce bool) func(string, string) (*exec.Cmd,
		target, error) {
		return func(addr, dir string) (*exec.Cmd, target, error) {
			cmd, token, err := popsubServe(popsub, addr, dir)
			return cmd, &popsubTarget{url: "ws://" + addr + "/ws",
				token: token, batch: batch, coalesce: coalesce}, err
		}
	}
	return []setup{
		{"PopSub, one object per frame", popsubSetup(false, false)},
		{"PopSub, batch:true subscribers", popsubSetup(true, false)},
		{"PopSub, batch:true, a tick's publishes in one frame (popsub.js)",
			popsubSetup(true, true)},
		{"NATS, JetStream file storage, ordered consumers", func(addr,
			dir string) (*exec.Cmd,
			target, error) {
			return exec.Command(self, "nats-server", addr, dir),
				&natsTarget{url: "nats://" + addr}, nil
		}},
		{"NATS, JetStream file storage, plain subscribers", func(addr,
			dir string) (*exec.Cmd, target, error) {
			return exec.Command(self, "nats-server", addr, dir),
				&natsTarget{url: "nats://" + addr, plain: true}, nil
		}},
		{"NATS, JetStream file storage, plain subscribers, unacked publishes",
			func(addr, dir string) (*exec.Cmd, target, error) {
				return exec.Command(self, "nats-server", addr, dir),
					&natsTarget{url: "nats://" + addr, plain: true,
						unacked: true}, nil
			}},
		{"NATS over WebSocket, JetStream file storage, plain subscribers, " +
			"unacked publishes", func(addr, dir string) (*exec.Cmd, target,
			error) {
			websocket, err := freeAddress()
			return exec.Command(self, "nats-server", addr, dir,
					"ws="+websocket),
				&natsTarget{url: "ws://" + websocket, plain: true,
					unacked: true}, err
		}},
		{"NATS over WebSocket, JetStream file storage synced every 100 ms, " +
			"plain subscribers, unacked publishes", func(addr, dir string) (
			*exec.Cmd, target, error) {
			// PopSub's crash window for QoS 0 (groupcommit's window):
			// the same durability, where NATS's default is two minutes.
			websocket, err := freeAddress()
			return exec.Command(self, "nats-server", addr, dir,
					"ws="+websocket, "sync=100ms"),
				&natsTarget{url: "ws://" + websocket, plain: true,
					unacked: true}, err
		}},
		{"centrifuge", func(addr, dir string) (*exec.Cmd, target, error) {
			return exec.Command(self, "centrifuge-server", addr),
				&centrifugeTarget{url: "ws://" + addr +
					"/connection/websocket"}, nil
		}},
		{"centrifuge, publishes through the server API", func(addr,
			dir string) (*exec.Cmd, target, error) {
			return exec.Command(self, "centrifuge-server", addr),
				&centrifugeTarget{url: "ws://" + addr +
					"/connection/websocket",
					api: "http://" + addr + "/publish"}, nil
		}},
	}
}

// measure starts s's server, connects n subscribers and one publisher,
// publishes 64-byte messages within the window for duration, and
// returns deliveries per second and server CPU µs per delivery.
func measure(s setup, n int, window int64, duration time.Duration) (float64,
	float64, error) {
	t, pid, stop, err := launch(s)
	if err != nil {
		return 0, 0, err
	}
	defer stop()

	received := make([]atomic.Int64, n)
	for i := range n {
		if err := t.subscribe(func([]byte) { received[i].Add(1) }); err != nil {
			return 0, 0, err
		}
	}
	slowest := func() int64 {
		low := int64(1 << 62)
		for i := range received {
			low = min(low, received[i].Load())
		}
		return low
	}
	payload := []byte(`{"x":"` + strings.Repeat("x", 64-8) + `"}`)
	before, start := cpuTime(pid), time.Now()
	var sent int64
	for time.Since(start) < duration {
		room := window - (sent - slowest())
		if room <= 0 {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		k := int(min(room, 64))
		if err := t.publish(k, payload); err != nil {
			return 0, 0, err
		}
		sent += int64(k)
	}
	for drain := time.Now(); slowest() < sent &&
		time.Since(drain) < 10*time.Second; {
		time.Sleep(time.Millisecond)
	}
	elapsed, cpu := time.Since(start), cpuTime(pid)-before
	var delivered int64
	for i := range received {
		delivered += received[i].Load()
	}
	if delivered == 0 {
		return 0, 0, fmt.Errorf("nothing delivered")
	}
	return float64(delivered) / elapsed.Seconds(),
		float64(cpu.Microseconds()) / float64(delivered), nil
}

// launch starts s's server (startServer) and returns the client's
// target, the server's pid, and a func that stops both.
func launch(s setup) (target, int, func(), error) {
	var t target
	pid, stop, err := startServer(func(addr, dir string) (*exec.Cmd,
		error) {
		cmd, started, err := s.start(addr, dir)
		t = started
		return cmd, err
	})
	if err != nil {
		return nil, 0, nil, err
	}
	return t, pid, func() { t.close(); stop() }, nil
}

// startServer runs the command start makes for a free port on 127.0.0.1
// and a temporary folder, waits for it to listen, and returns its pid
// and a func that stops it and removes the folder.
func startServer(start func(addr, dir string) (*exec.Cmd, error)) (int,
	func(), error) {
	dir, err := os.MkdirTemp("", "compare")
	if err != nil {
		return 0, nil, err
	}
	var cmd *exec.Cmd
	addr, err := freeAddress()
	if err == nil {
		cmd, err = start(addr, dir)
	}
	if err == nil {
		cmd.Stderr = os.Stderr
		err = cmd.Start()
	}
	if err != nil {
		os.RemoveAll(dir)
		return 0, nil, err
	}
	stop := func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		os.RemoveAll(dir)
	}
	if err := waitForPort(addr); err != nil {
		stop()
		return 0, nil, err
	}
	awaitPages(addr)
	return cmd.Process.Pid, stop, nil
}

// awaitPages waits, if the server at addr is popsub serve, until it has
// built its pages' WebAssembly: serve from a checkout compiles it in the
// background as it starts, a few seconds of both cores, and a measure
// taken meanwhile had a p99 of 27-35 ms at 10,000 messages a second
// against 0.7 ms after. Another server answers these paths with an
// error at once.
func awaitPages(addr string) {
	client := &http.Client{Timeout: 5 * time.Minute}
	for _, asset := range []string{"/static/popsub.wasm", "/lab/lab.wasm.gz"} {
		response, err := client.Get("http://" + addr + asset)
		if err != nil {
			return
		}
		io.Copy(io.Discard, response.Body)
		response.Body.Close()
	}
}

// flags are the flags every measuring command takes.
type flags struct {
	popsub, only *string
	duration     *time.Duration
}

// addFlags registers them on fs.
func addFlags(fs *flag.FlagSet) flags {
	return flags{popsub: fs.String("popsub", "popsub", "the popsub binary"),
		only: fs.String("only", "", "measure only the servers whose name "+
			"contains this"),
		duration: fs.Duration("duration", 5*time.Second, "publishing time")}
}

// freeAddress finds a free port on 127.0.0.1.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitForPort waits up to ten seconds for addr to accept connections.
func waitForPort(addr string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().
		Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("%s did not open", addr)
}

// cpuTime is a process's user and system CPU time, from /proc.
func cpuTime(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	user, _ := strconv.ParseInt(fields[11], 10, 64)
	system, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(user+system) * time.Second / 100
}
