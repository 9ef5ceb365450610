package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/popsub/popsub/internal/built"
	"github.com/popsub/popsub/wire"
)

// keptAddress is an address on 127.0.0.1 that nothing listens on now,
// for a broker that a test starts again where it was (files a doc wrote,
// pages and clients name that address), or for a client to find closed.
// Its port is picked below the kernel's ephemeral ports, which every
// outgoing connection and every listener on port 0 takes from: a port
// the kernel had picked, freed by a stopped broker, went to another
// package's test connection before the restart could bind it again
// ("address in use", tutorial 8 with the other packages' tests beside it
// on a loaded machine). It is picked from 10000 to 19999, where no other
// package's tests look (natstest.FreePort and the nemesis pick from
// 20000 up), for the same reason: a nats-server another package started
// took a kept port while tutorial 8's broker restarted. No port is
// handed out twice, so that no test here takes another's while it
// restarts.
func keptAddress(t *testing.T) string {
	t.Helper()
	for range 1000 {
		port := 10000 + rand.IntN(10000)
		if _, taken := keptPorts.LoadOrStore(port, true); taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprint("127.0.0.1:", port))
		if err == nil {
			l.Close()
			return fmt.Sprint("127.0.0.1:", port)
		}
	}
	t.Fatal("no free port on 127.0.0.1 between 10000 and 20000")
	return ""
}

// keptPorts are the ports keptAddress handed out.
var keptPorts sync.Map

