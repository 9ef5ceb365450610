package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and
// localhost, and its key, as PEM files in a folder of the test's.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	return selfSignedNaming(t, true)
}

// selfSignedNaming is selfSigned, with subjectAltNames or, without, with
// the host in its Common Name only, as an old openssl recipe makes it.
func selfSignedNaming(t *testing.T, sans bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{SerialNumber: big.NewInt(1),
		Subject:     pkix.Name{Organization: []string{"PopSub test"}},
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:        true, BasicConstraintsValid: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"}}
	if !sans {
		template.IPAddresses, template.DNSNames = nil, nil
		template.Subject.CommonName = "127.0.0.1"
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template,
		&key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"),
		filepath.Join(dir, "key.pem")
	write := func(path, kind string, der []byte) {
		data := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(certFile, "CERTIFICATE", der)
	write(keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// trusting is an HTTP client that trusts the certificate in certFile.
func trusting(t *testing.T, certFile string) *http.Client {
	t.Helper()
	data, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(data)
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func TestServe_TLS(t *testing.T) {
	cert, key := selfSigned(t)
	url, token, _ := startServe(t, "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(url, "wss://") {
		t.Fatalf("serve with a certificate listens on %s, want wss://", url)
	}
	page := "https" + strings.TrimPrefix(url, "wss")
	web := trusting(t, cert)

	t.Run("the client speaks wss with --ca", func(t *testing.T) {
		out := runClient(t, "pub", "chat", `"over TLS"`, "--qos", "1",
			"--url", url, "--ca", cert, "--token", token)
		if !strings.Contains(out, `"type":"published"`) {
			t.Fatalf("pub printed %q", out)
		}
	})
	t.Run("without --ca it says how to trust the certificate",
		func(t *testing.T) {
			_, _, err := runCapture("client", "pub", "chat", "1", "--url",
				url, "--token", token)
			if err == nil || !strings.Contains(err.Error(), "--ca FILE") {
				t.Fatalf("got %v, want a hint naming --ca", err)
			}
		})
	t.Run("the playground and the JavaScript client are https",
		func(t *testing.T) {
			for _, path := range []string{"/", "/popsub.js", "/docs/"} {
				res, err := web.Get(page + path)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Errorf("GET %s: %s", path, res.Status)
				}
			}
		})
	t.Run("HTTP publish and a stream are https", func(t *testing.T) {
		status, body := post(t, web, page+"/topics/chat", token,
			`"by curl"`)
		if status != 200 || !strings.Contains(body, `"seq":2`) {
			t.Fatalf("POST: %d %s", status, body)
		}
		res, err := web.Get(page + "/topics/chat?after=1&access_token=" +
			token)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		lines := bufio.NewScanner(res.Body)
		for lines.Scan() {
			if strings.Contains(lines.Text(), `"payload":"by curl"`) {
				return
			}
		}
		t.Fatal("the stream ended without the message")
	})
}

func TestServe_TLSNeedsBothFiles(t *testing.T) {
	cert, _ := selfSigned(t)
	_, _, err := runCapture("serve", "--addr", "127.0.0.1:0", "--db",
		filepath.Join(t.TempDir(), "x.db"), "--tls-cert", cert)
	if err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Fatalf("got %v, want an error naming --tls-key", err)
	}
}

func TestServe_StopEndsItsStreams(t *testing.T) {
	url, token, stop := startServe(t)
	page := "http" + strings.TrimPrefix(url, "ws")
	res, err := http.Get(page + "/topics/chat?access_token=" + token)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	lines := bufio.NewScanner(res.Body)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "event: subscribed") {
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	var last string
	for lines.Scan() {
		if lines.Text() != "" {
			last = lines.Text()
		}
	}
	if !strings.Contains(last, `"close":1001`) {
		t.Errorf("the stream ended with %q, want a closed event for 1001",
			last)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

func TestServe_PagesServesOnlyPages(t *testing.T) {
	site := t.TempDir()
	for name, text := range map[string]string{"chat.html": "<p>chat",
		"app.js": "export {}", "popsub.toml": "secret = 'x'",
		"popsub.db": "data", ".env": "SECRET=x"} {
		os.WriteFile(filepath.Join(site, name), []byte(text), 0o600)
	}
	// A link out of the folder leads nowhere; a folder's address serves
	// its index.html, and a folder without one is not listed.
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret.html"), []byte("<p>x"),
		0o600)
	os.Symlink(filepath.Join(outside, "secret.html"),
		filepath.Join(site, "leak.html"))
	os.Symlink(outside, filepath.Join(site, "out"))
	os.WriteFile(filepath.Join(site, "index.html"), []byte("<p>home"), 0o600)
	os.Mkdir(filepath.Join(site, "empty"), 0o700)
	os.WriteFile(filepath.Join(site, "empty", "x.js"), nil, 0o600)
	url, _, _ := startServe(t, "--pages", site)
	page := "http" + strings.TrimPrefix(url, "ws") + "/pages/"
	for name, want := range map[string]int{"chat.html": 200, "app.js": 200,
		"popsub.toml": 404, "popsub.db": 404, ".env": 404,
		"../popsub.toml": 404, "leak.html": 404, "out/secret.html": 404,
		"": 200, "index.html": 200, "empty/": 404, "empty": 404} {
		res, err := http.Get(page + name)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("GET /pages/%s: %s, want %d", name, res.Status, want)
		}
		index := name == "" || name == "index.html"
		if index && string(body) != "<p>home" {
			t.Errorf("GET /pages/%s: %q, want the index page", name, body)
		}
	}
}

// The playground over TLS: the page comes over https, and its clients
// connect over wss.
func TestPlayground_OverTLS(t *testing.T) {
	chromium := browser(t)
	cert, key := selfSigned(t)
	url, token, _ := startServe(t, "--tls-cert", cert, "--tls-key", key)
	page := "https" + strings.TrimPrefix(url, "wss") + "/#token=" + token
	ctx, _ := startBrowser(t, chromium,
		chromedp.Flag("ignore-certificate-errors", true))
	do(t, ctx, "open the playground", chromedp.Navigate(page))
	until(t, ctx, "the x-ray is connected", exists(`#banner[data-state="up"]`))
	until(t, ctx, "alice connects",
		exists(`#alice-status[data-state="connected"]`))
}

func TestServe_TLSFromTheConfigFileAndTheEnvironment(t *testing.T) {
	cert, key := selfSigned(t)
	t.Run("the config file", func(t *testing.T) {
		config := filepath.Join(t.TempDir(), "popsub.toml")
		os.WriteFile(config, []byte("[server]\ntls_cert = '"+cert+
			"'\ntls_key = '"+key+"'\n"), 0o600)
		url, _, _ := startServe(t, "--config", config)
		if !strings.HasPrefix(url, "wss://") {
			t.Fatalf("serve listens on %s, want wss://", url)
		}
	})
	t.Run("the environment", func(t *testing.T) {
		t.Setenv("POPSUB_TLS_CERT", cert)
		t.Setenv("POPSUB_TLS_KEY", key)
		url, _, _ := startServe(t)
		if !strings.HasPrefix(url, "wss://") {
			t.Fatalf("serve listens on %s, want wss://", url)
		}
	})
}

// A topic's path is the one sent: a//b and a/./b are topics of their
// own, as on a socket, not a redirect to a/b, which fetch and
// EventSource would follow to publish to, or read, another topic. With
// --pages a second router stands in front, and the same holds.
func TestServe_TopicsAreTheirPathsAsSent(t *testing.T) {
	for _, pages := range []bool{false, true} {
		var extra []string
		if pages {
			extra = []string{"--pages", t.TempDir()}
		}
		url, token, _ := startServe(t, extra...)
		base := "http" + strings.TrimPrefix(url, "ws") + "/topics/"
		// A stream that lacks the message ends at the client's timeout.
		web := &http.Client{Timeout: 10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			}}
		for _, topic := range []string{"a//b", "a/./b", "/c", "d/"} {
			status, body := post(t, web, base+topic+"?message_id=m",
				token, `"here"`)
			if want := `"topic":"` + topic + `"`; status != 200 ||
				!strings.Contains(body, want) {
				t.Errorf("pages %v: POST /topics/%s: %d %s, want 200 and %s",
					pages, topic, status, body, want)
			}
		}
		res, err := web.Get(base + "a//b?after=0&access_token=" + token)
		if err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(res.Body)
		found := false
		for !found && lines.Scan() {
			found = strings.Contains(lines.Text(),
				`"topic":"a//b","payload":"here"`)
		}
		res.Body.Close()
		if !found {
			t.Errorf("pages %v: GET /topics/a//b: %s, without the message "+
				"published there", pages, res.Status)
		}
	}
}

// post publishes body with token's bearer on web, and returns the
// answer's status and body.
func post(t *testing.T, web *http.Client, url, token,
	body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := web.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res.StatusCode, string(answer)
}
