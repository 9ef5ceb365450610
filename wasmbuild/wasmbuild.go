// Package wasmbuild gives the playground and the lab their WebAssembly:
// the page's Go (package wasm, or lab/wasm with popsub.go in it)
// compiled for GOOS=js GOARCH=wasm, gzipped, and the wasm_exec.js of
// the Go that compiled it, which must match it.
//
// # The contract
//
// The pages run the very code of the checkout that serves them, and the
// repository holds no compiled copy: 3.5 MB of incompressible binary a
// commit, every time popsub.go changed, grew the clone to 125 MiB. A
// page asks Start for its package's WebAssembly: the files go generate
// put beside it and go:embed took in, when there are any (a release
// binary, built by go generate and go build), or else one built from the
// checkout now, in the background, by the go command that go run and go
// test already need (Root finds the checkout). Wait returns it once
// built. Build is the compile itself, which go generate runs too.
package wasmbuild

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Build compiles the package at pkg, a folder of the checkout at root
// ("wasm", "lab/wasm"), for js/wasm, and returns it gzipped, with the
// wasm_exec.js of the Go that compiled it. -trimpath and no VCS stamp
// make the bytes the same in any folder on any machine with this Go.
func Build(root, pkg string) (wasm, wasmExec []byte, err error) {
	dir, err := os.MkdirTemp("", "popsub-wasm")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "page.wasm")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w", "-o", file, "./"+pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("go build ./%s for js/wasm: %w\n%s", pkg,
			err, out)
	}
	plain, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go env GOROOT: %w", err)
	}
	wasmExec, err = os.ReadFile(filepath.Join(strings.TrimSpace(
		string(goroot)), "lib", "wasm", "wasm_exec.js"))
	if err != nil {
		return nil, nil, err
	}
	return gzipped(plain), wasmExec, nil
}

// gzipped compresses data at the best level, with no name and no time in
// the header, so that the same input gives the same bytes.
func gzipped(data []byte) []byte {
	var buffer bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buffer, gzip.BestCompression)
	zw.Write(data)
	zw.Close()
	return buffer.Bytes()
}

// Root is the checkout this binary was built from: found from this
// file's own path, which a build without -trimpath keeps (go run, go
// test, a plain go build), or "" for one with it, which must embed its
// pages' files.
func Root() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return ""
	}
	root := filepath.Dir(filepath.Dir(file))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return ""
	}
	return root
}

// Result is one page's WebAssembly: ready, or being built.
type Result struct {
	done chan struct{} // closed once the fields below are set
	// Wasm is the gzipped module, WasmExec its glue; Err why there is
	// none. Took is how long a build from the checkout took.
	Wasm, WasmExec []byte
	Err            error
	Took           time.Duration
}

// builds are the builds this process started, by package: one each,
// however many pages (or tests) ask.
var (
	buildsMu sync.Mutex
	builds   = map[string]*Result{}
)

// Start returns pkg's WebAssembly: embedded (and its glue), ready at
// once, if both are not nil; else built from Root on a goroutine of its
// own, once a process.
func Start(pkg string, embedded, embeddedExec []byte) *Result {
	r := &Result{done: make(chan struct{})}
	if embedded != nil && embeddedExec != nil {
		r.Wasm, r.WasmExec = embedded, embeddedExec
		close(r.done)
		return r
	}
	buildsMu.Lock()
	defer buildsMu.Unlock()
	if started := builds[pkg]; started != nil {
		return started
	}
	builds[pkg] = r
	go func() {
		defer close(r.done)
		start := time.Now()
		defer func() { r.Took = time.Since(start) }()
		root := Root()
		if root == "" {
			r.Err = fmt.Errorf("%s's WebAssembly is not in this binary, "+
				"and its source is not at hand: build it with go generate "+
				"./playground ./lab/page before go build", pkg)
			return
		}
		r.Wasm, r.WasmExec, r.Err = Build(root, pkg)
	}()
	return r
}

// Started returns the builds from the checkout this process started, by
// package.
func Started() map[string]*Result {
	buildsMu.Lock()
	defer buildsMu.Unlock()
	return maps.Clone(builds)
}

// Wait returns once the WebAssembly is ready, or its build failed.
func (r *Result) Wait() error {
	<-r.done
	return r.Err
}

// Ready reports whether Wait would return at once.
func (r *Result) Ready() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}
