//go:build js && wasm

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall/js"
	"time"

	"github.com/popsub/popsub/wire"
)

// maxItems is how many deliveries a panel keeps on screen.
const maxItems = 100

// client is one panel of the page: one WebSocket connection, which it
// keeps open by itself, resubscribing where it left off when it comes
// back, until the user disconnects it.
type client struct {
	page  *page
	name  string // also the prefix of the panel's element ids
	tag   string // makes this page's message ids its own
	first []string

	mu      sync.Mutex        // guards the fields below
	sock    *socket           // nil while disconnected
	conn    uint64            // its number in the broker's events
	wanted  bool              // the user wants it connected
	wake    chan struct{}     // wanted became true
	subs    map[string]wish   // filter → how to subscribe again
	lastSeq map[string]uint64 // topic → newest seq received
	asked   map[string]string // filter → what its subscribe asked
	resume  chan struct{}     // non-nil while reading is stopped
	rows    map[rowKey]*row
	order   []rowKey // rows, oldest first
	sent    int      // messages published, for their ids
	resumed bool     // connected before: the next connection resumes
	// refreshing is true while an auth frame with a new token awaits
	// its answer on the open connection.
	refreshing bool
	// answered holds, per topic, a channel closed by the broker's next
	// answer to a subscribe of it: subscribed, or an error.
	answered map[string]chan struct{}
}

// wish is what a subscription asked for beyond its filter, so that a
// new connection asks the same: a durable name, or a group to share the
// topic with.
type wish struct{ durable, group string }

// row is one delivery in a panel's list.
type row struct {
	item, state, attempt, button, nak jsValue
	delivery                          delivery
	shown                             string // what state says now
}

// delivery is any frame the broker sends a panel: the protocol's own
// type.
type delivery = wire.Received

// newClient wires the panel called name, which subscribes to subs as
// soon as it connects.
func newClient(p *page, name string, subs ...string) *client {
	c := &client{page: p, name: name, first: subs, wanted: true,
		wake: make(chan struct{}, 1),
		tag:  strconv.FormatUint(rand.Uint64()%0xffffff, 36)}
	c.forget()
	on(c.id("connect"), "click", c.toggle)
	onSubmit(c.id("sub-form"), func() { go c.subscribe() })
	onSubmit(c.id("pub-form"), func() { go c.publish(1) })
	on(c.id("burst"), "click", func() { go c.publish(100) })
	on(c.id("stop"), "change", c.stopReading)
	on(c.id("acks"), "change", c.acksChanged)
	on(c.id("sub-from"), "change", func() {
		from := value(c.id("sub-from"))
		byID(c.id("sub-n")).Set("hidden", from == "new" || from == "all")
	})
	return c
}

// forget sets the subscriptions back to the first ones and empties the
// list of deliveries. The caller holds c.mu, or c is new.
func (c *client) forget() {
	c.subs, c.lastSeq, c.asked = map[string]wish{}, map[string]uint64{},
		map[string]string{}
	c.answered = map[string]chan struct{}{}
	for _, topic := range c.first {
		c.subs[topic] = wish{}
	}
	c.rows, c.order, c.resumed = map[rowKey]*row{}, nil, false
}

// id is the element id of the panel's part.
func (c *client) id(part string) string {
	return c.name + "-" + part
}

