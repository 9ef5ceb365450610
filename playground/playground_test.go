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
	Handler(Settings{Clients: []string{"alice"}}).ServeHTTP(recorder, request)
	return recorder.Result()
}

// built waits for the client's build (or finds it embedded): every page
// of the process then names its versioned address.
func built(t *testing.T, assets assets) *asset {
	t.Helper()
	wasm, err := assets["popsub.wasm"].ready()
	if err != nil {
		t.Fatalf("the client's WebAssembly: %v", err)
	}
	return wasm
}

func TestHandler_ServesThePageWithVersionedAssets(t *testing.T) {
	built(t, loadAssets())
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
	wasm := built(t, assets)
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
	t.Run("the client is a valid gzip stream", func(t *testing.T) {
		zr, err := gzip.NewReader(strings.NewReader(string(wasm.body)))
		if err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, zr); err != nil || n < 1<<20 {
			t.Fatalf("gunzipped %d bytes, %v", n, err)
		}
	})
}

func TestHandler_CompressesEveryAsset(t *testing.T) {
	assets := loadAssets()
	built(t, assets)
	for name := range assets {
		r := get(t, assets.url(name), map[string]string{
			"Accept-Encoding": "gzip"})
		if r.Header.Get("Content-Encoding") != "gzip" {
			t.Errorf("%s is sent uncompressed", name)
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := io.ReadAll(zr); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func TestDocument_IsCompressedAndRevalidated(t *testing.T) {
	body := strings.Repeat("<p>prose beside code</p>\n", 1000)
	handler := Document("text/html; charset=utf-8", []byte(body))
	fetch := func(header map[string]string) *http.Response {
		request := httptest.NewRequest("GET", "/source", nil)
		for k, v := range header {
			request.Header.Set(k, v)
		}
		recorder := httptest.NewRecorder()
		handler.ServeHTTP(recorder, request)
		return recorder.Result()
	}
	zipped := fetch(map[string]string{"Accept-Encoding": "gzip"})
	h := zipped.Header
	if h.Get("Content-Encoding") != "gzip" || h.Get("ETag") == "" ||
		h.Get("Cache-Control") != "no-cache" {
		t.Fatalf("headers %v, want gzip, an ETag and no-cache", h)
	}
	compressed, _ := io.ReadAll(zipped.Body)
	if len(compressed) >= len(body)/10 {
		t.Fatalf("%d bytes compressed from %d", len(compressed), len(body))
	}
	plain, _ := io.ReadAll(fetch(nil).Body)
	if string(plain) != body {
		t.Fatal("a client without gzip does not get the page as it is")
	}
	again := fetch(map[string]string{"If-None-Match": h.Get("ETag")})
	if again.StatusCode != http.StatusNotModified {
		t.Fatalf("revalidation got %d, want 304", again.StatusCode)
	}
}
