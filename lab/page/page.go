// Package page serves the lab (package lab, compiled to WebAssembly)
// as a folder of static files: an HTML page rendered with templ, its
// script and stylesheet, Go's wasm_exec.js, the gzipped lab.wasm.gz,
// and popsub.go as source.html, which the scenarios link to. popsub
// serve serves the folder at /lab/; popsub lab --out writes it, for any
// static file server. The page needs nothing else: the broker runs in
// the tab. The WebAssembly and its glue are embedded when go generate
// made them before go build; else they are built from the checkout as
// serve starts (package wasmbuild), and wait for it.
package page

//go:generate go tool templ generate -path ../..
//go:generate go run ../../playground/build -src ../wasm -out static/lab.wasm.gz

import (
	"bytes"
	"context"
	"embed"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/popsub/popsub/wasmbuild"
)

// static holds the page's files but index.html and source.html, and,
// once go generate made them, lab.wasm.gz and wasm_exec.js.
//
//go:embed static
var static embed.FS

// files returns the lab's folder, with source, popsub.go as a page, as
// source.html, and the build of its WebAssembly, whose files are in the
// folder once it is done.
func files(source []byte) (map[string][]byte, *wasmbuild.Result) {
	files := map[string][]byte{"source.html": source}
	var index bytes.Buffer
	Page().Render(context.Background(), &index)
	files["index.html"] = index.Bytes()
	entries, _ := fs.ReadDir(static, "static")
	for _, entry := range entries {
		files[entry.Name()], _ = fs.ReadFile(static, "static/"+entry.Name())
	}
	build := wasmbuild.Start("lab/wasm", files["lab.wasm.gz"],
		files["wasm_exec.js"])
	return files, build
}

// Handler serves the lab's folder at its root: mount it under a prefix
// with http.StripPrefix. A request for the WebAssembly or its glue waits
// for their build.
func Handler(source []byte) http.Handler {
	files, build := files(source)
	start := time.Now()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		if name == "" {
			name = "index.html"
		}
		body, ok := files[name]
		if name == "lab.wasm.gz" || name == "wasm_exec.js" {
			if err := build.Wait(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			body, ok = build.Wasm, true
			if name == "wasm_exec.js" {
				body = build.WasmExec
			}
		}
		if !ok || r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, name, start, bytes.NewReader(body))
	})
}

// Export writes the lab's folder into dir, which it makes if need be,
// once its WebAssembly is built.
func Export(dir string, source []byte) error {
	files, build := files(source)
	if err := build.Wait(); err != nil {
		return err
	}
	files["lab.wasm.gz"], files["wasm_exec.js"] = build.Wasm, build.WasmExec
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, body := range files {
		err := os.WriteFile(filepath.Join(dir, name), body, 0o644)
		if err != nil {
			return err
		}
	}
	return nil
}
