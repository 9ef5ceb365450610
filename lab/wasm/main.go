//go:build js && wasm

// Command wasm is the lab page's Go: the real broker and its world
// (package lab), compiled to WebAssembly. The page's host (lab.js) owns
// the clock and the random numbers; this program answers its calls,
// each of which runs Go until every goroutine waits again:
//
//	popsubLab.do(action)   one click, as JSON; "" or the error
//	popsubLab.view()       the run now: JSON with the pictures as HTML
//	popsubLab.history()    the run's events, as JSON
//	popsubLab.scenarios()  the guided scenarios, as JSON
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

func main() {
	run, err := lab.New()
	if err != nil {
		js.Global().Get("console").Call("error", "lab: "+err.Error())
		return
	}
	fresh := 0 // the events the last view had
	api := map[string]any{
		"do": js.FuncOf(func(_ js.Value, args []js.Value) any {
			var a lab.Action
			if err := json.Unmarshal([]byte(args[0].String()), &a); err != nil {
				return "bad action: " + err.Error()
			}
			if err := run.Do(a); err != nil {
				return err.Error()
			}
			return ""
		}),
		"view": js.FuncOf(func(js.Value, []js.Value) any {
			v := run.View()
			out := map[string]any{"now": v.Now, "broker": v.Broker,
				"broken": v.Broken(), "promises": v.Checks,
				"fresh": v.Events[fresh:], "events": len(v.Events),
				"clients": v.Clients,
				"diagram": render(lab.Diagram(v, fresh)),
				"checker": render(lab.Checker(v)),
				"tables":  render(lab.Tables(v))}
			fresh = len(v.Events)
			data, _ := json.Marshal(out)
			return string(data)
		}),
		"history": js.FuncOf(func(js.Value, []js.Value) any {
			return string(run.History())
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

// render renders a component of the page's pictures to HTML.
func render(c templ.Component) string {
	var b strings.Builder
	c.Render(context.Background(), &b)
	return b.String()
}
