//go:build js && wasm

// Command wasm is the PopSub playground's client: Go compiled to
// WebAssembly. Every panel on the page is its own WebSocket connection to
// the broker, speaking the same protocol as any other client (auth frame
// first, then subscribe, publish and ack); the x-ray panel is one more
// connection, subscribed to $sys/events.
package main

import (
	"net/url"
	"strings"
	"syscall/js"
	"time"
)

// clientNames are the page's clients, in the order of their panels.
var clientNames = []string{"alice", "bob", "carol"}

// main wires the page and then waits for ever: the page's callbacks and
// goroutines do the work.
func main() {
	location := js.Global().Get("location")
	scheme := "ws://"
	if location.Get("protocol").String() == "https:" {
		scheme = "wss://"
	}
	page := &page{
		url:   scheme + location.Get("host").String() + "/ws",
		token: tokenFromFragment(location.Get("hash").String()),
		xray:  newXray(),
	}
	byID("token").Set("value", page.token)
	on("token", "change", func() { page.token = value("token") })
	for _, name := range clientNames {
		page.clients = append(page.clients, newClient(page, name))
	}
	go page.watch()
	go page.renderLoop()
	document.Get("body").Call("setAttribute", "data-ready", "true")
	select {}
}

// tokenFromFragment reads #token=… from the URL fragment, where popsub
// serve puts a token for the local user; the fragment never reaches the
// server's logs.
func tokenFromFragment(hash string) string {
	values, err := url.ParseQuery(strings.TrimPrefix(hash, "#"))
	if err != nil {
		return ""
	}
	return values.Get("token")
}

// renderLoop redraws the x-ray a few times a second: often enough for
// retry deadlines to count down, rarely enough that a burst of events
// costs one redraw.
func (p *page) renderLoop() {
	for range time.Tick(250 * time.Millisecond) {
		p.render()
	}
}
