// Package playground serves the PopSub playground: a page rendered with
// templ, embedded in the binary, and a client compiled from ../wasm to
// WebAssembly: embedded too when go generate made it before go build (a
// release), or else built from the checkout as serve starts (package
// wasmbuild), so that go run gives a playground of this very checkout
// with no extra step, and the repository holds no compiled client.
package playground

//go:generate go tool templ generate -path ..
//go:generate go run ./build

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/popsub/popsub/wasmbuild"
)

// static holds the assets: the stylesheet, the boot script and, once go
// generate made them, Go's wasm_exec.js and the gzipped client.
//
//go:embed static
var static embed.FS

// asset is one file, ready to serve, or, with build set, once the build
// of the checkout's client is done.
type asset struct {
	body     []byte // as stored; gzipped when gzipped is true
	gzipped  bool
	kind     string // Content-Type
	etag     string // quoted, from the stored bytes
	plain    []byte // the gunzipped body, made on first need
	plainErr error
	once     sync.Once
	// build is the client being built, whose module (or, glue, its
	// wasm_exec.js) this is: the asset made of it, once built, is built.
	build *wasmbuild.Result
	glue  bool
	built atomic.Pointer[asset]
}

// Settings are what the page shows of the broker that serves it.
type Settings struct {
	Clients    []string      // the page's clients, a panel each
	AckTimeout time.Duration // before a retry
	MaxRetries int           // before a dead letter; negative: none
	// RetryBackoff multiplies each wait for an ack, up to MaxRetryDelay.
	RetryBackoff  float64
	MaxRetryDelay time.Duration
}

// DeadAfter is how long a delivery nobody acks takes to become a dead
// letter, at least and at most: MaxRetries+1 waits for its ack, the
// first AckTimeout, each RetryBackoff times the last, up to
// MaxRetryDelay; the broker takes up to a fifth off each, so that
// neighbouring messages do not retry together. MaxRetries below zero
// means none: one wait.
func (s Settings) DeadAfter() (least, most time.Duration) {
	wait := float64(s.AckTimeout)
	for range max(s.MaxRetries, 0) + 1 {
		most += time.Duration(min(wait,
			float64(max(s.MaxRetryDelay, s.AckTimeout))))
		wait *= max(s.RetryBackoff, 1)
	}
	return most * 4 / 5, most
}

// Handler serves the page at / and its assets under /static/. The
// client's addresses are made for each page, as its build may finish
// after the first is served.
func Handler(settings Settings) http.Handler {
	assets := loadAssets()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		Page(PageData{Settings: settings,
			CSS:      assets.url("playground.css"),
			Boot:     assets.url("boot.js"),
			WasmExec: assets.url("wasm_exec.js"),
			Wasm:     assets.url("popsub.wasm")}).Render(r.Context(), w)
	})
	mux.HandleFunc("GET /static/{name}", assets.serve)
	return mux
}

// assets are the embedded files by name (popsub.wasm for the .gz).
type assets map[string]*asset

// loadAssets reads every embedded file once, at start.
func loadAssets() assets {
	list := assets{}
	entries, _ := fs.ReadDir(static, "static")
	for _, entry := range entries {
		body, _ := fs.ReadFile(static, "static/"+entry.Name())
		name, gzipped := strings.CutSuffix(entry.Name(), ".gz")
		kind := mime.TypeByExtension(path.Ext(name))
		if path.Ext(name) == ".wasm" {
			kind = "application/wasm"
		}
		list[name] = newAsset(body, gzipped, kind)
	}
	if list["popsub.wasm"] == nil || list["wasm_exec.js"] == nil {
		build := wasmbuild.Start("wasm", nil, nil)
		list["popsub.wasm"] = &asset{kind: "application/wasm", build: build}
		list["wasm_exec.js"] = &asset{kind: "text/javascript", build: build,
			glue: true}
	}
	return list
}

// ready returns the file to serve: file itself, or, once the build it
// comes from is done, the asset made of it; or why the build failed.
func (file *asset) ready() (*asset, error) {
	if file.build == nil {
		return file, nil
	}
	if err := file.build.Wait(); err != nil {
		return nil, err
	}
	if file.built.Load() == nil {
		body, gzipped := file.build.Wasm, true
		if file.glue {
			body, gzipped = file.build.WasmExec, false
		}
		file.built.CompareAndSwap(nil, newAsset(body, gzipped, file.kind))
	}
	return file.built.Load(), nil
}

// newAsset makes an asset of body, kept gzipped: compressed here, once,
// unless it came compressed, so that every client that takes gzip gets
// it so. The ETag comes from the bytes as given.
func newAsset(body []byte, gzipped bool, kind string) *asset {
	sum := sha256.Sum256(body)
	file := &asset{body: body, gzipped: true, kind: kind,
		etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	if !gzipped {
		var zipped bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&zipped, gzip.BestCompression)
		zw.Write(body)
		zw.Close()
		file.body, file.plain = zipped.Bytes(), body
		file.once.Do(func() {})
	}
	return file
}

// Document serves body, a page made at build time (the source page), as
// the assets are served: gzipped for clients that take it, with an ETag,
// revalidated on each visit since its address names no version.
func Document(kind string, body []byte) http.Handler {
	file := newAsset(body, false, kind)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		file.serve(w, r, false)
	})
}

// url is the versioned address of name: its content hash in the query
// lets browsers keep it for a year and still see every new build. A file
// still being built has none yet: it is revalidated on each visit.
func (a assets) url(name string) string {
	file := a[name]
	if file == nil || file.build != nil && !file.build.Ready() {
		return "/static/" + name
	}
	if file, _ = file.ready(); file == nil {
		return "/static/" + name
	}
	return "/static/" + name + "?v=" + strings.Trim(file.etag, `"`)
}

// serve sends the asset a URL names.
func (a assets) serve(w http.ResponseWriter, r *http.Request) {
	file := a[r.PathValue("name")]
	if file == nil {
		http.NotFound(w, r)
		return
	}
	file, err := file.ready()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	file.serve(w, r, r.URL.Query().Get("v") == strings.Trim(file.etag, `"`))
}

// serve sends one asset: compressed if the client takes gzip, 304 if it
// has this version, cacheable for a year when versioned, that is when
// the URL names this version.
func (file *asset) serve(w http.ResponseWriter, r *http.Request,
	versioned bool) {
	h := w.Header()
	h.Set("Content-Type", file.kind)
	h.Set("ETag", file.etag)
	h.Set("Vary", "Accept-Encoding")
	h.Set("Cache-Control", "no-cache")
	if versioned {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	}
	if r.Header.Get("If-None-Match") == file.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body, err := file.bodyFor(r, h)
	if err != nil {
		http.Error(w, "asset unreadable", http.StatusInternalServerError)
		return
	}
	w.Write(body)
}

// bodyFor picks the stored bytes, or gunzips them for a client that does
// not accept gzip.
func (file *asset) bodyFor(r *http.Request, h http.Header) ([]byte, error) {
	if !file.gzipped {
		return file.body, nil
	}
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		h.Set("Content-Encoding", "gzip")
		return file.body, nil
	}
	file.once.Do(func() {
		zr, err := gzip.NewReader(bytes.NewReader(file.body))
		if err != nil {
			file.plainErr = err
			return
		}
		file.plain, file.plainErr = io.ReadAll(zr)
	})
	return file.plain, file.plainErr
}
