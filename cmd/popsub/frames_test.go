package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/popsub/popsub/internal/built"
	"github.com/popsub/popsub/transcript"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/popsub/popsub"
)

// TestFrames_APastedBlockPrintsWhatEachConnectionReceives pipes a block
// of tutorial 2 into the built command, as a reader pastes it, and
// compares what it printed, connection by connection, with the block's
// ← lines.
func TestFrames_APastedBlockPrintsWhatEachConnectionReceives(t *testing.T) {
	bin := built.PopsubFor(t)
	secret := "a-tutorial-secret-of-at-least-32-bytes"
	url, _, _ := startServe(t, "--secret", secret, "--ack-timeout", "1s")
	block := `alice → {"type":"subscribe","topic":"jobs"}
alice ← {"type":"subscribed","topic":"jobs","seq":0}
bob → {"type":"subscribe","topic":"jobs"}
bob ← {"type":"subscribed","topic":"jobs","seq":0}
carol → {"type":"publish","topic":"jobs","payload":"build","qos":1,"message_id":"job-1"}
carol ← {"type":"published","topic":"jobs","message_id":"job-1","seq":1}
alice ← {"type":"message","topic":"jobs","payload":"build","timestamp":1796000000000,"message_id":"job-1","qos":1,"seq":1,"attempt":1}
alice → {"type":"ack","message_id":"job-1"}
bob ← {"type":"message","topic":"jobs","payload":"build","timestamp":1796000000000,"message_id":"job-1","qos":1,"seq":1,"attempt":1}
bob ← {"type":"message","topic":"jobs","payload":"build","timestamp":1796000000000,"message_id":"job-1","qos":1,"seq":1,"attempt":2}
bob -> {"type":"ack","message_id":"job-1"}
`
	cmd := exec.Command(bin, "client", "frames", "--url", url+"/ws")
	cmd.Stdin = strings.NewReader(block)
	cmd.Env = os.Environ()
	for _, name := range []string{"alice", "bob", "carol"} {
		tok, err := signFor(secret, name)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, strings.ToUpper(name)+"="+tok)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("client frames: %v\n%s%s", err, stdout.String(),
			stderr.String())
	}
	for _, name := range []string{"alice", "bob", "carol"} {
		want := received(block, name, "←")
		got := received(stdout.String(), name, "←")
		if len(got) != len(want) {
			t.Fatalf("%s: printed %d frames, the block shows %d:\n%s", name,
				len(got), len(want), stdout.String())
		}
		for i := range want {
			if !frameMatches(want[i], got[i]) {
				t.Errorf("%s printed\n  %s\nwhere the block shows\n  %s", name,
					got[i], want[i])
			}
		}
	}
}

func TestFrames_SaysWhatIsWrongWithALine(t *testing.T) {
	url, _, _ := startServe(t, "--secret",
		"a-tutorial-secret-of-at-least-32-bytes")
	t.Setenv("POPSUB_TOKEN", "")
	cases := []struct{ line, want string }{
		{`alice {"type":"ping"}`, "a line is NAME → {frame}"},
		{`{"type":"ping"}`, "the name of its connection first"},
		{`alice hello`, `after alice comes → (send)`},
		{`zed → {"type":"ping"}`, "export ZED=$(go run ./cmd/popsub token " +
			"--sub zed)"},
		{`stranger ← {"type":`, "not JSON"},
	}
	for _, tc := range cases {
		s := transcript.NewSession(url+"/ws", func(name string) (string, error) {
			return tokenOf(name, "")
		}, &bytes.Buffer{})
		err := s.Run(t.Context(), tc.line)
		s.Close()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.line, err,
				tc.want)
		}
	}
}

// received lists the frames of text's lines "name ARROW {…}", in order.
func received(text, name, arrow string) []string {
	var frames []string
	for line := range strings.Lines(text) {
		l, ok, _ := transcript.ParseLine(line)
		if ok && l.Name == name && l.Arrow == arrow {
			frames = append(frames, l.Body)
		}
	}
	return slices.Clip(frames)
}

// frameMatches compares two frames as a tutorial does.
func frameMatches(want, got string) bool {
	var w, g any
	return json.Unmarshal([]byte(want), &w) == nil &&
		json.Unmarshal([]byte(got), &g) == nil && transcript.Match("", w, g, true)
}

// signFor signs an hour's token for name with secret.
func signFor(secret, name string) (string, error) {
	return popsub.NewToken([]byte(secret), name, time.Hour)
}

