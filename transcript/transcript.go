// Package transcript runs sessions of WebSocket frames written as the
// tutorials write them, one line a step, against a PopSub broker: it is
// popsub client frames, and the docs' tests run every tutorial's session
// through it, so a tutorial cannot drift from the broker. Each line
// names a connection and says what happens on it:
//
//	alice → {"type":"subscribe","topic":"jobs"}   send a frame (-> too)
//	alice ← {"type":"subscribed",…}               the frame alice gets next (<- too)
//	alice ✕ 4008                                  alice's connection closes, with 4008 (x too)
//	alice ✕                                       close alice's connection
//
// # Typing, and checking
//
// A connection opens on its name's first line and authenticates,
// quietly, with the token Session.Token gives for its name; it does not
// when its first frame is auth or login, in which "TOKEN" stands for
// that token, or when its name starts with "stranger". Every frame a
// connection gets is printed to Out as it arrives, alice ← {…}. A ← line
// waits for that frame and says so if it differs ("…" in it matches any
// value: Match). At the end, Barrier pings every connection, so that
// nothing else was on its way, and returns the frames no ← line
// claimed. So it is both a way to type frames at a broker, which needs
// no ← line at all, and a transcript checker, which counts an unclaimed
// frame as a mistake too. Lines are run in order, on one goroutine;
// each connection's frames are read on a goroutine of its own until
// Close.
package transcript

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/wire"
)

// waitForFrame is how long a ← line waits for its frame: longer than any
// ack timeout a tutorial sets, so that a retry shown in a block comes.
const waitForFrame = 20 * time.Second

// Session is one run of frame lines against a broker.
type Session struct {
	// URL is the broker's WebSocket (ws://…/ws); Options how to dial
	// it, nil for the defaults.
	URL     string
	Options *websocket.DialOptions
	// Token returns the token of a named connection.
	Token func(name string) (string, error)
	// Strict compares as the tutorials need: only a message id, a token
	// or a subject may be "…", and a timestamp, another instant
	// (expires_at, deliver_at) or a connection's number may be any
	// number. Otherwise "…" matches anything.
	Strict bool
	// Out receives every frame, as alice ← {…}, and the lines that
	// say a connection closed.
	Out io.Writer
	// Hint, if set, says after a connection's quiet auth was refused
	// with an error of code what usually causes it: " (…)", or "".
	Hint func(code string) string
	// Observe, if set, sees every frame a client sent (fromClient) or
	// received.
	Observe func(client string, fromClient bool, frame []byte)

	mu      sync.Mutex // guards out and every client's frames
	clients map[string]*connection
	line    int // the input line being run, for messages
}

// connection is one named connection.
type connection struct {
	name string
	ws   *websocket.Conn
	// frames are the frames received, in order; matched counts those a
	// ← line has claimed; hidden counts replies the session asked for
	// itself (its auth's, a barrier's pong), not printed.
	frames  [][]byte
	matched int
	hidden  []string
	// authenticated is set once the broker said so: only such a
	// connection may be pinged as a barrier. owed counts the answers
	// still due to frames it sent (a QoS 1 publish's confirm, a
	// subscribe's reply, a pong…), which the end of the input waits for.
	authenticated bool
	owed          int
	// arrived is signalled whenever a frame comes; ended is closed, and
	// code set, when the connection ends.
	arrived chan struct{}
	ended   chan struct{}
	code    websocket.StatusCode
}

// NewSession starts a session against the broker at url.
func NewSession(url string, token func(string) (string, error),
	out io.Writer) *Session {
	return &Session{URL: url, Token: token, Out: out,
		clients: map[string]*connection{}}
}

// Line is one parsed line: a connection, what happens on it, and a
// frame or a close code.
type Line struct {
	Name, Arrow, Body string
}