// run keeps the connection open while the user wants it: it waits for
// the page to reach the broker, connects, resubscribes, reads until the
// connection ends, and says why it ended.
func (c *client) run() {
	for {
		c.waitWanted()
		if c.page.tokenRefused() {
			c.sayRefused()
		}
		<-c.page.whenUp()
		if !c.isWanted() {
			continue
		}
		c.status("connecting", "connecting…")
		token := c.page.currentToken()
		s, conn, err := authenticate(c.page.url, token, c.name)
		// The broker refuses with an error frame, then 4001; either may
		// be what the page reads first.
		var refused *refusedError
		var closed *closedError
		switch {
		case errors.As(err, &refused), errors.As(err, &closed) &&
			(closed.info.Code == 4001 || closed.info.Code == 4003):
			c.waitForAnotherToken(token)
			continue
		case err != nil:
			c.status("lost", "not connected: "+err.Error())
			time.Sleep(2 * time.Second)
			continue
		}
		c.attach(s, conn)
		// A token pasted while this connection was being made found no
		// connection to refresh: it goes on this one now.
		if newer := c.page.currentToken(); newer != token {
			c.refresh(newer)
		}
		info := c.readLoop(s)
		c.page.disown(conn)
		if info.Code == 4001 || info.Code == 4003 {
			c.closed(info)
			c.waitForAnotherToken(token)
			continue
		}
		time.Sleep(c.closed(info))
	}
}

// waitForAnotherToken says that the broker refused token, and waits
// until the page has another one: a token the broker refused, or that
// expired, is never sent again.
func (c *client) waitForAnotherToken(token string) {
	c.sayRefused()
	for c.page.currentToken() == token {
		time.Sleep(250 * time.Millisecond)
	}
}

// sayRefused says on the panel that the page's token was refused, and
// what to do.
func (c *client) sayRefused() {
	c.status("refused", "token refused: waiting for a fresh one")
	c.note("The server is up, but refused this page's token: paste a " +
		"fresh one above, or open the newest link popsub serve printed.")
}

// waitWanted blocks until the user wants the connection.
func (c *client) waitWanted() {
	for !c.isWanted() {
		<-c.wake
	}
}

// isWanted reports whether the user wants the connection.
func (c *client) isWanted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wanted
}

// waiting reports whether the user wants the connection and it is not
// open: the client waits for the page, or for a token.
func (c *client) waiting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wanted && c.sock == nil
}

// toggle connects or disconnects, as the user asks.
func (c *client) toggle() {
	c.mu.Lock()
	c.wanted = !c.wanted
	wanted := c.wanted
	c.mu.Unlock()
	if wanted {
		c.wake <- struct{}{}
		return
	}
	go c.drop(1000, "bye")
}

// drop closes the connection, if there is one; run reconnects unless
// the user asked for the close.
func (c *client) drop(code int, reason string) {
	c.mu.Lock()
	s := c.sock
	c.mu.Unlock()
	if s != nil {
		s.close(code, reason)
	}
}

// refresh sends token on the open connection, to replace the one in use
// without reconnecting, and reports whether there was a connection.
func (c *client) refresh(token string) bool {
	c.mu.Lock()
	s := c.sock
	c.refreshing = s != nil
	c.mu.Unlock()
	sent := s != nil && s.send(map[string]any{"type": "auth",
		"token": token, "client": c.name}) == nil
	if !sent {
		c.mu.Lock()
		c.refreshing = false
		c.mu.Unlock()
	}
	return sent
}

// refreshed handles the answer to a refresh: authenticated, or refused,
// and then the panel reconnects with the new token, as a new identity.
func (c *client) refreshed(d delivery) bool {
	c.mu.Lock()
	was := c.refreshing
	c.refreshing = false
	c.mu.Unlock()
	switch {
	case !was:
		return false
	case d.Type == "authenticated":
		c.note("the new token replaced the old one in place: its grants " +
			"apply now, on the same connection")
	default:
		c.note("the broker kept this connection's token (" + d.Message +
			"): reconnecting with the new one")
		c.status("connecting", "connecting with the new token…")
		c.drop(4000, "token changed")
	}
	return true
}

// reset starts the client over as the page loaded it: connected, acking
// automatically, reading, subscribed to its first topics from now on.
func (c *client) reset() {
	setValue(c.id("acks"), "auto")
	c.page.withhold(c.name, false)
	byID(c.id("stop")).Set("checked", false)
	c.stopReading()
	replace(byID(c.id("messages")))
	replace(byID(c.id("subs")))
	c.note("")
	c.status("connecting", "starting over…")
	c.mu.Lock()
	c.forget()
	wasWanted := c.wanted
	c.wanted = true
	c.mu.Unlock()
	if !wasWanted {
		c.wake <- struct{}{}
	}
	c.drop(4000, "starting over")
}

