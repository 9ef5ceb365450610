//go:build js && wasm

package main

import (
	"syscall/js"
)

// This file is the page's few DOM helpers. Text always goes in through
// textContent, never innerHTML: payloads are whatever publishers sent,
// and must not become markup.

// document is the page's document.
var document = js.Global().Get("document")

// byID returns the element with id (null if there is none).
func byID(id string) js.Value {
	return document.Call("getElementById", id)
}

// element makes a tag with text and optional class.
func element(tag, text, class string) js.Value {
	el := document.Call("createElement", tag)
	el.Set("textContent", text)
	if class != "" {
		el.Set("className", class)
	}
	return el
}

// tableRow makes a table row of cells.
func tableRow(cells ...string) js.Value {
	tr := document.Call("createElement", "tr")
	for _, cell := range cells {
		tr.Call("append", element("td", cell, ""))
	}
	return tr
}

// replace empties el and appends children.
func replace(el js.Value, children ...js.Value) {
	el.Call("replaceChildren")
	for _, child := range children {
		el.Call("append", child)
	}
}

// on runs fn on the event of the element with id. fn runs on the
// browser's event loop and must not block: network work goes on a
// goroutine of its own.
func on(id, event string, fn func()) {
	byID(id).Call("addEventListener", event, js.FuncOf(
		func(js.Value, []js.Value) any {
			fn()
			return nil
		}))
}

// onElement is on for an element made at run time.
func onElement(el js.Value, event string, fn func()) {
	el.Call("addEventListener", event, js.FuncOf(
		func(js.Value, []js.Value) any {
			fn()
			return nil
		}))
}

// value is the value of the input with id.
func value(id string) string {
	return byID(id).Get("value").String()
}

// checked is whether the checkbox with id is ticked.
func checked(id string) bool {
	return byID(id).Get("checked").Bool()
}

// setText sets the text of the element with id.
func setText(id, text string) {
	byID(id).Set("textContent", text)
}

// jsValue names js.Value where a file needs no other syscall/js name.
type jsValue = js.Value

// svgElement makes an SVG element with a class and attributes given as
// name, value pairs.
func svgElement(tag, class string, attributes ...string) js.Value {
	el := document.Call("createElementNS", "http://www.w3.org/2000/svg",
		tag)
	if class != "" {
		el.Call("setAttribute", "class", class)
	}
	for i := 0; i+1 < len(attributes); i += 2 {
		el.Call("setAttribute", attributes[i], attributes[i+1])
	}
	return el
}

// onSubmit runs fn when the form with id is submitted (a button or Enter
// in one of its fields), instead of the browser's own submission.
func onSubmit(id string, fn func()) {
	byID(id).Call("addEventListener", "submit", js.FuncOf(
		func(_ js.Value, args []js.Value) any {
			args[0].Call("preventDefault")
			fn()
			return nil
		}))
}

// setValue sets the value of the input or select with id.
func setValue(id, v string) {
	byID(id).Set("value", v)
}
