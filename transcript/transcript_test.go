package transcript

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
)

// secret signs the tokens of the broker the tests start.
var secret = []byte("a-transcript-secret-of-at-least-32-bytes")

// start runs a broker in memory behind a test server, and returns a
// session on it whose connections get a token for their names.
func start(t *testing.T) (*Session, *bytes.Buffer) {
	t.Helper()
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "popsub.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	broker, err := popsub.New(popsub.Options{Secret: secret, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	server := httptest.NewServer(broker)
	t.Cleanup(func() {
		server.Close()
		broker.Shutdown(context.Background())
	})
	var out bytes.Buffer
	s := NewSession("ws"+strings.TrimPrefix(server.URL, "http")+"/ws",
		func(name string) (string, error) {
			if name == "zed" {
				return "", errors.New("zed has no token")
			}
			return popsub.NewToken(secret, name, time.Hour)
		}, &out)
	t.Cleanup(s.Close)
	return s, &out
}

// A session as a tutorial writes it: each ← line waits for its frame,
// "…" stands for what differs from run to run, every frame is printed,
// and the barrier finds nothing left unclaimed.
func TestSession_RunsATutorialsLines(t *testing.T) {
	s, out := start(t)
	s.Strict = true
	for _, line := range []string{
		`bob → {"type":"subscribe","topic":"jobs"}`,
		`bob ← {"type":"subscribed","topic":"jobs","seq":0}`,
		`alice → {"type":"publish","topic":"jobs","payload":"hi","qos":1}`,
		`alice ← {"type":"published","topic":"jobs","message_id":"…","seq":1}`,
		`bob ← {"type":"message","topic":"jobs","payload":"hi",` +
			`"timestamp":0,"message_id":"…","qos":1,"seq":1,"attempt":1}`,
		`bob ✕`,
	} {
		if err := s.Run(t.Context(), line); err != nil {
			t.Fatalf("line %d, %s: %v\n%s", s.LineNumber(), line, err, out)
		}
	}
	if unclaimed := s.Barrier(t.Context()); len(unclaimed) > 0 {
		t.Fatalf("unclaimed: %v", unclaimed)
	}
	if !strings.Contains(out.String(), `bob ← {"type":"message"`) {
		t.Fatalf("the delivery was not printed:\n%s", out)
	}
}

// A ← line that differs, and a frame no line claims, are each said.
func TestSession_SaysWhatDiffersAndWhatNoLineShows(t *testing.T) {
	s, _ := start(t)
	s.Run(t.Context(), `bob → {"type":"subscribe","topic":"jobs"}`)
	err := s.Run(t.Context(), `bob ← {"type":"subscribed","topic":"other"}`)
	if err == nil {
		t.Fatal("a differing frame passed")
	}
	s.Run(t.Context(), `bob → {"type":"ping"}`)
	if unclaimed := s.Barrier(t.Context()); len(unclaimed) != 1 ||
		!strings.Contains(unclaimed[0], "pong") {
		t.Fatalf("unclaimed: %v, want the pong", unclaimed)
	}
}

func TestSession_SaysWhatIsWrongWithALine(t *testing.T) {
	cases := []struct{ line, want string }{
		{`alice {"type":"ping"}`, "a line is NAME → {frame}"},
		{`{"type":"ping"}`, "the name of its connection first"},
		{`alice hello`, `after alice comes → (send)`},
		{`zed → {"type":"ping"}`, "zed has no token"},
		{`stranger ← {"type":`, "not JSON"},
	}
	for _, tc := range cases {
		s, _ := start(t)
		err := s.Run(t.Context(), tc.line)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.line, err,
				tc.want)
		}
	}
}

// "…" matches any value; strictly, only where a run's value differs
// from the next (ids, tokens, subjects), and times match any number.
func TestMatch_LetsWhatDiffersDiffer(t *testing.T) {
	decode := func(s string) any {
		var v any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		want, got string
		strict    bool
		match     bool
	}{
		{`{"message_id":"…","seq":1}`, `{"message_id":"ab","seq":1}`, true, true},
		{`{"message_id":"…","seq":1}`, `{"message_id":"ab","seq":2}`, true, false},
		{`{"payload":"…"}`, `{"payload":"hi"}`, true, false},
		{`{"payload":"…"}`, `{"payload":"hi"}`, false, true},
		{`{"timestamp":0}`, `{"timestamp":1795994911985}`, true, true},
		{`{"type":"pong"}`, `{"type":"pong","extra":1}`, true, false},
	}
	for _, tc := range cases {
		if got := Match("", decode(tc.want), decode(tc.got),
			tc.strict); got != tc.match {
			t.Errorf("Match(%s, %s, strict %v) = %v, want %v", tc.want,
				tc.got, tc.strict, got, tc.match)
		}
	}
}

// A frame's answer is owed before the frame leaves: a broker that
// answers before the write returns must not leave the count one too
// high, or every barrier after it waits its five seconds for nothing.
func TestSession_OwesTheAnswerBeforeTheFrameLeaves(t *testing.T) {
	s, out := start(t)
	owedAsItLeft := -1
	s.Observe = func(client string, fromClient bool, frame []byte) {
		if fromClient && frameType(frame) == "ping" {
			s.mu.Lock()
			owedAsItLeft = s.clients[client].owed
			s.mu.Unlock()
		}
	}
	for round := range 50 {
		if err := s.Run(t.Context(), `alice → {"type":"ping"}`); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if owedAsItLeft < 1 {
			t.Fatalf("round %d: the ping left owing %d answers, want at "+
				"least its pong", round, owedAsItLeft)
		}
		if unclaimed := s.Barrier(t.Context()); len(unclaimed) != 1 {
			t.Fatalf("round %d: unclaimed %v, want the pong", round,
				unclaimed)
		}
		s.mu.Lock()
		owed := s.clients["alice"].owed
		s.mu.Unlock()
		if owed != 0 {
			t.Fatalf("round %d: %d answers still owed after the barrier",
				round, owed)
		}
	}
}
