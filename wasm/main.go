//go:build js && wasm

// Command wasm is the PopSub playground's client: Go compiled to
// WebAssembly. Every panel on the page is its own WebSocket connection to
// the broker, speaking the same protocol as any other client (auth frame
// first, then subscribe, publish and ack); the x-ray is one more
// connection, subscribed to $sys/events and to the dead-letter topics.
package main

import (
	"fmt"
	"net/url"
	"strings"
	"syscall/js"
	"time"
)

// main wires the page and then waits for ever: the page's callbacks and
// goroutines do the work.
func main() {
	location := js.Global().Get("location")
	scheme := "ws://"
	if location.Get("protocol").String() == "https:" {
		scheme = "wss://"
	}
	p := &page{
		url:   scheme + location.Get("host").String() + "/ws",
		token: tokenFromFragment(location.Get("hash").String()),
		xray:  newXray(), story: newStory(),
		up: make(chan struct{}), retry: make(chan struct{}, 1),
	}
	for i, name := range clientNames {
		var subs []string
		if i < 2 {
			subs = []string{"jobs"}
		}
		p.clients = append(p.clients, newClient(p, name, subs...))
	}
	wireControls(p)
	go p.watch()
	for _, c := range p.clients {
		go c.run()
	}
	go p.renderLoop()
	document.Get("body").Call("setAttribute", "data-ready", "true")
	select {}
}

// wireControls connects the page's own controls: the token, the guide and the
// diagram's replay.
func wireControls(p *page) {
	setValue("token", p.token)
	onSubmit("token-form", func() { p.setToken(value("token")) })
	// Opening the newest link serve printed, in the same tab, changes
	// only the fragment: the page takes the new token without a reload.
	js.Global().Call("addEventListener", "hashchange", js.FuncOf(
		func(js.Value, []js.Value) any {
			hash := js.Global().Get("location").Get("hash").String()
			if token := tokenFromFragment(hash); token != "" {
				setValue("token", token)
				p.setToken(token)
			}
			return nil
		}))
	alice, carol := p.clients[0], p.clients[2]
	on("step-1-do", "click", func() {
		go carol.publishJob()
		showPicture()
		p.keepPictureInView()
	})
	on("step-2-do", "click", func() {
		setValue(alice.id("acks"), "withhold")
		alice.acksChanged()
		go carol.publishJob()
		showPicture()
		p.keepPictureInView()
	})
	on("share-do", "click", func() { go p.shareJobs() })
	on("guide-reset", "click", func() { go p.startOver() })
	on("picture-replay", "click", p.replay)
	for _, event := range []string{"click", "focusin"} {
		byID("diagram").Call("addEventListener", event, js.FuncOf(
			func(_ js.Value, args []js.Value) any {
				explainStep(args[0].Get("target"))
				return nil
			}))
	}
}

// showPicture brings the diagram into view after a step's button on a
// narrow screen, where it sits far below the strip; the renders of the
// next second call it again, as the rows above the diagram grow.
func showPicture() {
	if js.Global().Get("innerWidth").Int() < 760 {
		byID("picture").Call("scrollIntoView",
			map[string]any{"behavior": "instant", "block": "start"})
	}
}

// explainStep shows, below the diagram, what the step a tap, a click or
// the keyboard chose means: a phone has no hover for its tooltip.
func explainStep(target js.Value) {
	step := target.Call("closest", "g.step")
	if step.IsNull() {
		return
	}
	setText("picture-detail", step.Call("getAttribute",
		"data-detail").String())
}

// shareJobs is the work-queue step: Alice, withholding her acks, and Bob
// join group workers on jobs, and once the broker has answered both,
// Carol publishes two jobs, one for each. Alice's moves to Bob after the
// ack timeout.
//
// A group keeps its place in the log between runs, as a work queue
// should: a second run on the same group would hand its members what the
// first left unacked. So each run after the first joins a group of its
// own, workers-2, workers-3, … , and starts, as a new group does, with
// new jobs only.
func (p *page) shareJobs() {
	alice, bob, carol := p.clients[0], p.clients[1], p.clients[2]
	setValue(alice.id("acks"), "withhold")
	alice.acksChanged()
	group := "workers"
	if run := p.groupRuns.Add(1); run > 1 {
		group = fmt.Sprint("workers-", run)
	}
	var answers []<-chan struct{}
	for _, c := range []*client{alice, bob} {
		setValue(c.id("sub-topic"), "jobs")
		setValue(c.id("sub-from"), "new")
		setValue(c.id("sub-durable"), "")
		setValue(c.id("sub-group"), group)
		answers = append(answers, c.subscribe())
	}
	for _, answer := range answers {
		select {
		case <-answer:
		case <-time.After(5 * time.Second):
		}
	}
	carol.publishJob()
	carol.publishJob()
	showPicture()
	p.keepPictureInView()
}

// publishJob publishes one QoS 1 job from the panel, as the guide's
// buttons ask.
func (c *client) publishJob() {
	setValue(c.id("pub-topic"), "jobs")
	setValue(c.id("pub-qos"), "1")
	c.publish(1)
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