// startServe runs "popsub serve" in-process on a free 127.0.0.1 port and
// returns its WebSocket URL, the token it printed, and a stop function
// that returns serve's error.
func startServe(t *testing.T, extra ...string) (string, string,
	func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, in := io.Pipe()
	args := append([]string{"serve", "--addr", "127.0.0.1:0",
		"--db", filepath.Join(t.TempDir(), "popsub.db"),
		"--log-level", "error"}, extra...)
	result := make(chan error, 1)
	go func() {
		result <- run(ctx, args, in, io.Discard)
		in.Close()
	}()
	lines := bufio.NewScanner(out)
	var url, token string
	configured := strings.Contains(strings.Join(extra, " "), "--config") ||
		strings.Contains(strings.Join(extra, " "), "--secret")
	for url == "" || (token == "" && !configured) {
		if !lines.Scan() {
			break
		}
		line := strings.TrimSpace(lines.Text())
		if rest, ok := strings.CutPrefix(line, "popsub listening on "); ok {
			// http://host … or https://host …: ws:// or wss://.
			url = "ws" + strings.TrimPrefix(strings.Fields(rest)[0], "http")
		}
		if strings.HasPrefix(line, "try: ") {
			_, token, _ = strings.Cut(line, " --token ")
		}
	}
	go io.Copy(io.Discard, out)
	if url == "" {
		cancel()
		t.Fatalf("serve printed no URL: %v", <-result)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-result:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("serve did not stop")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	return url, token, stop
}

// runClient runs a client command and returns what it printed.
func runClient(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, append([]string{"client"}, args...), &stdout,
		&stderr); err != nil {
		t.Fatalf("client %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

func TestServe_ClientRoundTrip(t *testing.T) {
	url, token, stop := startServe(t)
	auth := []string{"--url", url, "--token", token}

	t.Run("the demo client sees its own message come back", func(t *testing.T) {
		out := runClient(t, auth...)
		if !strings.Contains(out, `"payload":"Hello from the popsub client"`) ||
			!strings.Contains(out, `"type":"published"`) {
			t.Fatalf("demo printed:\n%s", out)
		}
	})
	t.Run("pub with qos 1 prints the confirm", func(t *testing.T) {
		out := runClient(t, append([]string{"pub", "orders", `{"n":1}`,
			"--qos", "1", "--id", "o-1"}, auth...)...)
		var confirm wire.Received
		json.Unmarshal([]byte(out), &confirm)
		if !strings.Contains(out, `"type":"published"`) ||
			confirm.MessageID != "o-1" || confirm.Seq != 1 {
			t.Fatalf("pub printed %q", out)
		}
	})
	t.Run("sub prints deliveries as JSON lines", func(t *testing.T) {
		runClient(t, append([]string{"pub", "orders", "plain"}, auth...)...)
		out := runClient(t, append([]string{"sub", "orders", "--count",
			"2"}, auth...)...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.Contains(lines[1],
			`"payload":"plain"`) {
			t.Fatalf("sub printed:\n%s", out)
		}
	})
	t.Run("a SIGINT-style stop is graceful", func(t *testing.T) {
		if err := stop(); err != nil {
			t.Fatalf("serve returned %v, want nil", err)
		}
	})
}

func TestServe_RefusesBadConfiguration(t *testing.T) {
	cases := map[string][]string{
		"a secret shorter than 32 bytes": {"--secret", "short"},
		"a zero outbox":                  {"--outbox-bytes", "0"},
		"an unknown flag":                {"--colour", "blue"},
		"an auth timeout over 10s":       {"--auth-timeout", "11s"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			all := append([]string{"serve", "--addr", "127.0.0.1:0", "--db",
				filepath.Join(t.TempDir(), "x.db")}, args...)
			err := run(context.Background(), all, io.Discard, io.Discard)
			if err == nil {
				t.Fatal("serve started, want an error")
			}
		})
	}
	t.Run("a malformed environment value", func(t *testing.T) {
		t.Setenv("POPSUB_MAX_RETRIES", "five")
		err := run(context.Background(), []string{"serve"}, io.Discard,
			io.Discard)
		if err == nil || !strings.Contains(err.Error(), "POPSUB_MAX_RETRIES") {
			t.Fatalf("got %v, want an error naming POPSUB_MAX_RETRIES", err)
		}
	})
}

func TestToken_SignsWithTheSecret(t *testing.T) {
	secret := strings.Repeat("s", 32)
	var out bytes.Buffer
	err := run(context.Background(), []string{"token", "--sub", "alice",
		"--secret", secret, "--ttl", "1h"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	claims := jwt.RegisteredClaims{}
	_, err = jwt.ParseWithClaims(strings.TrimSpace(out.String()), &claims,
		func(*jwt.Token) (any, error) { return []byte(secret), nil })
	if err != nil || claims.Subject != "alice" {
		t.Fatalf("token did not verify: %v, sub %q", err, claims.Subject)
	}
	if err := run(context.Background(), []string{"token", "--secret",
		secret}, io.Discard, io.Discard); err == nil {
		t.Fatal("token without --sub succeeded")
	}
}

func TestServe_ASecondServerOnTheSameDatabaseFails(t *testing.T) {
	db := filepath.Join(t.TempDir(), "shared.db")
	url, token, _ := startServe(t, "--db", db)

	started := time.Now()
	err := run(context.Background(), []string{"serve", "--addr",
		"127.0.0.1:0", "--db", db}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "in use by another") ||
		!strings.Contains(err.Error(), "--db") {
		t.Fatalf("second serve: %v, want 'in use by another process' and "+
			"a word of --db", err)
	}
	if waited := time.Since(started); waited > 3*time.Second {
		t.Fatalf("second serve took %v to give up", waited)
	}
	out := runClient(t, "pub", "still", "here", "--qos", "1", "--url", url,
		"--token", token)
	if !strings.Contains(out, `"type":"published"`) {
		t.Fatalf("the first server stopped serving: %q", out)
	}
}

func TestServe_MaxRetriesZeroMeansNone(t *testing.T) {
	for _, source := range []string{"flag", "config file"} {
		t.Run("from the "+source, func(t *testing.T) {
			args := []string{"--max-retries", "0"}
			if source == "config file" {
				path := filepath.Join(t.TempDir(), "popsub.toml")
				os.WriteFile(path, []byte("[broker]\nmax_retries = 0\n"),
					0o600)
				args = []string{"--config", path}
			}
			cfg, err := parseServe(args, io.Discard)
			if err != nil || cfg.options.MaxRetries >= 0 {
				t.Fatalf("MaxRetries = %d, %v; want a negative: none",
					cfg.options.MaxRetries, err)
			}
		})
	}
}

// POPSUB_CPUPROFILE and POPSUB_MEMPROFILE, which performance.md's
// figures come from, each leave a profile when serve stops on SIGINT.
func TestServe_WritesItsProfilesWhenItStops(t *testing.T) {
	bin := built.PopsubFor(t)
	dir := t.TempDir()
	cpu, allocs := filepath.Join(dir, "cpu.pprof"),
		filepath.Join(dir, "allocs.pprof")
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--db",
		filepath.Join(dir, "popsub.db"), "--log-level", "error")
	cmd.Env = append(os.Environ(), "POPSUB_CPUPROFILE="+cpu,
		"POPSUB_MEMPROFILE="+allocs)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "popsub listening") {
	}
	go io.Copy(io.Discard, out)
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve did not stop cleanly on SIGINT: %v", err)
	}
	for _, path := range []string{cpu, allocs} {
		data, err := os.ReadFile(path)
		// A profile is gzipped protobuf: it starts with gzip's magic.
		if err != nil || !bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
			t.Errorf("%s: %d bytes, %v; want a gzipped profile", path,
				len(data), err)
		}
	}
}
