//go:build js && wasm

// Command wasm is the lab page's Go: the real broker and its world
// (package lab), compiled to WebAssembly. The page's host (lab.js) owns
// the clock and the random numbers; this program answers its calls,
// each of which runs Go until every goroutine waits again:
//
//	popsubLab.start(brokers)  the run's brokers: popsub, article, or both
//	                          side by side; "" or the error
//	popsubLab.do(action)      one click, as JSON, on every broker of the
//	                          run; "" or the error
//	popsubLab.view()          the run now: JSON with the pictures as HTML,
//	                          and the article's broker's in "beside"
//	popsubLab.figures(specs)  the costs a scenario measures, on each
//	                          broker: JSON
//	popsubLab.history()       each broker's events, as JSON, a line each
//	popsubLab.scenarios()     the guided scenarios, as JSON
//
// The page calls view exactly once after each step of the clock and
// each action, in a replay as in the run it replays: a call into Go
// moves its scheduler, so the same calls in the same order are part of
// what makes a replay the same run.
package main

import (
	"context"
	"encoding/json"
	"strings"
	"syscall/js"

	"github.com/a-h/templ"

	"github.com/popsub/popsub/lab"
)

// run is one broker's run, and the events its last view had.
type run struct {
	*lab.Lab
	fresh int
}

func main() {
	var runs []*run
	api := map[string]any{
		"start": js.FuncOf(func(_ js.Value, args []js.Value) any {
			kinds := []string{args[0].String()}
			if kinds[0] == "both" {
				kinds = []string{lab.Popsub, lab.Article}
			}
			for _, kind := range kinds {
				l, err := lab.NewOn(kind)
				if err != nil {
					return err.Error()
				}
				runs = append(runs, &run{Lab: l})
			}
			return ""
		}),
		"do": js.FuncOf(func(_ js.Value, args []js.Value) any {
			var a lab.Action
			if err := json.Unmarshal([]byte(args[0].String()), &a); err != nil {
				return "bad action: " + err.Error()
			}
			for _, r := range runs {
				if err := r.Do(a); err != nil {
					return err.Error()
				}
			}
			return ""
		}),
		"view": js.FuncOf(func(js.Value, []js.Value) any {
			out := runs[0].look()
			if len(runs) > 1 {
				out["beside"] = runs[1].look()
			}
			data, _ := json.Marshal(out)
			return string(data)
		}),
		"figures": js.FuncOf(func(_ js.Value, args []js.Value) any {
			var specs []string
			json.Unmarshal([]byte(args[0].String()), &specs)
			var figures [][]lab.Figure
			for _, spec := range specs {
				var each []lab.Figure
				for _, r := range runs {
					each = append(each, r.Measure(spec))
				}
				figures = append(figures, each)
			}
			data, _ := json.Marshal(figures)
			return string(data)
		}),
		"history": js.FuncOf(func(js.Value, []js.Value) any {
			var each []string
			for _, r := range runs {
				each = append(each, string(r.History()))
			}
			return strings.Join(each, "\n")
		}),
		"scenarios": js.FuncOf(func(js.Value, []js.Value) any {
			data, _ := json.Marshal(lab.Scenarios)
			return string(data)
		}),
	}
	js.Global().Set("popsubLab", js.ValueOf(api))
	js.Global().Call("popsubLabReady")
	select {}
}

// look returns the run now, for the page, with the events new since
// the last look.
func (r *run) look() map[string]any {
	v := r.View()
	out := map[string]any{"now": v.Now, "broker": v.Broker,
		"kind": r.Kind(), "broken": v.Broken(), "promises": v.Checks,
		"fresh": v.Events[r.fresh:], "events": len(v.Events),
		"clients": v.Clients,
		"diagram": render(lab.Diagram(v, r.fresh)),
		"checker": render(lab.Checker(v)),
		"tables":  render(lab.Tables(v))}
	r.fresh = len(v.Events)
	return out
}

// render renders a component of the page's pictures to HTML.
func render(c templ.Component) string {
	var b strings.Builder
	c.Render(context.Background(), &b)
	return b.String()
}