// attach takes a new connection: the story learns its number, and the
// client subscribes again to what it had, each topic after the newest
// seq it received, so a reconnection neither misses nor repeats.
func (c *client) attach(s *socket, conn uint64) {
	c.page.own(conn, c.name)
	c.mu.Lock()
	c.sock, c.conn = s, conn
	var frames []map[string]any
	var resumed []string
	for filter, w := range c.subs {
		frame := map[string]any{"type": "subscribe", "topic": filter}
		seq := c.lastSeq[filter]
		switch {
		case w.group != "":
			// The group's cursor, not this panel's seq, says where the
			// group goes on.
			frame["group"] = w.group
			c.asked[filter] = "rejoining group " + w.group
		case w.durable != "":
			frame["durable"] = w.durable
			c.asked[filter] = "resuming durable " + w.durable
		case seq > 0:
			frame["after"] = seq
			c.asked[filter] = fmt.Sprintf("resuming after #%d", seq)
		case !strings.ContainsAny(filter, "+#"):
			frame["last"] = 0
			c.asked[filter] = "new messages only"
		}
		resumed = append(resumed, filter)
		frames = append(frames, frame)
	}
	again := c.resumed
	c.resumed = true
	c.mu.Unlock()
	c.status("connected", fmt.Sprintf("connected (#%d)", conn))
	setText(c.id("connect"), "disconnect")
	if again && len(resumed) > 0 {
		c.note("reconnected by itself; subscribed again to " +
			strings.Join(resumed, ", "))
	}
	for _, frame := range frames {
		s.send(frame)
	}
}

// readLoop handles frames until the connection ends, and says how it
// ended. While reading is stopped, a frame that arrived waits, unread
// and unacked, with those behind it.
func (c *client) readLoop(s *socket) closeInfo {
	for {
		data, ended := s.read()
		if ended != nil {
			return *ended
		}
		c.waitWhileStopped()
		var d delivery
		if json.Unmarshal(data, &d) == nil {
			c.handle(d)
		}
	}
}

// closed shows why the connection ended, and returns how long to wait
// before connecting again.
func (c *client) closed(info closeInfo) time.Duration {
	c.mu.Lock()
	c.sock, c.conn = nil, 0
	wanted := c.wanted
	c.mu.Unlock()
	replace(byID(c.id("subs")))
	byID(c.name).Call("setAttribute", "data-last-close",
		strconv.Itoa(info.Code))
	if !wanted {
		setText(c.id("connect"), "connect")
		c.status("disconnected", "disconnected")
		return 0
	}
	switch info.Code {
	case 4008:
		c.status("cut-off", "cut off (4008)")
		c.note("Cut off as a slow consumer (4008: " + info.Reason + "). " +
			"Reconnecting, and resuming after the last message it read.")
		return time.Second
	case 1001:
		c.status("going-away", "server going away (1001)")
		c.note("The server is shutting down; this client reconnects " +
			"and resumes when it is back.")
	case 4000:
		c.status("connecting", "reconnecting…")
	case 4001, 4003:
		c.status("refused", fmt.Sprintf("token refused (%d)", info.Code))
		return 2 * time.Second
	default:
		c.status("lost", fmt.Sprintf("connection lost (%d)", info.Code))
		return time.Second
	}
	return 0
}

// handle shows one frame from the broker.
func (c *client) handle(d delivery) {
	if (d.Type == "authenticated" || d.Code == "auth_failed") &&
		c.refreshed(d) {
		return
	}
	switch d.Type {
	case "message":
		c.showMessage(d)
	case "subscribed":
		c.showSubscription(d)
		c.answer(d.Topic)
	case "unsubscribed":
		c.hideSubscription(d.Topic)
		if d.Reason != "" {
			c.note(d.Topic + ": " + d.Reason)
		}
	case "published":
		c.note(fmt.Sprintf("published %s #%d: it is on disk%s", d.Topic,
			d.Seq, map[bool]string{true: " (a duplicate: already " +
				"there)"}[d.Duplicate]))
	case "error":
		c.note("error " + d.Code + ": " + d.Message)
		c.answer(d.Topic)
	}
}

