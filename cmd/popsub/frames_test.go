package main

import (
	"bytes"
	"encoding/json"
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
	bin := popsubBinary(t)
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
		{`zed → {"type":"ping"}`, "export ZED=$(go run ./cmd/popsub token " +
			"--sub zed)"},
		{`stranger ← {"type":`, "not JSON"},
	}
	for _, tc := range cases {
		s := newFramesSession(url+"/ws", func(name string) (string, error) {
			return tokenOf(name, "")
		}, &bytes.Buffer{})
		err := s.run(t.Context(), tc.line)
		s.close()
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
		l, ok, _ := parseFrameLine(line)
		if ok && l.name == name && l.arrow == arrow {
			frames = append(frames, l.body)
		}
	}
	return slices.Clip(frames)
}

// frameMatches compares two frames as a tutorial does.
func frameMatches(want, got string) bool {
	var w, g any
	return json.Unmarshal([]byte(want), &w) == nil &&
		json.Unmarshal([]byte(got), &g) == nil && matchJSON("", w, g, true)
}

// signFor signs an hour's token for name with secret.
func signFor(secret, name string) (string, error) {
	return popsub.NewToken([]byte(secret), name, time.Hour)
}
