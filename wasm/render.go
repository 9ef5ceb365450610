//go:build js && wasm

package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// This file draws the models: the x-ray's tables, the sequence diagram
// and the guide's strip. Each function is called with the page's lock
// held, from the render loop.

// replayStep is how long each step of a replayed diagram stays the
// newest.
const replayStep = 450 * time.Millisecond

// renderTables redraws the x-ray's tables. The watcher's own connection
// (the page's x-ray) owes acks only for dead letters, and is left out.
func renderTables(x *xray, watcher uint64) {
	renderPending(x, watcher)
	var rows []jsValue
	for i := len(x.dead) - 1; i >= 0; i-- {
		d := x.dead[i]
		rows = append(rows, tableRow(d.Topic, "#"+strconv.FormatUint(d.Seq, 10),
			d.who(), strconv.Itoa(d.Attempts)))
		rows[len(rows)-1].Call("setAttribute", "data-who", d.who())
	}
	replace(byID("xray-dead"), rows...)

	names := make([]string, 0, len(x.topics))
	for name := range x.topics {
		names = append(names, name)
	}
	sort.Strings(names)
	rows = nil
	for _, name := range names {
		rows = append(rows, tableRow(name, fmt.Sprint(x.topics[name])))
	}
	replace(byID("xray-topics"), rows...)

	ids := make([]uint64, 0, len(x.connections))
	for id := range x.connections {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	rows = nil
	for _, id := range ids {
		c := x.connections[id]
		rows = append(rows, tableRow(c.name(), fmt.Sprint(c.subscriptions)))
	}
	replace(byID("xray-connections"), rows...)
}

// renderPending lists who owes an ack for what, and when its retry is.
func renderPending(x *xray, watcher uint64) {
	now := time.Now().UnixMilli()
	var rows []jsValue
	for _, e := range x.sortedPending(watcher) {
		due := fmt.Sprintf("in %.1f s", float64(e.Deadline-now)/1000)
		if e.Deadline <= now {
			due = "now"
		}
		tr := tableRow(x.connectionName(e.Conn), e.Topic, fmt.Sprint(e.Seq),
			fmt.Sprint(e.Attempt), due)
		tr.Call("setAttribute", "data-message-id", e.MessageID)
		tr.Call("setAttribute", "data-attempt", fmt.Sprint(e.Attempt))
		rows = append(rows, tr)
	}
	replace(byID("xray-pending"), rows...)
	setText("xray-pending-count", fmt.Sprint(len(rows)))
}

// Geometry of the diagram, in pixels; lanes are placed in percent of the
// width, so the picture fits a phone as well as a laptop.
const (
	stepHeight = 26
	topMargin  = 24 // room for the first row's label below the lanes
)

// lanesOf lists the diagram's lanes: the panels with the broker among
// them, others when another page or program took part, and $dead once a
// message died.
func lanesOf(steps []step) []string {
	lanes := []string{clientNames[0], clientNames[1], brokerLane,
		clientNames[2]}
	others, dead := false, false
	for _, s := range steps {
		others = others || s.From == otherLane || s.To == otherLane
		dead = dead || s.To == deadLane
	}
	if others {
		lanes = append(lanes, otherLane)
	}
	if dead {
		lanes = append(lanes, deadLane)
	}
	return lanes
}

// renderDiagram redraws the sequence diagram: a lifeline per lane and a
// line per step, newest at the bottom. The newest step is animated; in a
// replay, each step in turn.
func renderDiagram(steps []step, replaying bool) {
	// Drawing again what is already drawn would cut short the newest
	// step's animation: the picture changes only with its steps.
	drawn := [2]int{len(steps), 0}
	if len(steps) > 0 {
		drawn[1] = steps[len(steps)-1].Serial
	}
	if drawn == lastDrawn {
		return
	}
	lastDrawn = drawn
	lanes := lanesOf(steps)
	x := func(lane string) float64 {
		for i, name := range lanes {
			if name == lane {
				return (float64(i) + 0.5) * 100 / float64(len(lanes))
			}
		}
		return 50
	}
	renderLanes(lanes)
	svg := byID("diagram")
	height := topMargin*2 + stepHeight*len(steps)
	svg.Call("setAttribute", "height", strconv.Itoa(height))
	children := []jsValue{markers()}
	for _, lane := range lanes {
		children = append(children, svgElement("line", "lifeline",
			"x1", pct(x(lane)), "x2", pct(x(lane)), "y1", "0",
			"y2", strconv.Itoa(height)))
	}
	for i, s := range steps {
		y := topMargin + stepHeight*i + stepHeight/2
		g := drawStep(s, x(s.From), x(s.To), y)
		if i == len(steps)-1 && (replaying || isNew(s)) {
			g.Get("classList").Call("add", "new")
		}
		children = append(children, g)
	}
	replace(svg, children...)
	box := byID("diagram-box")
	box.Set("scrollTop", box.Get("scrollHeight"))
}

// newest is the serial of the newest step drawn, so that only a step
// not drawn before is animated; lastDrawn is the number of steps drawn
// and the newest one's serial.
var (
	newest    int
	lastDrawn = [2]int{-1, -1}
)

// isNew reports whether s is newer than any step drawn before.
func isNew(s step) bool {
	if s.Serial > newest {
		newest = s.Serial
		return true
	}
	return false
}

// renderLanes writes the lanes' names above the diagram.
func renderLanes(lanes []string) {
	var names []jsValue
	for _, lane := range lanes {
		names = append(names, element("span", lane,
			"lane "+strings.TrimPrefix(lane, "$")))
	}
	box := byID("lanes")
	box.Get("style").Call("setProperty", "--lanes", strconv.Itoa(len(lanes)))
	replace(box, names...)
}

// drawStep draws one step at height y: an arrow from one lane to another
// with its label above, or a note on one lane.
func drawStep(s step, from, to float64, y int) jsValue {
	detail := time.UnixMilli(s.Time).Format("15:04:05.000") + "  " + s.Detail
	g := svgElement("g", "step "+s.Kind, "data-kind", s.Kind,
		"data-seq", strconv.FormatUint(s.Seq, 10),
		"data-topic", s.Topic,
		"data-attempt", strconv.Itoa(s.Attempt),
		"data-lane", laneOfStep(s), "data-detail", detail, "tabindex", "0")
	title := svgElement("title", "")
	title.Set("textContent", detail)
	g.Call("append", title)
	labelX, anchor := labelPlace(from, to)
	label := svgElement("text", "label", "x", pct(labelX),
		"y", strconv.Itoa(y-4), "text-anchor", anchor)
	label.Set("textContent", s.Label)
	if s.From == s.To {
		g.Call("append", svgElement("circle", "dot", "cx", pct(from),
			"cy", strconv.Itoa(y+4), "r", "4"))
		g.Call("append", label)
		return g
	}
	// The arrow stops short of the lifeline it points at.
	end := to - 1.5
	if to < from {
		end = to + 1.5
	}
	g.Call("append", svgElement("line", "arrow", "x1", pct(from),
		"x2", pct(end), "y1", strconv.Itoa(y+4), "y2", strconv.Itoa(y+4),
		"marker-end", "url(#head-"+s.Kind+")"))
	g.Call("append", label)
	return g
}

// labelPlace is where a step's label goes, in percent of the width, and
// how it hangs there: centred over its arrow, but, near an edge, from
// the arrow's end inwards, so that a phone's narrow diagram does not cut
// the label of a step to the last lane ($dead, a retry's client) short.
func labelPlace(from, to float64) (float64, string) {
	left, right := min(from, to), max(from, to)
	switch mid := (from + to) / 2; {
	case mid >= 70:
		return max(right, 60) + 2, "end"
	case mid <= 30:
		return min(left, 40) - 2, "start"
	default:
		return mid, "middle"
	}
}

// laneOfStep is the client lane a step concerns.
func laneOfStep(s step) string {
	switch {
	case s.Client != "":
		return s.Client
	case s.From == brokerLane:
		return s.To
	}
	return s.From
}

// markers defines one arrowhead per kind of step, in its colour.
func markers() jsValue {
	defs := svgElement("defs", "")
	for _, kind := range []string{"publish", "deliver", "retry", "ack",
		"dead"} {
		marker := svgElement("marker", "head "+kind, "id", "head-"+kind,
			"viewBox", "0 0 10 10", "refX", "9", "refY", "5",
			"markerWidth", "7", "markerHeight", "7", "orient", "auto")
		marker.Call("append", svgElement("path", "", "d",
			"M0,0 L10,5 L0,10 z"))
		defs.Call("append", marker)
	}
	return defs
}

// pct writes a percentage for an SVG attribute.
func pct(v float64) string {
	return strconv.FormatFloat(v, 'f', 2, 64) + "%"
}

// renderGuide marks the guide's steps done, current or to do, and says
// what the broker is about to do next.
func renderGuide(progress int, x *xray, s *story) {
	byID("guide").Call("setAttribute", "data-progress",
		strconv.Itoa(progress))
	for i := 1; i <= 4; i++ {
		state := "todo"
		switch {
		case i <= progress:
			state = "done"
		case i == progress+1:
			state = "current"
		}
		byID("step-"+strconv.Itoa(i)).Call("setAttribute", "data-state",
			state)
	}
	byID("share").Call("setAttribute", "data-state",
		map[bool]string{true: "done", false: "todo"}[s.shared])
	setText("guide-hint", nextRetry(x, s))
}

// nextRetry describes the soonest retry a panel's delivery is waiting
// for, or says the run is complete.
func nextRetry(x *xray, s *story) string {
	if s.progress >= 4 {
		return "Done: the message is in $dead/jobs, and stays there."
	}
	now := time.Now().UnixMilli()
	var soonest *event
	for _, e := range x.sortedPending(0) {
		if s.lane(e.Conn) == otherLane {
			continue
		}
		if soonest == nil || e.Deadline < soonest.Deadline {
			soonest = &e
		}
	}
	if soonest == nil {
		return ""
	}
	return fmt.Sprintf("%s owes an ack for #%d: attempt %d times out in "+
		"%.1f s.", s.lane(soonest.Conn), soonest.Seq, soonest.Attempt,
		max(0, float64(soonest.Deadline-now)/1000))
}
