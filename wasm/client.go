//go:build js && wasm

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// maxItems is how many received messages a panel keeps on screen.
const maxItems = 100

// client is one panel of the page: one WebSocket connection.
type client struct {
	page *page
	name string // also the prefix of the panel's element ids

	mu     sync.Mutex      // guards the fields below
	conn   *websocket.Conn // nil while disconnected
	resume chan struct{}   // non-nil while reading is stopped
}

// delivery is what a panel reads of a message frame.
type delivery struct {
	Type      string          `json:"type"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	MessageID string          `json:"message_id"`
	QoS       int             `json:"qos"`
	Seq       uint64          `json:"seq"`
	Attempt   int             `json:"attempt"`
	Code      string          `json:"code"`
	Message   string          `json:"message"`
	Duplicate bool            `json:"duplicate"`
	Reason    string          `json:"reason"`
}

// newClient wires the panel called name.
func newClient(p *page, name string) *client {
	c := &client{page: p, name: name}
	on(c.id("connect"), "click", func() { go c.connect() })
	on(c.id("disconnect"), "click", func() { go c.disconnect() })
	on(c.id("subscribe"), "click", func() { go c.subscribe() })
	on(c.id("publish"), "click", func() { go c.publish(1) })
	on(c.id("burst"), "click", func() { go c.publish(100) })
	on(c.id("stop"), "change", c.stopReading)
	return c
}

// id is the element id of the panel's part.
func (c *client) id(part string) string {
	return c.name + "-" + part
}

// connect opens the panel's connection and starts reading.
func (c *client) connect() {
	c.mu.Lock()
	if c.conn != nil {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.status("connecting…", "status")
	conn, err := dial(context.Background(), c.page.url, c.page.token, c.name)
	if err != nil {
		c.status(err.Error(), "status bad")
		return
	}
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	c.status("connected", "status good")
	go c.readLoop(conn)
}

// disconnect closes the connection normally.
func (c *client) disconnect() {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		conn.Close(websocket.StatusNormalClosure, "bye")
	}
}

// readLoop handles frames until the connection ends.
func (c *client) readLoop(conn *websocket.Conn) {
	for {
		c.waitWhileStopped()
		_, data, err := conn.Read(context.Background())
		if err != nil {
			c.closed(err)
			return
		}
		var d delivery
		if json.Unmarshal(data, &d) == nil {
			c.handle(d)
		}
	}
}

// closed shows why the connection ended: 4008 and 1001 deserve words.
func (c *client) closed(err error) {
	c.mu.Lock()
	c.conn = nil
	c.mu.Unlock()
	replace(byID(c.id("subs")))
	code := websocket.CloseStatus(err)
	switch {
	case code == 4008:
		c.status("cut off: slow consumer (4008)", "status bad")
	case code == 1001:
		c.status("server shutting down (1001)", "status bad")
	case code == websocket.StatusNormalClosure:
		c.status("disconnected", "status")
	case code > 0:
		c.status(fmt.Sprintf("closed (%d)", code), "status bad")
	default:
		c.status("connection lost", "status bad")
	}
}

// handle shows one frame from the broker.
func (c *client) handle(d delivery) {
	switch d.Type {
	case "message":
		c.showMessage(d)
	case "subscribed":
		c.showSubscription(d.Topic)
	case "unsubscribed":
		c.hideSubscription(d.Topic)
		if d.Reason != "" {
			c.note(d.Topic + ": " + d.Reason)
		}
	case "published":
		c.note(fmt.Sprintf("published %s #%d%s", d.Topic, d.Seq,
			map[bool]string{true: " (duplicate)"}[d.Duplicate]))
	case "error":
		c.note("error " + d.Code + ": " + d.Message)
	}
}

// showMessage adds a received message to the panel, and acks it at once
// if auto-ack is on and acks are not withheld.
func (c *client) showMessage(d delivery) {
	text := fmt.Sprintf("%s #%d · attempt %d · qos %d · %s", d.Topic,
		d.Seq, d.Attempt, d.QoS, clip(string(d.Payload), 60))
	item := element("li", text, "message")
	item.Call("setAttribute", "data-topic", d.Topic)
	item.Call("setAttribute", "data-seq", strconv.FormatUint(d.Seq, 10))
	item.Call("setAttribute", "data-attempt", strconv.Itoa(d.Attempt))
	item.Call("setAttribute", "data-message-id", d.MessageID)
	if d.QoS == 1 {
		c.addAckButton(item, d)
	}
	list := byID(c.id("messages"))
	list.Call("prepend", item)
	for list.Get("children").Get("length").Int() > maxItems {
		list.Get("lastElementChild").Call("remove")
	}
}

// addAckButton gives a QoS 1 message its ack button, or acks it now.
func (c *client) addAckButton(item jsValue, d delivery) {
	if checked(c.id("autoack")) && !checked(c.id("withhold")) {
		go c.ack(d)
		item.Set("className", "message acked")
		return
	}
	button := element("button", "ack", "ack")
	onElement(button, "click", func() {
		if checked(c.id("withhold")) {
			c.note("acks are withheld: untick “withhold acks” first")
			return
		}
		button.Set("disabled", true)
		item.Set("className", "message acked")
		go c.ack(d)
	})
	item.Call("append", button)
}

// ack sends an ack for d.
func (c *client) ack(d delivery) {
	c.send(map[string]any{"type": "ack", "topic": d.Topic,
		"message_id": d.MessageID})
}

// subscribe sends a subscribe frame from the panel's form.
func (c *client) subscribe() {
	frame := map[string]any{"type": "subscribe",
		"topic": value(c.id("sub-topic"))}
	for _, option := range []string{"after", "last"} {
		if n, err := strconv.ParseUint(value(c.id("sub-"+option)), 10,
			64); err == nil {
			frame[option] = n
		}
	}
	if durable := value(c.id("sub-durable")); durable != "" {
		frame["durable"] = durable
	}
	c.send(frame)
}

// publish sends count publish frames from the panel's form.
func (c *client) publish(count int) {
	qos, _ := strconv.Atoi(value(c.id("pub-qos")))
	payload := json.RawMessage(value(c.id("pub-payload")))
	if !json.Valid(payload) {
		payload, _ = json.Marshal(string(payload))
	}
	for i := range count {
		frame := map[string]any{"type": "publish",
			"topic": value(c.id("pub-topic")), "payload": payload,
			"qos": qos}
		if id := value(c.id("pub-id")); id != "" && count == 1 {
			frame["message_id"] = id
		}
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
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		c.note("not connected: press connect first")
		return false
	}
	if err := writeJSON(context.Background(), conn, frame); err != nil {
		c.note("send failed: " + err.Error())
		return false
	}
	return true
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

// showSubscription lists topic with an unsubscribe button.
func (c *client) showSubscription(topic string) {
	c.hideSubscription(topic)
	item := element("li", topic+" ", "subscription")
	item.Call("setAttribute", "data-topic", topic)
	button := element("button", "unsubscribe", "")
	onElement(button, "click", func() {
		go c.send(map[string]any{"type": "unsubscribe", "topic": topic})
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

// status sets the panel's connection status.
func (c *client) status(text, class string) {
	setText(c.id("status"), text)
	setClass(c.id("status"), class)
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