// showMessage adds a delivery to the panel, or updates its row when it
// is a retry, and acks it at once when acks are automatic.
func (c *client) showMessage(d delivery) {
	c.mu.Lock()
	c.lastSeq[d.Topic] = max(c.lastSeq[d.Topic], d.Seq)
	key := rowKey{c.name, d.Topic, d.MessageID}
	r := c.rows[key]
	if r == nil {
		r = c.newRow(key, d)
	}
	r.delivery = d
	c.mu.Unlock()
	r.attempt.Set("textContent", fmt.Sprintf("attempt %d", d.Attempt))
	r.item.Call("setAttribute", "data-attempt", strconv.Itoa(d.Attempt))
	if d.QoS == 1 && value(c.id("acks")) == "auto" {
		if delay := testAckDelay(c.name); delay > 0 {
			time.AfterFunc(delay, func() { c.ack(d) })
			return
		}
		c.ack(d)
	}
}

// newRow makes the row of a delivery, newest first, and drops the oldest
// beyond maxItems. The caller holds c.mu.
func (c *client) newRow(key rowKey, d delivery) *row {
	r := &row{item: element("li", "", "message"),
		state:   element("span", "", "state"),
		attempt: element("span", "", "attempt")}
	r.item.Call("setAttribute", "data-topic", d.Topic)
	r.item.Call("setAttribute", "data-seq", strconv.FormatUint(d.Seq, 10))
	r.item.Call("setAttribute", "data-message-id", d.MessageID)
	r.item.Call("append", element("span", fmt.Sprintf("%s #%d %s",
		d.Topic, d.Seq, clip(string(d.Payload), 40)), "what"))
	r.item.Call("append", r.attempt, r.state)
	if d.QoS == 1 {
		r.button = element("button", "ack", "ack")
		r.button.Set("type", "button")
		onElement(r.button, "click", func() { go c.ack(r.delivery) })
		// A nak hands it back: retried after the backoff, an attempt.
		r.nak = element("button", "nak", "nak")
		r.nak.Set("type", "button")
		r.nak.Set("title", "hand it back: the broker retries it after "+
			"the backoff, as the next attempt")
		onElement(r.nak, "click", func() { go c.nak(r.delivery) })
		r.item.Call("append", r.button, r.nak)
	}
	byID(c.id("messages")).Call("prepend", r.item)
	c.rows[key] = r
	c.order = append(c.order, key)
	if len(c.order) > maxItems {
		old := c.rows[c.order[0]]
		old.item.Call("remove")
		delete(c.rows, c.order[0])
		c.order = c.order[1:]
	}
	return r
}

// ack sends an ack for d, and tells the story it was sent.
func (c *client) ack(d delivery) {
	if c.send(map[string]any{"type": "ack", "topic": d.Topic,
		"message_id": d.MessageID}) {
		c.page.ackSent(c.name, d.Topic, d.MessageID)
	}
}

// nak hands d back: the broker retries it after the backoff.
func (c *client) nak(d delivery) {
	c.send(map[string]any{"type": "nak", "topic": d.Topic,
		"message_id": d.MessageID})
}