func TestFrames_TypedWithoutRepliesPrintsThemAndGoesOn(t *testing.T) {
	secret := "a-tutorial-secret-of-at-least-32-bytes"
	url, _, _ := startServe(t, "--secret", secret)
	alice, err := signFor(secret, "alice")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ALICE", alice)
	typed := `alice → {"type":"subscribe","topic":"jobs"}` + "\n"
	for _, check := range []bool{false, true} {
		args := []string{"client", "frames", "--url", url + "/ws"}
		if check {
			args = append(args, "--check")
		}
		var stdout, stderr bytes.Buffer
		err := runWithInput(args, typed, &stdout, &stderr)
		if !strings.Contains(stdout.String(), `alice ← {"type":"subscribed"`) {
			t.Errorf("check=%v printed %q (%s), want alice's reply", check,
				stdout.String(), stderr.String())
		}
		if check != (err != nil) {
			t.Errorf("check=%v: %v (%s), want an error only with --check",
				check, err, stderr.String())
		}
	}

	// A refused token says why it usually is.
	t.Setenv("ALICE", "not-a-token")
	var stdout, stderr bytes.Buffer
	runWithInput([]string{"client", "frames", "--url", url + "/ws"}, typed,
		&stdout, &stderr)
	if !strings.Contains(stdout.String(), "# alice's token was refused") {
		t.Errorf("a refused token printed %q, want a hint", stdout.String())
	}
}

// Input from a pipe ends at once; the answers other connections are
// owed still come, and are printed, before the command exits: a QoS 1
// confirm leaves after the disk's sync, later than a pong sent after it.
func TestFrames_PipedInputWaitsForTheAnswersItIsOwed(t *testing.T) {
	secret := "a-tutorial-secret-of-at-least-32-bytes"
	url, _, _ := startServe(t, "--secret", secret)
	for _, name := range []string{"alice", "bob"} {
		token, err := signFor(secret, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(strings.ToUpper(name), token)
	}
	piped := `alice → {"type":"subscribe","topic":"jobs"}
bob → {"type":"publish","topic":"jobs","payload":1,"qos":1}
alice → {"type":"ping"}
`
	var stdout, stderr bytes.Buffer
	if err := runWithInput([]string{"client", "frames", "--url",
		url + "/ws"}, piped, &stdout, &stderr); err != nil {
		t.Fatalf("client frames: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{`bob ← {"type":"published"`,
		`alice ← {"type":"message"`} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("printed\n%s\nwithout %s", stdout.String(), want)
		}
	}
}

// runWithInput runs popsub with args, input as its standard input.
func runWithInput(args []string, input string, stdout,
	stderr *bytes.Buffer) error {
	bin, err := built.Popsub()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(input)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd.Run()
}

func TestClient_SubJoinsAGroup(t *testing.T) {
	secret := "a-tutorial-secret-of-at-least-32-bytes"
	url, _, _ := startServe(t, "--secret", secret)
	tok, err := signFor(secret, "worker")
	if err != nil {
		t.Fatal(err)
	}
	// Two members, each done after two jobs: four jobs make two each,
	// where two plain subscribers would each print the first two.
	outs := make([]bytes.Buffer, 2)
	done := make(chan error, 2)
	for i := range outs {
		go func() {
			done <- run(context.Background(), []string{"client", "sub",
				"jobs", "--group", "workers", "--count", "2", "--url", url,
				"--token", tok}, &outs[i], io.Discard)
		}()
	}
	waitForSubscribers(t, url, 2)
	for i := range 4 {
		if err := run(context.Background(), []string{"client", "pub", "jobs",
			fmt.Sprint(i), "--qos", "1", "--url", url, "--token", tok},
			io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	for range outs {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	seqs := map[string]bool{}
	for i := range outs {
		for _, line := range strings.Split(strings.TrimSpace(
			outs[i].String()), "\n") {
			var m struct{ Seq json.Number }
			json.Unmarshal([]byte(line), &m)
			seqs[m.Seq.String()] = true
		}
	}
	if len(seqs) != 4 {
		t.Errorf("the members printed %d distinct jobs, want 4: %v", len(seqs),
			seqs)
	}
}

func TestClient_HintsWhatADialNeeds(t *testing.T) {
	cases := []struct {
		name, want string
		sans       bool
		scheme     string
	}{
		{"ws:// to a TLS broker", "use wss://", true, "ws"},
		{"a certificate without subjectAltName", "subjectAltName", false,
			"wss"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cert, key := selfSignedNaming(t, c.sans)
			url, token, _ := startServe(t, "--tls-cert", cert, "--tls-key", key)
			url = c.scheme + strings.TrimPrefix(url, "wss")
			err := run(context.Background(), []string{"client", "pub", "chat",
				"1", "--url", url, "--ca", cert, "--token", token}, io.Discard,
				io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a hint with %q", err, c.want)
			}
		})
	}
}

// waitForSubscribers waits until serve at url counts n subscriptions
// (its /metrics gauge).
func waitForSubscribers(t *testing.T, url string, n int) {
	t.Helper()
	metrics := "http" + strings.TrimPrefix(url, "ws") + "/metrics"
	want := fmt.Sprintf("popsub_subscriptions %d", n)
	for deadline := time.Now().Add(20 * time.Second); ; {
		res, err := http.Get(metrics)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if strings.Contains(string(body), want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve never counted %d subscriptions", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