// ParseLine reads "alice → {…}", or reports what a line must look
// like. ok is false for a blank line or a # comment.
func ParseLine(line string) (Line, bool, error) {
	line = strings.TrimSpace(line)
	if line == "" || strings.HasPrefix(line, "#") {
		return Line{}, false, nil
	}
	arrows := map[string]string{"→": "→", "->": "→", "←": "←", "<-": "←",
		"✕": "✕", "x": "✕"}
	name, rest, _ := strings.Cut(line, " ")
	if arrows[name] != "" {
		// An unnamed line is the one connection "client"'s, whose token
		// is --token's.
		name, rest = "client", line
	}
	arrow, body, _ := strings.Cut(strings.TrimSpace(rest), " ")
	l := Line{Name: name, Arrow: arrows[arrow],
		Body: strings.TrimSpace(body)}
	switch {
	case strings.HasPrefix(line, "{"):
		return l, false, errors.New("a frame needs the name of its " +
			"connection first: alice → {frame}")
	case name == "" || strings.ContainsAny(name, "{}\"") || l.Arrow == "":
		return l, false, fmt.Errorf("after %s comes → (send), ← (the "+
			"frame it gets next) or ✕ (a close), not %q: a line is NAME → "+
			"{frame}, NAME ← {frame}, or NAME ✕ [close code]", name, arrow)
	case l.Arrow == "←" && !json.Valid([]byte(l.Body)):
		// A frame sent may be malformed on purpose: the broker says why.
		return l, false, fmt.Errorf("%s's frame is not JSON: %s", name,
			l.Body)
	}
	return l, true, nil
}

// LineNumber is the number of the line Run ran last, from 1, for the
// caller's messages.
func (s *Session) LineNumber() int { return s.line }

// Run runs one line of input.
func (s *Session) Run(ctx context.Context, text string) error {
	s.line++
	l, ok, err := ParseLine(text)
	if !ok {
		return err
	}
	switch {
	case l.Arrow == "→":
		return s.send(ctx, l.Name, l.Body)
	case l.Arrow == "←":
		return s.expect(ctx, l.Name, l.Body)
	case l.Body == "":
		s.hangUp(l.Name)
		return nil
	}
	return s.expectClose(ctx, l.Name, l.Body)
}

// send writes a frame from name, connecting first if need be.
func (s *Session) send(ctx context.Context, name, body string) error {
	var probe struct{ Type string }
	json.Unmarshal([]byte(body), &probe)
	quiet := probe.Type != "auth" && probe.Type != "login" &&
		!strings.HasPrefix(name, "stranger")
	c, err := s.client(ctx, name, quiet)
	if err != nil {
		return err
	}
	if strings.Contains(body, `"TOKEN"`) {
		token, err := s.Token(name)
		if err != nil {
			return err
		}
		body = strings.ReplaceAll(body, `"TOKEN"`, strconv.Quote(token))
	}
	return s.write(ctx, c, body)
}

// write sends body on c.
func (s *Session) write(ctx context.Context, c *connection,
	body string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The answer is owed before the frame leaves (and before Observe
	// hears of it): a fast broker's answer may arrive before the write
	// returns, and one counted after would find nothing owed, leave the
	// count one too high, and make every later barrier wait five
	// seconds.
	var sent struct {
		Type string
		QoS  int
	}
	json.Unmarshal([]byte(body), &sent)
	owed := 0
	if sent.Type != "publish" && sent.Type != "ack" && sent.Type != "nak" ||
		sent.Type == "publish" && sent.QoS == 1 {
		owed = 1
	}
	s.mu.Lock()
	c.owed += owed
	s.mu.Unlock()
	if s.Observe != nil {
		s.Observe(c.name, true, []byte(body))
	}
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(body)); err != nil {
		s.mu.Lock()
		c.owed = max(c.owed-owed, 0)
		s.mu.Unlock()
		return fmt.Errorf("%s → %s: %w", c.name, body, err)
	}
	return nil
}

// answers are the frames the broker sends in answer to one of a
// client's, not on its own.
var answers = map[string]bool{"published": true, "subscribed": true,
	"unsubscribed": true, "pong": true, "authenticated": true,
	"login_response": true, "error": true}

