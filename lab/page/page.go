// Package page serves the lab (package lab, compiled to WebAssembly)
// as a folder of static files: an HTML page rendered with templ, its
// script and stylesheet, Go's wasm_exec.js, the gzipped lab.wasm.gz,
// and popsub.go as source.html, which the scenarios link to. popsub
// serve serves the folder at /lab/; popsub lab --out writes it, for any
// static file server. The page needs nothing else: the broker runs in
// the tab.
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
)

// static holds the page's files but index.html and source.html.
//
//go:embed static
var static embed.FS

// Files returns the lab's folder, with source, popsub.go as a page, as
// source.html.
func Files(source []byte) map[string][]byte {
	files := map[string][]byte{"source.html": source}
	var index bytes.Buffer
	Page().Render(context.Background(), &index)
	files["index.html"] = index.Bytes()
	entries, _ := fs.ReadDir(static, "static")
	for _, entry := range entries {
		files[entry.Name()], _ = fs.ReadFile(static, "static/"+entry.Name())
	}
	return files
}

// Handler serves the lab's folder at its root: mount it under a prefix
// with http.StripPrefix.
func Handler(source []byte) http.Handler {
	files := Files(source)
	start := time.Now()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		if name == "" {
			name = "index.html"
		}
		body, ok := files[name]
		if !ok || r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, name, start, bytes.NewReader(body))
	})
}

// Export writes the lab's folder into dir, which it makes if need be.
func Export(dir string, source []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, body := range Files(source) {
		err := os.WriteFile(filepath.Join(dir, name), body, 0o644)
		if err != nil {
			return err
		}
	}
	return nil
}
