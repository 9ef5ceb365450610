// Command build makes a page's WebAssembly: it compiles a package for
// js/wasm, reproducibly, gzips it into the static folder, and copies
// wasm_exec.js from the Go that built it (the two must match). It runs
// from a page's folder, through go generate: the playground's client by
// default (../wasm into static/popsub.wasm.gz), the lab's with -src and
// -out.
package main

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// What to build, and where to put it.
var (
	src = flag.String("src", "../wasm", "the package to compile")
	out = flag.String("out", "static/popsub.wasm.gz", "the gzipped result")
)

// main builds, compresses and copies, or exits with the reason.
func main() {
	flag.Parse()
	if err := build(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
}

// build does main's work.
func build() error {
	dir, err := os.MkdirTemp("", "popsub-wasm")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// -trimpath and no VCS stamp make the bytes the same in any folder
	// on any machine with this Go, so CI can check the committed file.
	wasmFile := filepath.Join(dir, "page.wasm")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w", "-o", wasmFile, *src)
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	wasm, err := os.ReadFile(wasmFile)
	if err != nil {
		return err
	}
	if err := writeGzip(*out, wasm); err != nil {
		return err
	}
	return copyWasmExec()
}

// writeGzip compresses data at the best level, with no name and no time
// in the header, so that the same input gives the same bytes.
func writeGzip(path string, data []byte) error {
	var buffer bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buffer, gzip.BestCompression)
	if err != nil {
		return err
	}
	zw.Write(data)
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buffer.Bytes(), 0o644)
}

// copyWasmExec copies the JavaScript glue of the Go that builds.
func copyWasmExec() error {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env GOROOT: %w", err)
	}
	source := filepath.Join(strings.TrimSpace(string(goroot)), "lib", "wasm",
		"wasm_exec.js")
	glue, err := os.ReadFile(source)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(filepath.Dir(*out), "wasm_exec.js"),
		glue, 0o644)
}
