package lab

import (
	"fmt"
	"strings"
)

// # What a limit costs
//
// Two of the article's limits break no promise: they cost. One lock
// makes every client wait for the slowest operation; no back-pressure
// lets a slow reader's messages pile up in memory. Two more cost a
// subscriber copies it cannot tell from new messages. A scenario that
// runs both brokers side by side measures each cost in each run, from
// the events the diagram draws and the bytes the broker held, and the
// page sets the two figures side by side.

// Figure is one cost, measured in a run.
type Figure struct {
	// Spec names it: a measure and, after a space, a client's lane.
	Spec  string `json:"spec"`
	Name  string `json:"name"`
	Value int64  `json:"value"`
	Unit  string `json:"unit"`
}

// Measure measures the figure spec names:
//
//	again bob   deliveries to bob of a value he already had
//	fresh bob   deliveries to bob under an id no client published
//	waited bob  how long bob's newest message took from its publish to
//	            him, in milliseconds
//	held        the most bytes the broker held in memory for its clients
func (l *Lab) Measure(spec string) Figure {
	l.measure()
	l.mu.Lock()
	defer l.mu.Unlock()
	kind, lane, _ := strings.Cut(spec, " ")
	f := Figure{Spec: spec}
	published := map[string]int64{} // topic and id → when first sent
	had := map[string]bool{}        // topic and value → lane had it
	for _, e := range l.events {
		place := e.Topic + "\x00" + e.Value
		switch {
		case e.Kind == "publish":
			if _, ok := published[place]; !ok {
				published[place] = e.At
			}
		case e.Kind == "message" && e.To == lane:
			_, real := published[e.Topic+"\x00"+e.ID]
			switch {
			case kind == "again" && had[place]:
				f.Value++
			case kind == "fresh" && !real:
				f.Value++
			case kind == "waited" && !had[place]:
				f.Value = e.At - published[place]
			}
			had[place] = true
		}
	}
	switch kind {
	case "again":
		f.Name = "copies of a message " + lane + " already had"
	case "fresh":
		f.Name = "deliveries to " + lane + " under an id nobody published"
	case "waited":
		f.Name = "how long the newest message to " + lane + " took " +
			"from its publish"
		f.Unit = "ms"
	case "held":
		f.Name = "most bytes held in the broker's memory for its clients"
		f.Value, f.Unit = int64(l.held), "bytes"
	default:
		f.Name = fmt.Sprintf("no figure %q", spec)
	}
	return f
}
