//go:build js && wasm

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/popsub/popsub/wire"
	"sync"
	"sync/atomic"
	"time"
)

// page is the whole playground: its clients, the x-ray connection that
// watches the broker, and the models both feed.
type page struct {
	url     string // the broker's WebSocket URL
	clients []*client
	// groupRuns counts the guided runs' work-queue steps, for a group
	// name of each run's own.
	groupRuns atomic.Int64
	// refused is set while the server refuses the page's token, until
	// the x-ray is up again; guarded by mu.
	refused bool

	mu        sync.Mutex // guards the fields below
	token     string     // used by every connection the page opens
	xray      *xray
	story     *story
	dirty     bool          // the models changed since the last render
	watcher   uint64        // the x-ray connection's number, 0 while down
	monitor   *socket       // the x-ray connection, nil while down
	up        chan struct{} // closed while the x-ray connection is open
	isUp      bool
	retry     chan struct{} // the token changed: try again now
	goneAway  bool          // the server said 1001 and is not back yet
	replaying time.Time     // when a replay of the diagram began
	// showing is when a step's button asked for the diagram: on a phone
	// it is kept in view for a moment, as rows above it grow.
	showing time.Time
}

// errNoToken is a page opened without #token=… and with no token pasted.
var errNoToken = errors.New("no token")

// currentToken is the token connections use.
func (p *page) currentToken() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.token
}

// setToken takes a new token: the x-ray tries again at once, and every
// client reconnects with it.
func (p *page) setToken(token string) {
	p.mu.Lock()
	changed := token != p.token
	p.token = token
	monitor := p.monitor
	p.mu.Unlock()
	if !changed {
		return
	}
	if monitor != nil {
		monitor.close(4000, "token changed")
	}
	select {
	case p.retry <- struct{}{}:
	default:
	}
	// Each connected panel replaces its token in place, keeping its
	// connection and subscriptions; one the broker refuses it for
	// (another user's token) reconnects with it instead (c.handle).
	for _, c := range p.clients {
		if !c.refresh(token) && c.isWanted() {
			c.status("connecting", "connecting with the new token…")
		}
	}
}

// whenUp returns a channel that is closed while the broker is reachable
// and the token works. Clients wait on it before they dial, so that only
// the x-ray knocks on a server that is down.
func (p *page) whenUp() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

// watch keeps the x-ray connection open, and says in the banner, each
// time it ends, why and what happens next.
func (p *page) watch() {
	delay := time.Second
	for {
		started := time.Now()
		err := p.watchOnce()
		p.setDown()
		if time.Since(started) > 10*time.Second {
			delay = time.Second
		}
		if !p.explain(err, delay) {
			<-p.retry // a token the broker refused stays refused
			continue
		}
		select {
		case <-time.After(delay):
		case <-p.retry:
		}
		delay = min(2*delay, 16*time.Second)
	}
}

// watchOnce runs one x-ray connection until it ends.
func (p *page) watchOnce() error {
	token := p.currentToken()
	if token == "" {
		return errNoToken
	}
	s, conn, err := authenticate(p.url, token, "x-ray")
	if err != nil {
		return err
	}
	defer s.close(1000, "")
	err = s.send(map[string]any{"type": "subscribe",
		"topic": "$sys/events", "last": 0})
	if err != nil {
		return err
	}
	p.setUp(s, conn)
	for {
		data, ended := s.read()
		if ended != nil {
			return &closedError{*ended}
		}
		for _, frame := range p.handleFrame(data) {
			s.send(frame)
		}
	}
}

// setUp marks the broker reachable and lets the clients dial.
func (p *page) setUp(s *socket, conn uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.monitor, p.watcher, p.isUp, p.goneAway = s, conn, true, false
	p.refused = false
	close(p.up)
	banner("up", "Connected to "+p.url+". The clients connect and "+
		"reconnect by themselves.")
}

// setDown marks the broker unreachable: clients wait until it is back.
func (p *page) setDown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isUp {
		p.up, p.isUp = make(chan struct{}), false
	}
	p.monitor, p.watcher = nil, 0
	p.xray.forgetDeadTopics()
}

// explain says in the banner why the x-ray connection ended, and reports
// whether trying again later can help.
func (p *page) explain(err error, delay time.Duration) bool {
	var refused *refusedError
	var closed *closedError
	switch {
	case errors.Is(err, errNoToken):
		p.explainNoToken()
		return false
	case errors.As(err, &refused) || (errors.As(err, &closed) &&
		closed.info.Code == 4001):
		banner("refused", "The server refused this page's token ("+
			err.Error()+"). A server started without --secret makes a "+
			"new secret each time: open the newest link popsub serve "+
			"printed (it ends in #token=…), or paste a fresh token.")
		// The clients wait for the page, which waits for a token: say
		// so on their panels, not what they said before the refusal,
		// and on those that start waiting later (client.run).
		p.mu.Lock()
		p.refused = true
		p.mu.Unlock()
		for _, c := range p.clients {
			if c.waiting() {
				c.sayRefused()
			}
		}
		return false
	case errors.As(err, &closed) && closed.info.Code == 4000:
		banner("loading", "Reconnecting with the new token…")
	case errors.As(err, &closed) && closed.info.Code == 1001:
		p.mu.Lock()
		p.goneAway = true
		p.mu.Unlock()
		banner("going-away", "The server is shutting down (close 1001, "+
			"going away). The page reconnects when it is back.")
	case p.wentAway():
		banner("going-away", fmt.Sprintf("The server shut down (1001) "+
			"and is not back at %s yet. Trying again in %s.", p.url, delay))
	case errors.Is(err, errUnreachable):
		banner("unreachable", fmt.Sprintf("Cannot reach the server at %s. "+
			"Is popsub serve running? Trying again in %s.", p.url, delay))
	default:
		banner("lost", fmt.Sprintf("The connection to the server was "+
			"lost (%v). Reconnecting in %s.", err, delay))
	}
	return true
}

