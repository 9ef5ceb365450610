//go:build !(js && wasm)

package main

import (
	"fmt"
	"os"
)

// main, outside a browser, says how this command is built: it is the
// playground's client, Go compiled to WebAssembly, and runs in a page.
// It exists so that go build ./... and go vet ./... work on any machine.
func main() {
	fmt.Fprintln(os.Stderr, "wasm is the playground's client: it runs in "+
		"a browser. Build it with go generate ./playground (GOOS=js "+
		"GOARCH=wasm), and open the page popsub serve prints.")
	os.Exit(2)
}
