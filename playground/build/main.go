// Command build makes a page's WebAssembly for a release: it compiles a
// package for js/wasm, reproducibly (wasmbuild.Build), gzips it into the
// static folder, and copies wasm_exec.js from the Go that built it (the
// two must match), for go:embed to take in. It runs from a page's
// folder, through go generate: the playground's client by default
// (../wasm into static/popsub.wasm.gz), the lab's with -src and -out.
// The files are not committed: without them the page builds its client
// from the checkout when serve starts.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/popsub/popsub/wasmbuild"
)

// What to build, and where to put it.
var (
	src = flag.String("src", "../wasm", "the package to compile")
	out = flag.String("out", "static/popsub.wasm.gz", "the gzipped result")
)

// main builds and writes, or exits with the reason.
func main() {
	flag.Parse()
	wasm, wasmExec, err := wasmbuild.Build(".", *src)
	if err == nil {
		err = os.WriteFile(*out, wasm, 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(filepath.Dir(*out), "wasm_exec.js"),
			wasmExec, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
}
