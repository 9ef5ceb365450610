package main

import (
	"bytes"
	"context"
	"errors"
	"flag"

	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCapture runs a command and returns its stdout, its stderr and its
// error.
func runCapture(args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestClient_ForgivesTheOrderOfItsArguments(t *testing.T) {
	url, token, _ := startServe(t)

	t.Run("shared flags before the command, its flags after its arguments",
		func(t *testing.T) {
			out, _, err := runCapture("client", "--url", url, "--token", token,
				"pub", "chat", `"hi"`, "--qos", "1")
			if err != nil || !strings.Contains(out, `"type":"published"`) {
				t.Fatalf("got %q, %v; want the confirm", out, err)
			}
		})
	t.Run("a negative number is a payload, with or without --",
		func(t *testing.T) {
			for _, args := range [][]string{{"pub", "n", "-5"},
				{"pub", "n", "--", "-5"}} {
				all := append([]string{"client", "--url", url, "--token",
					token, "--qos", "1"}, args...)
				out, _, err := runCapture(all...)
				if err != nil || !strings.Contains(out, `"published"`) {
					t.Fatalf("%v: got %q, %v", args, out, err)
				}
			}
			out, _, err := runCapture("client", "sub", "n", "--url", url,
				"--token", token, "--after", "0", "--count", "2")
			if err != nil || strings.Count(out, `"payload":-5`) != 2 {
				t.Fatalf("sub printed %q, %v; want -5 twice", out, err)
			}
		})
	t.Run("an unknown command is an error, not the demo", func(t *testing.T) {
		_, _, err := runCapture("client", "--url", url, "publish", "x", "1")
		if err == nil || !strings.Contains(err.Error(), "pub TOPIC PAYLOAD") {
			t.Fatalf("got %v, want an error that says what to use", err)
		}
	})
	t.Run("a payload that starts like JSON and is not is refused",
		func(t *testing.T) {
			_, _, err := runCapture("client", "--url", url, "--token", token,
				"pub", "chat", `{"a":`)
			if err == nil || !strings.Contains(err.Error(), "not valid JSON") {
				t.Fatalf("got %v, want a refusal", err)
			}
			_, stderr, err := runCapture("client", "--url", url, "--token",
				token, "pub", "chat", "hello")
			if err != nil || !strings.Contains(stderr, `JSON string "hello"`) {
				t.Fatalf("plain text: %q, %v; want a note on stderr",
					stderr, err)
			}
		})
}

func TestClient_NaksAndPublishesWithATTL(t *testing.T) {
	// A second's ack timeout: the retry loop looks every 200 ms.
	url, token, _ := startServe(t, "--ack-timeout", "1s",
		"--retry-backoff", "1", "--max-retry-delay", "1s")
	out, _, err := runCapture("client", "--url", url, "--token", token,
		"pub", "jobs", `"build"`, "--qos", "1", "--ttl", "1h")
	if err != nil || !strings.Contains(out, `"published"`) {
		t.Fatalf("pub --ttl: %q, %v", out, err)
	}
	// Each delivery is handed back for a retry at once: the second line
	// is attempt 2, and both say when the message expires.
	out, _, err = runCapture("client", "sub", "jobs", "--url", url,
		"--token", token, "--after", "0", "--count", "2", "--nak-delay", "0s")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) != 2 ||
		!strings.Contains(lines[1], `"attempt":2`) ||
		strings.Count(out, `"expires_at":`) != 2 {
		t.Fatalf("sub --nak-delay 0s printed %q, %v; want attempts 1 and "+
			"2, each with expires_at", out, err)
	}
}

func TestClient_ARefusedTokenNamesTheLikelyCause(t *testing.T) {
	url, _, _ := startServe(t)
	stale := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJsb2NhbCIsImV4" +
		"cCI6NDEwMjQ0NDgwMH0.sH8C2bHfvh3GyUTeS7hHmzq0M3r0e7wCM3xEaiK6Z0A"
	_, _, err := runCapture("client", "pub", "chat", "1", "--url", url,
		"--token", stale)
	if err == nil || !strings.Contains(err.Error(), "earlier run") ||
		!strings.Contains(err.Error(), "--secret") {
		t.Fatalf("got %v, want a word of a new random secret and --secret",
			err)
	}
}

func TestCommands_NeverPrintASecret(t *testing.T) {
	secret := strings.Repeat("do-not-print-", 4)
	t.Setenv("POPSUB_SECRET", secret)
	t.Setenv("POPSUB_TOKEN", secret)
	for _, command := range [][]string{{"serve", "-h"}, {"client", "-h"},
		{"client", "pub", "-h"}, {"token", "-h"}, {"bench", "-h"}} {
		out, stderr, err := runCapture(command...)
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%v: %v, want help", command, err)
		}
		if strings.Contains(out+stderr, secret) {
			t.Fatalf("%v printed the secret:\n%s", command, out+stderr)
		}
	}
}

func TestCommands_SayWhatToDoNext(t *testing.T) {
	dir := t.TempDir()
	t.Run("hash-password -h explains, and reads nothing", func(t *testing.T) {
		_, stderr, err := runCapture("hash-password", "-h")
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr,
			"standard input") {
			t.Fatalf("got %v:\n%s", err, stderr)
		}
	})
	t.Run("token refuses a secret serve would refuse", func(t *testing.T) {
		_, _, err := runCapture("token", "--sub", "a", "--secret", "short")
		if err == nil || !strings.Contains(err.Error(), "at least 32") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("serve refuses arguments it does not take", func(t *testing.T) {
		_, _, err := runCapture("serve", "--db", filepath.Join(dir, "a.db"),
			"extra")
		if err == nil || !strings.Contains(err.Error(), "no arguments") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a busy port gives a hint and leaves no database",
		func(t *testing.T) {
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			db := filepath.Join(dir, "busy.db")
			_, _, err = runCapture("serve", "--addr", busy.Addr().String(),
				"--db", db)
			if err == nil || !strings.Contains(err.Error(), "--addr") {
				t.Fatalf("got %v, want a hint", err)
			}
			if _, err := os.Stat(db); err == nil {
				t.Fatal("the busy port left a database file behind")
			}
		})
	t.Run("a short secret in the config names its key", func(t *testing.T) {
		config := filepath.Join(dir, "default.toml")
		os.WriteFile(config, []byte("[server]\njwt_secret = \"short\"\n"),
			0o600)
		_, _, err := runCapture("serve", "--config", config, "--db",
			filepath.Join(dir, "c.db"))
		if err == nil || !strings.Contains(err.Error(),
			"jwt_secret in "+config) {
			t.Fatalf("got %v, want the key and the file named", err)
		}
	})
}

func TestClient_PublishesWithADelay(t *testing.T) {
	url, token, _ := startServe(t, "--ack-timeout", "1s")
	out, _, err := runCapture("client", "--url", url, "--token", token,
		"pub", "jobs", `"later"`, "--qos", "1", "--delay", "500ms")
	if err != nil || !strings.Contains(out, `"topic":"$delayed/jobs"`) {
		t.Fatalf("pub --delay: %q, %v; want a confirm on $delayed/jobs",
			out, err)
	}
	out, _, err = runCapture("client", "sub", "jobs", "--url", url,
		"--token", token, "--after", "0", "--count", "1")
	if err != nil || !strings.Contains(out, `"payload":"later"`) ||
		!strings.Contains(out, `"deliver_at":`) {
		t.Fatalf("sub printed %q, %v; want the delayed message with its "+
			"deliver_at", out, err)
	}
}