// client returns the connection called name, opening it if need be, and
// authenticating it quietly when authenticate is set.
func (s *Session) client(ctx context.Context, name string,
	authenticate bool) (*connection, error) {
	if c := s.clients[name]; c != nil {
		return c, nil
	}
	token := ""
	if authenticate {
		var err error
		if token, err = s.Token(name); err != nil {
			return nil, err
		}
	}
	dial, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dial, s.URL, s.Options)
	if err != nil {
		return nil, fmt.Errorf("%s cannot connect to %s: %w", name, s.URL,
			err)
	}
	ws.SetReadLimit(-1)
	c := &connection{name: name, ws: ws, arrived: make(chan struct{}, 1),
		ended: make(chan struct{})}
	s.clients[name] = c
	go s.receive(c)
	if authenticate {
		s.hide(c, "authenticated")
		auth, _ := json.Marshal(map[string]string{"type": "auth",
			"token": token, "client": name})
		if err := s.write(ctx, c, string(auth)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// hide asks that c's next frame of type typ not be printed: the session
// asked for it, not the input.
func (s *Session) hide(c *connection, typ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.hidden = append(c.hidden, typ)
}

// receive prints and keeps every frame c gets, until it ends.
func (s *Session) receive(c *connection) {
	defer close(c.ended)
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.code = websocket.CloseStatus(err)
			return
		}
		if s.Observe != nil {
			s.Observe(c.name, false, data)
		}
		s.mu.Lock()
		typ := frameType(data)
		if typ == "error" && !c.authenticated && len(c.hidden) > 0 &&
			c.hidden[0] == "authenticated" {
			// The quiet auth was refused: say why it usually is.
			c.hidden = c.hidden[1:]
			var refused wire.Received
			json.Unmarshal(data, &refused)
			hint := ""
			if s.Hint != nil {
				hint = s.Hint(refused.Code)
			}
			fmt.Fprintf(s.Out, "# %s's token was refused%s\n", c.name, hint)
		}
		c.authenticated = c.authenticated || typ == "authenticated"
		if answers[typ] && c.owed > 0 {
			c.owed--
		}
		if len(c.hidden) > 0 && typ == c.hidden[0] {
			c.hidden = c.hidden[1:]
		} else {
			c.frames = append(c.frames, data)
			fmt.Fprintf(s.Out, "%s ← %s\n", c.name, data)
		}
		s.mu.Unlock()
		select { // c.arrived holds one signal; one is enough
		case c.arrived <- struct{}{}:
		default:
		}
	}
}

// frameType is a frame's type, or "".
func frameType(data []byte) string {
	var probe struct{ Type string }
	json.Unmarshal(data, &probe)
	return probe.Type
}

// expect waits for name's next frame and compares it with body.
func (s *Session) expect(ctx context.Context, name,
	body string) error {
	c := s.clients[name]
	if c == nil {
		return fmt.Errorf("%s has no connection yet: its first line sends",
			name)
	}
	data, ok := s.next(ctx, c)
	if !ok {
		return fmt.Errorf("%s got nothing in %s; the line shows %s", name,
			waitForFrame, body)
	}
	var want, got any
	json.Unmarshal([]byte(body), &want)
	json.Unmarshal(data, &got)
	if !Match("", want, got, s.Strict) {
		return fmt.Errorf("%s got %s; the line shows %s", name, data, body)
	}
	return nil
}

// next waits for c's next unclaimed frame and claims it.
func (s *Session) next(ctx context.Context, c *connection) ([]byte,
	bool) {
	timeout := time.After(waitForFrame)
	for {
		s.mu.Lock()
		if c.matched < len(c.frames) {
			data := c.frames[c.matched]
			c.matched++
			s.mu.Unlock()
			return data, true
		}
		s.mu.Unlock()
		select {
		case <-c.arrived:
		case <-c.ended:
			// A frame may have come just before the end.
			select {
			case <-c.arrived:
				continue
			default:
				return nil, false
			}
		case <-timeout:
			return nil, false
		case <-ctx.Done():
			return nil, false
		}
	}
}

