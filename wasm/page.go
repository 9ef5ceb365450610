//go:build js && wasm

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// page is the whole playground: its clients and the x-ray.
type page struct {
	url   string // the broker's WebSocket URL
	token string // used by every connection the page opens

	clients []*client

	mu    sync.Mutex // guards xray and dirty
	xray  *xray
	dirty bool // the x-ray changed since the last render
}

// watch keeps the x-ray connection open: it subscribes to $sys/events,
// folds each event into the model, and when the server goes away it says
// so and tries again every second.
func (p *page) watch() {
	for {
		err := p.watchOnce()
		setText("banner", "The server is gone ("+err.Error()+
			"). Reconnecting…")
		setClass("banner", "banner down")
		time.Sleep(time.Second)
	}
}

// watchOnce runs one x-ray connection until it fails.
func (p *page) watchOnce() error {
	ctx := context.Background()
	conn, err := dial(ctx, p.url, p.token, "x-ray")
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	err = writeJSON(ctx, conn, map[string]any{"type": "subscribe",
		"topic": "$sys/events", "last": 0})
	if err != nil {
		return err
	}
	setText("banner", "Connected to "+p.url)
	setClass("banner", "banner up")
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		p.handleEvent(data)
	}
}

// handleEvent folds one frame of the x-ray connection into the model.
func (p *page) handleEvent(data []byte) {
	var frame struct {
		Type    string          `json:"type"`
		Message string          `json:"message"`
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(data, &frame) != nil {
		return
	}
	if frame.Type == "error" {
		setText("banner", "x-ray: "+frame.Message)
		setClass("banner", "banner down")
		return
	}
	var e event
	if frame.Type != "message" || json.Unmarshal(frame.Payload, &e) != nil {
		return
	}
	p.mu.Lock()
	p.xray.apply(e)
	p.dirty = true
	p.mu.Unlock()
}

// render redraws the x-ray tables and the timeline.
func (p *page) render() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dirty && len(p.xray.pending) == 0 {
		return
	}
	p.dirty = false
	x := p.xray
	renderTopics(x)
	renderConnections(x)
	renderPending(x)
	renderDead(x)
	renderTimeline(x)
}

// renderTopics lists topics and their heads.
func renderTopics(x *xray) {
	names := make([]string, 0, len(x.topics))
	for name := range x.topics {
		names = append(names, name)
	}
	sort.Strings(names)
	var rows []jsValue
	for _, name := range names {
		rows = append(rows, row(name, fmt.Sprint(x.topics[name])))
	}
	replace(byID("xray-topics"), rows...)
}

// renderConnections lists connections and their subscriptions.
func renderConnections(x *xray) {
	ids := make([]uint64, 0, len(x.connections))
	for id := range x.connections {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var rows []jsValue
	for _, id := range ids {
		c := x.connections[id]
		subs := fmt.Sprint(c.subscriptions)
		rows = append(rows, row(c.name(), c.sub, subs))
	}
	replace(byID("xray-connections"), rows...)
}

// renderPending lists who owes an ack for what, and when the retry is.
func renderPending(x *xray) {
	now := time.Now().UnixMilli()
	var rows []jsValue
	for _, e := range x.sortedPending() {
		due := fmt.Sprintf("in %.1fs", float64(e.Deadline-now)/1000)
		if e.Deadline <= now {
			due = "now"
		}
		tr := row(x.connectionName(e.Conn), e.Topic, fmt.Sprint(e.Seq),
			e.MessageID, fmt.Sprint(e.Attempt), due)
		tr.Call("setAttribute", "data-message-id", e.MessageID)
		tr.Call("setAttribute", "data-attempt", fmt.Sprint(e.Attempt))
		rows = append(rows, tr)
	}
	replace(byID("xray-pending"), rows...)
	setText("xray-pending-count", fmt.Sprint(len(rows)))
}

// renderDead lists the newest dead letters first.
func renderDead(x *xray) {
	var rows []jsValue
	for i := len(x.dead) - 1; i >= 0; i-- {
		e := x.dead[i]
		rows = append(rows, row(e.Topic, fmt.Sprint(e.Seq), e.MessageID,
			x.connectionName(e.Conn), fmt.Sprint(e.Attempt)))
	}
	replace(byID("xray-dead"), rows...)
}

// renderTimeline lists the newest events first.
func renderTimeline(x *xray) {
	var items []jsValue
	for i := len(x.timeline) - 1; i >= 0; i-- {
		e := x.timeline[i]
		stamp := time.UnixMilli(e.Time).Format("15:04:05.000")
		items = append(items, element("li", stamp+"  "+describe(e),
			"event "+e.Kind))
	}
	replace(byID("timeline"), items...)
}

// dial connects to url and authenticates with token as client name.
func dial(ctx context.Context, url, token, name string) (*websocket.Conn,
	error) {
	if token == "" {
		return nil, fmt.Errorf("no token: paste one above")
	}
	dialCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(dialCtx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot reach %s", url)
	}
	conn.SetReadLimit(-1)
	err = writeJSON(ctx, conn, map[string]any{"type": "auth",
		"token": token, "client": name})
	if err != nil {
		return nil, err
	}
	_, data, err := conn.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("authentication: %w", err)
	}
	var reply struct{ Type, Message string }
	json.Unmarshal(data, &reply)
	if reply.Type != "authenticated" {
		conn.Close(websocket.StatusNormalClosure, "")
		return nil, fmt.Errorf("authentication refused: %s", reply.Message)
	}
	return conn, nil
}

// writeJSON sends v as one frame.
func writeJSON(ctx context.Context, conn *websocket.Conn, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, data)
}
