// Command build makes the playground's client: it compiles ../wasm for
// js/wasm, reproducibly, gzips it into static/popsub.wasm.gz, and copies
// wasm_exec.js from the Go that built it (the two must match). It runs
// from the playground folder, through go generate.
package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// main builds, compresses and copies, or exits with the reason.
func main() {
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
	out := filepath.Join(dir, "popsub.wasm")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w", "-o", out, "../wasm")
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		return err
	}
	if err := writeGzip("static/popsub.wasm.gz", wasm); err != nil {
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
	return os.WriteFile("static/wasm_exec.js", glue, 0o644)
}