// renderRows shows each row's state as the broker's events tell it. The
// caller holds the page's lock, and passes its story.
func (c *client) renderRows(s *story) {
	c.mu.Lock()
	defer c.mu.Unlock()
	withheld := value(c.id("acks")) == "withhold"
	for key, r := range c.rows {
		st, known := s.state(key)
		if !known || r.delivery.QoS == 0 {
			st = rowState{State: statePending}
			if r.delivery.QoS == 0 {
				st.State = stateReceived
			}
		}
		owed := st.State == statePending || st.State == stateRetried
		if r.button.Truthy() {
			r.button.Set("disabled", !owed || withheld || st.AckSent)
			r.button.Set("title", map[bool]string{true: "acks are " +
				"withheld: choose “by hand” to ack"}[withheld])
			r.nak.Set("disabled", !owed || withheld || st.AckSent)
		}
		if text := st.State; text != r.shown {
			r.shown = text
			r.state.Set("textContent", text)
			r.item.Call("setAttribute", "data-state",
				strings.ReplaceAll(text, " ", "-"))
		}
	}
	if sock := c.sock; sock != nil && c.resume != nil {
		c.note(fmt.Sprintf("reading stopped: %d frames wait in the "+
			"browser, unread and unacked", sock.waiting()+1))
	}
}

// subscribe sends a subscribe frame from the panel's form, and remembers
// it for the next connection. The channel it returns closes when the
// broker answers, or at once if nothing was sent.
func (c *client) subscribe() <-chan struct{} {
	topic := value(c.id("sub-topic"))
	frame := map[string]any{"type": "subscribe", "topic": topic}
	n, err := strconv.ParseUint(value(c.id("sub-n")), 10, 64)
	from := value(c.id("sub-from"))
	asked := "new messages only"
	switch {
	case from == "new" && strings.ContainsAny(topic, "+#"):
		asked = "live only: a wildcard does not replay"
	case from == "new":
		frame["last"] = 0
	case from == "all":
		asked = "replaying everything retained"
	case err != nil:
		c.note("give n, a number, for " + from)
		return closed()
	case from == "last":
		frame["last"], asked = n, fmt.Sprintf("replaying the last %d", n)
	default:
		frame["after"], asked = n, fmt.Sprintf("replaying after #%d", n)
	}
	w := wish{durable: value(c.id("sub-durable")),
		group: value(c.id("sub-group"))}
	if w.durable != "" {
		frame["durable"] = w.durable
		asked += ", or resuming durable " + w.durable
	}
	if w.group != "" {
		// Where to start matters only to a group's first member.
		frame["group"] = w.group
		asked = "one of group " + w.group + "; " + asked + ", if first"
	}
	answer := make(chan struct{})
	c.mu.Lock()
	c.subs[topic], c.asked[topic] = w, asked
	if old := c.answered[topic]; old != nil {
		close(old)
	}
	c.answered[topic] = answer
	c.mu.Unlock()
	if !c.send(frame) {
		c.answer(topic)
	}
	return answer
}

// answer closes the channel that waits for the broker's answer to a
// subscribe of topic, if one does.
func (c *client) answer(topic string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch := c.answered[topic]; ch != nil {
		close(ch)
		delete(c.answered, topic)
	}
}

// closed returns a closed channel: an answer that came at once.
func closed() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// publish sends count publish frames from the panel's form. Each message
// gets an id of this page's, so that the diagram can draw it from this
// panel's lane and the broker's dedup never mistakes one for another's.
func (c *client) publish(count int) {
	qos, _ := strconv.Atoi(value(c.id("pub-qos")))
	payload := json.RawMessage(value(c.id("pub-payload")))
	if !json.Valid(payload) {
		payload, _ = json.Marshal(string(payload))
	}
	for i := range count {
		c.mu.Lock()
		c.sent++
		id := fmt.Sprintf("%s-%s-%d", c.name, c.tag, c.sent)
		c.mu.Unlock()
		c.page.wrote(id, c.name)
		frame := map[string]any{"type": "publish", "message_id": id,
			"topic": value(c.id("pub-topic")), "payload": payload,
			"qos": qos}
		if count > 1 {
			frame["payload"] = map[string]any{"burst": i + 1}
		}
		if !c.send(frame) {
			return
		}
	}
}

// send writes one frame, or says why it could not.
func (c *client) send(frame map[string]any) bool {
	c.mu.Lock()
	s := c.sock
	c.mu.Unlock()
	if s == nil {
		c.note("not connected yet")
		return false
	}
	if err := s.send(frame); err != nil {
		c.note("send failed: " + err.Error())
		return false
	}
	return true
}