// expectClose waits for name's connection to end, and compares its
// close code with code.
func (s *Session) expectClose(ctx context.Context, name,
	code string) error {
	// A name met first here is a connection that says nothing.
	c, err := s.client(ctx, name, false)
	if err != nil {
		return err
	}
	select {
	case <-c.ended:
	case <-time.After(waitForFrame):
		return fmt.Errorf("%s is still open after %s; the line shows a "+
			"close with %s", name, waitForFrame, code)
	case <-ctx.Done():
		return ctx.Err()
	}
	delete(s.clients, name)
	s.mu.Lock()
	fmt.Fprintf(s.Out, "%s ✕ %d\n", name, c.code)
	s.mu.Unlock()
	if fmt.Sprint(int(c.code)) != code {
		return fmt.Errorf("%s closed with %d; the line shows %s", name,
			c.code, code)
	}
	return nil
}

// hangUp closes name's connection, normally.
func (s *Session) hangUp(name string) {
	if c := s.clients[name]; c != nil {
		c.ws.Close(websocket.StatusNormalClosure, "")
		delete(s.clients, name)
	}
}

// Barrier waits for the answers every connection is owed, then pings
// every open, authenticated one and waits for each pong: the broker
// answers a connection's frames in order, so whatever was on its way
// came first. It returns the frames no ← line claimed, as lines.
func (s *Session) Barrier(ctx context.Context) []string {
	// Input that ends at once (a pipe) would otherwise end the session
	// before anything arrived: a quiet auth's answer, or a QoS 1
	// publish's confirm, which leaves after the disk's sync, and may come
	// after a pong sent later.
	for _, c := range s.clients {
		s.waitFor(c, func() bool { return c.owed == 0 })
	}
	for _, c := range s.clients {
		// A ping before auth would be refused, and close the connection.
		s.mu.Lock()
		authenticated := c.authenticated
		s.mu.Unlock()
		if authenticated {
			s.hide(c, "pong")
			s.write(ctx, c, `{"type":"ping"}`)
		}
	}
	var unlisted []string
	for _, c := range s.clients {
		s.waitFor(c, func() bool { return len(c.hidden) == 0 })
		s.mu.Lock()
		for _, data := range c.frames[c.matched:] {
			unlisted = append(unlisted, fmt.Sprintf("%s ← %s", c.name, data))
		}
		c.matched = len(c.frames)
		s.mu.Unlock()
	}
	return unlisted
}

// waitFor waits, five seconds at most, until done (called under s.mu)
// reports true for c, or c's connection ends.
func (s *Session) waitFor(c *connection, done func() bool) {
	deadline := time.After(5 * time.Second)
	for {
		s.mu.Lock()
		ok := done()
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.arrived:
		case <-c.ended:
			return
		case <-deadline:
			return
		}
	}
}

// Close closes every connection.
func (s *Session) Close() {
	for name := range s.clients {
		s.hangUp(name)
	}
}

// Match compares decoded JSON, the value of key: "…" in want stands
// for any value, or, when strict, for an id, a token or a subject only;
// when strict a timestamp, a time or a connection's number may be any
// number, as they differ from run to run.
func Match(key string, want, got any, strict bool) bool {
	if w, ok := want.(string); ok && w == "…" {
		return !strict || key == "message_id" || key == "token" ||
			key == "sub"
	}
	switch w := want.(type) {
	case float64:
		_, number := got.(float64)
		return number && (key == "timestamp" || key == "time" ||
			key == "expires_at" || key == "deliver_at" || key == "conn" ||
			w == got)
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for key, value := range w {
			if other, ok := g[key]; !ok || !Match(key, value, other,
				strict) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !Match(key, w[i], g[i], strict) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(want, got)
}
