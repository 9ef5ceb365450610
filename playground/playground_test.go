package playground

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// get requests path from the handler with the given headers.
func get(t *testing.T, path string, header map[string]string) *http.Response {
	t.Helper()
	request := httptest.NewRequest("GET", path, nil)
	for k, v := range header {
		request.Header.Set(k, v)
	}
	recorder := httptest.NewRecorder()
	Handler([]string{"alice"}).ServeHTTP(recorder, request)
	return recorder.Result()
}

func TestHandler_ServesThePageWithVersionedAssets(t *testing.T) {
	response := get(t, "/", nil)
	body, _ := io.ReadAll(response.Body)
	if response.StatusCode != 200 || !strings.Contains(string(body),
		`id="alice-connect"`) || !strings.Contains(string(body),
		"/static/popsub.wasm?v=") {
		t.Fatalf("page: %d\n%s", response.StatusCode, body)
	}
}

func TestHandler_ServesTheClientCompressedAndCacheable(t *testing.T) {
	assets := loadAssets()
	wasm := assets["popsub.wasm"]
	if wasm == nil {
		t.Fatal("popsub.wasm.gz is not embedded: run go generate ./playground")
	}
	url := assets.url("popsub.wasm")

	t.Run("gzip for clients that take it, cached for a year", func(t *testing.T) {
		r := get(t, url, map[string]string{"Accept-Encoding": "gzip"})
		h := r.Header
		if h.Get("Content-Type") != "application/wasm" ||
			h.Get("Content-Encoding") != "gzip" || h.Get("ETag") == "" ||
			!strings.Contains(h.Get("Cache-Control"), "immutable") {
			t.Fatalf("headers %v", h)
		}
	})
	t.Run("plain WebAssembly for clients that do not", func(t *testing.T) {
		r := get(t, url, nil)
		magic := make([]byte, 4)
		io.ReadFull(r.Body, magic)
		if r.Header.Get("Content-Encoding") != "" || string(magic) != "\x00asm" {
			t.Fatalf("got encoding %q and magic %q", r.Header.Get(
				"Content-Encoding"), magic)
		}
	})
	t.Run("304 for a client that has this version", func(t *testing.T) {
		r := get(t, url, map[string]string{"If-None-Match": wasm.etag})
		if r.StatusCode != http.StatusNotModified {
			t.Fatalf("status %d, want 304", r.StatusCode)
		}
	})
	t.Run("an unversioned URL must revalidate", func(t *testing.T) {
		r := get(t, "/static/popsub.wasm", nil)
		if r.Header.Get("Cache-Control") != "no-cache" {
			t.Fatalf("Cache-Control %q", r.Header.Get("Cache-Control"))
		}
	})
	t.Run("the embedded client is a valid gzip stream", func(t *testing.T) {
		zr, err := gzip.NewReader(strings.NewReader(string(wasm.body)))
		if err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, zr); err != nil || n < 1<<20 {
			t.Fatalf("gunzipped %d bytes, %v", n, err)
		}
	})
}