// acksChanged tells the story whether the panel now withholds its acks,
// and says what the chosen way of acking does.
func (c *client) acksChanged() {
	c.page.withhold(c.name, value(c.id("acks")) == "withhold")
	c.explainAcks()
}

// explainAcks says what the chosen way of acking does.
func (c *client) explainAcks() {
	switch value(c.id("acks")) {
	case "withhold":
		c.note("Acks withheld: each QoS 1 delivery stays pending, and " +
			"the broker retries it after the ack timeout.")
	case "hand":
		c.note("Ack each delivery with its button, or nak it to hand it " +
			"back: it comes again after the backoff.")
	default:
		c.note("")
	}
}

// stopReading pauses or resumes the read loop. In a browser this does
// not push back on the broker (the browser keeps reading the socket and
// buffers for us); what the broker sees is a client that stops acking.
func (c *client) stopReading() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if checked(c.id("stop")) && c.resume == nil {
		c.resume = make(chan struct{})
	} else if !checked(c.id("stop")) && c.resume != nil {
		close(c.resume)
		c.resume = nil
		setText(c.id("note"), "")
	}
}

// waitWhileStopped blocks while reading is stopped.
func (c *client) waitWhileStopped() {
	c.mu.Lock()
	resume := c.resume
	c.mu.Unlock()
	if resume != nil {
		<-resume
	}
}

// showSubscription lists a subscription with an unsubscribe button, and
// announces what it replays.
func (c *client) showSubscription(d delivery) {
	c.hideSubscription(d.Topic)
	c.mu.Lock()
	asked := c.asked[d.Topic]
	c.mu.Unlock()
	text := fmt.Sprintf("%s (head #%d; %s", d.Topic, d.Seq, asked)
	if strings.ContainsAny(d.Topic, "+#") {
		text = d.Topic + " (live only"
	}
	if d.Recovered != nil && !*d.Recovered {
		text += "; some of it is no longer retained"
	}
	item := element("li", text+") ", "subscription")
	item.Call("setAttribute", "data-topic", d.Topic)
	button := element("button", "unsubscribe", "")
	button.Set("type", "button")
	onElement(button, "click", func() {
		c.mu.Lock()
		delete(c.subs, d.Topic)
		c.mu.Unlock()
		go c.send(map[string]any{"type": "unsubscribe", "topic": d.Topic})
	})
	item.Call("append", button)
	byID(c.id("subs")).Call("append", item)
}

// hideSubscription removes topic from the list.
func (c *client) hideSubscription(topic string) {
	items := byID(c.id("subs")).Get("children")
	for i := items.Get("length").Int() - 1; i >= 0; i-- {
		item := items.Index(i)
		if item.Call("getAttribute", "data-topic").String() == topic {
			item.Call("remove")
		}
	}
}

// status sets the panel's connection status: state names it for tests
// and styles, text says it.
func (c *client) status(state, text string) {
	el := byID(c.id("status"))
	el.Set("textContent", text)
	el.Set("className", "status "+state)
	el.Call("setAttribute", "data-state", state)
}

// note shows the panel's latest notice.
func (c *client) note(text string) {
	setText(c.id("note"), text)
}

// clip shortens s to n characters for display.
func clip(s string, n int) string {
	runes := []rune(s)
	if len(runes) <= n {
		return s
	}
	return string(runes[:n]) + "…"
}

// testAckDelay is how long the browser tests ask a panel's automatic ack
// to wait, through window.popsubAckDelay = {alice: 1500} (milliseconds):
// they make the race between two panels' acks happen on purpose. A page
// that sets nothing acks at once.
func testAckDelay(panel string) time.Duration {
	delays := js.Global().Get("popsubAckDelay")
	if delays.Type() != js.TypeObject {
		return 0
	}
	ms := delays.Get(panel)
	if ms.Type() != js.TypeNumber {
		return 0
	}
	return time.Duration(ms.Float()) * time.Millisecond
}