// tokenRefused reports whether the server refuses the page's token now.
func (p *page) tokenRefused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// wentAway reports whether the server said 1001 and has not been back.
func (p *page) wentAway() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.goneAway
}

// explainNoToken tells a page without a token what to do, after checking
// whether the server is there at all.
func (p *page) explainNoToken() {
	s, err := open(p.url)
	if err != nil {
		banner("no-token", "This page has no token, and there is no "+
			"server at "+p.url+": start one with go run ./cmd/popsub "+
			"serve, and open the link it prints.")
		return
	}
	go s.release()
	s.close(1000, "")
	banner("no-token", "The server is up, but this page has no token: "+
		"open the link popsub serve printed (it ends in #token=…), or "+
		"paste a token under “token” above.")
}

// banner sets the page's connection banner; state names it for tests.
func banner(state, text string) {
	el := byID("banner")
	el.Set("textContent", text)
	el.Set("className", "banner "+state)
	el.Call("setAttribute", "data-state", state)
	// A page that needs a token shows where to paste it.
	if state == "no-token" || state == "refused" {
		byID("token-form").Get("parentElement").Set("open", true)
	}
}

// noGrant is what the banner says for a token that may not watch the
// broker's events: without them the diagram, the x-ray and the guide
// have nothing to show, and a silent page would look broken.
const noGrant = "This token may not subscribe to $sys/events, so the " +
	"diagram, the x-ray and the guided run stay empty; the clients still " +
	"work. The playground needs a token with the grants $sys/# and " +
	"$dead/# besides #: the link popsub serve prints has one, or make " +
	"one with go run ./cmd/popsub token --sub NAME --subscribe " +
	"'#,$sys/#,$dead/#' (with the broker's secret in POPSUB_SECRET) and " +
	"paste it under token."

// handleFrame folds one frame of the x-ray connection into the models,
// and returns the frames the x-ray sends back: acks of dead letters, and
// subscriptions to dead-letter topics it has just learned of.
func (p *page) handleFrame(data []byte) []any {
	var frame wire.Received
	if json.Unmarshal(data, &frame) != nil {
		return nil
	}
	if frame.Type == "error" && frame.Code == "forbidden" &&
		frame.Topic == "$sys/events" {
		banner("no-grant", noGrant)
		return nil
	}
	if frame.Type != "message" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dirty = true
	if frame.Topic != "$sys/events" {
		p.xray.addDead(frame.Topic, frame.Seq, frame.Payload)
		return []any{map[string]any{"type": "ack", "topic": frame.Topic,
			"message_id": frame.MessageID}}
	}
	var e event
	if json.Unmarshal(frame.Payload, &e) != nil {
		return nil
	}
	p.xray.apply(e)
	p.story.apply(e)
	var out []any
	for _, topic := range p.xray.unreadDeadTopics() {
		out = append(out, map[string]any{"type": "subscribe",
			"topic": topic, "last": maxDead})
	}
	return out
}

// own, disown, wrote and ackSent pass what a client knows on to the
// story, under the page's lock.
func (p *page) own(conn uint64, panel string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.story.own(conn, panel)
}

// disown forgets a closed connection's panel.
func (p *page) disown(conn uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.story.disown(conn)
}

// wrote records a panel's publish.
func (p *page) wrote(id, panel string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.story.wrote(id, panel)
}

// withhold records whether a panel withholds its acks.
func (p *page) withhold(panel string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.story.withhold(panel, on)
}

// ackSent records a panel's ack.
func (p *page) ackSent(panel, topic, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.story.ackSent(panel, topic, id)
	p.dirty = true
}

// startOver runs the guided run again from its first step: the story
// is forgotten, and each client reconnects as it was when the page
// loaded (which drops what the broker still holds for it).
func (p *page) startOver() {
	p.mu.Lock()
	p.story.restart()
	p.dirty = true
	p.mu.Unlock()
	for _, c := range p.clients {
		c.reset()
	}
}

// replay draws the diagram again, one step at a time.
func (p *page) replay() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replaying = time.Now()
	p.dirty = true
}

// renderLoop redraws a few times a second: often enough for retry
// deadlines to count down, rarely enough that a burst of events costs
// one redraw.
func (p *page) renderLoop() {
	for range time.Tick(250 * time.Millisecond) {
		p.render()
	}
}

// render redraws what changed: the tables, the diagram, the guide and
// the clients' rows.
func (p *page) render() {
	p.mu.Lock()
	defer p.mu.Unlock()
	replaying := !p.replaying.IsZero()
	if !p.dirty && len(p.xray.pending) == 0 && !replaying {
		return
	}
	p.dirty = false
	renderTables(p.xray, p.watcher)
	shown := len(p.story.steps)
	if replaying {
		shown = int(time.Since(p.replaying) / replayStep)
		if shown >= len(p.story.steps) {
			p.replaying, shown = time.Time{}, len(p.story.steps)
		}
	}
	renderDiagram(p.story.steps[:shown], replaying)
	renderGuide(p.story.progress, p.xray, p.story)
	for _, c := range p.clients {
		c.renderRows(p.story)
	}
	if time.Since(p.showing) < time.Second {
		showPicture()
	}
}

// keepPictureInView asks the renders of the next second to keep the
// diagram in view.
func (p *page) keepPictureInView() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.showing, p.dirty = time.Now(), true
}
