package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
	"github.com/popsub/popsub/docs"
	"github.com/popsub/popsub/gateway"
	"github.com/popsub/popsub/jetstream"
	"github.com/popsub/popsub/jsclient"
	labpage "github.com/popsub/popsub/lab/page"
	"github.com/popsub/popsub/playground"
	"github.com/popsub/popsub/wasmbuild"
)

// minSecretBytes is the shortest secret serve accepts: HS256 keys shorter
// than the hash (32 bytes) are guessable offline from one token.
const minSecretBytes = 32

// localTokenTTL is how long the token printed for a random secret lasts.
const localTokenTTL = 24 * time.Hour

// serveConfig is everything serve reads from flags and the environment.
type serveConfig struct {
	addr, db, secret, logLevel string
	secretFrom                 string // where secret came from
	nats                       string // a NATS URL, or bbolt
	natsReplicas               int
	tlsCert, tlsKey            string // PEM files; both or neither
	pages                      string // a folder served at /pages/
	options                    popsub.Options
}

// serve runs the broker until ctx ends, then shuts it down gracefully.
func serve(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	cfg, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	logger, err := newLogger(cfg.logLevel, stderr)
	if err != nil {
		return err
	}
	cfg.options.Logger = logger

	// The secret: configured, or random for this run. Either way the
	// playground's link carries a token for user local, signed with it.
	random := cfg.secret == ""
	switch {
	case random:
		cfg.options.Secret = randomSecret()
	case len(cfg.secret) < minSecretBytes:
		return shortSecret(cfg.secretFrom, len(cfg.secret))
	default:
		cfg.options.Secret = []byte(cfg.secret)
	}
	localToken, err := localClaims().Sign(cfg.options.Secret)
	if err != nil {
		return fmt.Errorf("make local token: %w", err)
	}

	// The address first: a busy port must not leave a database behind.
	// With a certificate, the same port speaks TLS: https and wss.
	// The pages' folder before anything is opened: a mistyped --pages
	// is a mistake to hear about at once.
	var pages *os.Root
	if cfg.pages != "" {
		if pages, err = os.OpenRoot(cfg.pages); err != nil {
			return fmt.Errorf("--pages: %w", err)
		}
		defer pages.Close()
	}

	// --max-connections caps sockets of every kind, WebSocket or HTTP,
	// here below TLS, as the broker caps its sessions.
	listener, err := listen(cfg.addr)
	if err != nil {
		return err
	}
	listener = gateway.Limit(listener, cfg.options.MaxConnections)
	if listener, err = withTLS(listener, cfg.tlsCert, cfg.tlsKey); err != nil {
		return err
	}
	store, where, err := openLog(cfg, logger)
	if err != nil {
		listener.Close()
		return err
	}
	cfg.options.Store = store
	ops := newOperations(store)
	cfg.options.OnEvent = ops.observe
	broker, err := popsub.New(cfg.options)
	if err != nil {
		listener.Close()
		store.Close()
		return err
	}
	if cfg.pages != "" {
		where += ", the pages of " + cfg.pages + " at /pages/"
	}
	printBanner(stdout, scheme{tls: cfg.tlsCert != ""},
		listener.Addr().String(), where, localToken, random)
	ops.watch(broker)
	page := playground.Settings{Clients: []string{"alice", "bob", "carol"},
		AckTimeout: cmp.Or(cfg.options.AckTimeout, popsub.DefaultAckTimeout),
		MaxRetries: cfg.options.MaxRetries,
		RetryBackoff: cmp.Or(cfg.options.RetryBackoff,
			popsub.DefaultRetryBackoff),
		MaxRetryDelay: cmp.Or(cfg.options.MaxRetryDelay,
			popsub.DefaultMaxRetryDelay)}
	// A publish body may fill the frame but for the frame around it.
	topics := gateway.New(broker, gateway.Options{Logger: logger,
		MaxBody: cmp.Or(cfg.options.MaxFrameBytes,
			popsub.DefaultMaxFrameBytes) - 1024,
		WriteTimeout: gateway.WriteTimeoutFor(cmp.Or(
			cfg.options.WriteTimeout, popsub.DefaultWriteTimeout)),
		Origins: cfg.options.OriginPatterns})
	handler := routes(broker, page, ops)
	go reportPageBuilds(logger)
	if pages != nil {
		handler = withPages(handler, pages)
	}
	handler = withTopics(handler, topics)
	return serveUntilDone(ctx, listener, handler, broker, ops, logger,
		topics.Close)
}

// openLog opens the log serve was asked for: a bbolt file, or with
// --nats a JetStream log shared with every broker using that NATS. It
// returns the log and how the banner names it.
func openLog(cfg serveConfig, logger *slog.Logger) (popsub.Store, string,
	error) {
	if cfg.nats == "" {
		store, err := boltstore.Open(cfg.db, logger)
		switch {
		case errors.Is(err, boltstore.ErrInUse):
			err = fmt.Errorf("%w (perhaps by another popsub serve in this "+
				"folder: stop it, or give this one a file of its own, such "+
				"as --db popsub-2.db)", err)
		case errors.Is(err, boltstore.ErrDamaged):
			err = fmt.Errorf("%w: 'popsub db check --db %s' shows what is "+
				"readable, 'popsub db salvage' copies it out", err, cfg.db)
		}
		return store, "database " + cfg.db, err
	}
	o := cfg.options
	store, err := jetstream.Open(jetstream.Options{URL: cfg.nats,
		Replicas: cfg.natsReplicas, MaxMessages: o.MaxMessages,
		MaxBytes: int64(o.MaxLogBytes), MaxAge: o.TTL, Logger: logger})
	return store, "log on NATS JetStream at " + cfg.nats, err
}

// withTLS wraps listener in TLS with the certificate in certFile and its
// key in keyFile, or returns it as it is when both are empty.
func withTLS(listener net.Listener, certFile, keyFile string) (net.Listener,
	error) {
	if certFile == "" && keyFile == "" {
		return listener, nil
	}
	if certFile == "" || keyFile == "" {
		listener.Close()
		return nil, errors.New("--tls-cert and --tls-key go together: " +
			"give both, or neither for plain http")
	}
	certificate, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		listener.Close()
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	// HTTP/2 stays off: a WebSocket upgrade needs HTTP/1.1.
	return tls.NewListener(listener, &tls.Config{
			Certificates: []tls.Certificate{certificate},
			MinVersion:   tls.VersionTLS12, NextProtos: []string{"http/1.1"}}),
		nil
}

// listen opens addr, or says what to do when it cannot.
func listen(addr string) (net.Listener, error) {
	listener, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("listen on %s: the address is in use, "+
			"perhaps by another popsub serve: stop it, or give this one "+
			"an address and a database of its own: --addr "+
			"127.0.0.1:8081 --db popsub-8081.db", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return listener, nil
}

// secretSource names where serve's secret came from, for its errors.
func secretSource(fs *flag.FlagSet, path string) string {
	from := "jwt_secret in " + path
	if os.Getenv("POPSUB_SECRET") != "" {
		from = "POPSUB_SECRET"
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "secret" {
			from = "--secret"
		}
	})
	return from
}

// shortSecret is the error for a secret under minSecretBytes, naming
// where it came from.
func shortSecret(from string, length int) error {
	return fmt.Errorf("%s is %d bytes; use at least %d (for example: "+
		"openssl rand -hex 32)", from, length, minSecretBytes)
}

// parseServe reads serve's settings (settings.go). Precedence: a flag,
// then its environment variable, then the config file, then the default.
func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	var cfg serveConfig
	settings := serveSettings(&cfg)
	var file configFile
	path := configPath(args)
	if path != "" {
		var err error
		if file, err = loadConfig(path, settings); err != nil {
			return cfg, err
		}
		cfg.options.Users = file.users
	}
	fs := newFlagSet("popsub serve", stderr)
	errs := applySettings(settings, file.values, fs)
	secret := secretFlag(fs, "secret", "POPSUB_SECRET", "token secret, at "+
		"least 32 bytes; empty makes a random one")
	fs.String("config", path, "TOML configuration file (POPSUB_CONFIG)")
	fs.Usage = settingsUsage(fs)
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		return cfg, err
	}
	if len(positional) > 0 {
		return cfg, fmt.Errorf("serve takes no arguments, only flags "+
			"(got %q); see popsub serve -h", positional)
	}
	cfg.secret, cfg.secretFrom = secret(file.secret), secretSource(fs, path)
	if err := checkSettings(settings); err != nil {
		return cfg, err
	}
	// The flag's 0 is "none"; the broker's zero is "the default".
	if cfg.options.MaxRetries == 0 {
		cfg.options.MaxRetries = -1
	}
	return cfg, nil
}

// newLogger returns a text logger at the named level.
func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or "+
			"error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})),
		nil
}

// localClaims are the grants of the token printed for a random secret:
// everything, including the broker's own $sys and $dead topics, because
// only the person who started the broker can see it.
func localClaims() popsub.Claims {
	var claims popsub.Claims
	claims.Subject = "local"
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(localTokenTTL))
	claims.Subscribe = []string{"#", "$sys/#", "$dead/#"}
	claims.Publish = []string{"#"}
	return claims
}

// randomSecret returns 32 random bytes for a run without a secret.
func randomSecret() []byte {
	secret := make([]byte, 32)
	rand.Read(secret)
	return []byte(hex.EncodeToString(secret))
}

// scheme names the URL schemes a broker serves: http and ws, or with
// TLS https and wss.
type scheme struct{ tls bool }

// page is the scheme of the broker's pages.
func (s scheme) page() string {
	if s.tls {
		return "https"
	}
	return "http"
}

// socket is the scheme of the broker's WebSocket.
func (s scheme) socket() string {
	if s.tls {
		return "wss"
	}
	return "ws"
}

// printBanner tells the user where the broker is and how to reach it.
func printBanner(w io.Writer, s scheme, addr, where, localToken string,
	random bool) {
	host := strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1)
	fmt.Fprintf(w, "popsub listening on %s://%s (playground at /, lab at /lab/, "+
		"WebSocket at %s://%s/ws, %s)\n", s.page(), host, s.socket(), host,
		where)
	if !random {
		// The link's token is signed with the configured secret: whoever
		// can read this terminal could sign one anyway.
		fmt.Fprintf(w, "open the playground: %s://%s/#token=%s\n", s.page(),
			host, localToken)
		return
	}
	fmt.Fprintf(w, "no secret configured: made a random one for this run.\n"+
		"open the playground: %s://%s/#token=%s\n"+
		"token for user \"local\" (valid 24h):\n  %s\n"+
		"try: %s client --url %s://%s --token %s\n",
		s.page(), host, localToken, localToken, commandName(), s.socket(),
		host, localToken)
}

// commandName is how the user ran this command, for a line they may copy:
// go run builds the binary in a go-build folder.
func commandName() string {
	if strings.Contains(os.Args[0], "go-build") {
		return "go run ./cmd/popsub"
	}
	return "popsub"
}

// serveUntilDone serves HTTP until ctx ends, then closes clients with
// 1001, flushes the log and closes the database. onShutdown runs as the
// shutdown begins: it ends the streams, which would otherwise keep their
// requests, and so the shutdown, waiting.
func serveUntilDone(ctx context.Context, listener net.Listener,
	handler http.Handler, broker *popsub.Broker, ops *operations,
	logger *slog.Logger, onShutdown func()) error {
	server := gateway.NewServer(handler, gateway.DoorOptions{Logger: logger,
		OnHandshakeError: ops.handshakeFailed})
	server.RegisterOnShutdown(onShutdown)
	failed := make(chan error, 1)
	go func() { failed <- server.Serve(listener) }()

	select {
	case err := <-failed:
		onShutdown()
		broker.Shutdown(context.Background())
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	ops.stopping.Store(true)
	stop, cancel := context.WithTimeout(context.Background(),
		10*time.Second)
	defer cancel()
	server.Shutdown(stop)
	finished := make(chan error, 1)
	go func() { finished <- broker.Shutdown(stop) }()
	select {
	case err := <-finished:
		if err != nil {
			return err
		}
	case <-time.After(shutdownStuck):
		// A stop that hangs is worse than one that skips the flush: the
		// log loses nothing confirmed either way, as after kill -9. The
		// stacks say where it hung.
		stacks := make([]byte, 1<<20)
		stacks = stacks[:runtime.Stack(stacks, true)]
		logger.Error("shutdown stuck: stopping without it", "after",
			shutdownStuck, "goroutines", string(stacks))
		return fmt.Errorf("shutdown did not finish in %v", shutdownStuck)
	}
	logger.Info("stopped cleanly")
	return nil
}

// shutdownStuck is how long serve waits for the broker's shutdown before
// it gives up on it: the 10 s given to the clients, and as long again for
// the loops, the log's last commit and the store's close.
const shutdownStuck = 20 * time.Second

// routes serves the WebSocket at /ws, and at / for upgrade requests as
// the original's clients expect; the JavaScript client at /popsub.js;
// popsub.go as a page at /source; the lab at /lab/; the protocol,
// machine-readable, at /asyncapi.json; the tutorials and references as
// pages under /docs/; /metrics, /healthz and /readyz for an operator's
// tools; other requests get the playground. HTTP publish and Server-Sent
// Events at /topics/{topic} come before it (withTopics).
func routes(broker *popsub.Broker, settings playground.Settings,
	ops *operations) http.Handler {
	page := playground.Handler(settings)
	mux := http.NewServeMux()
	ops.register(mux)
	mux.Handle("/ws", broker)
	mux.Handle("GET /popsub.js", javascriptClient())
	mux.Handle("GET /source", playground.Document("text/html; charset=utf-8",
		docs.SourcePage))
	mux.Handle("GET /lab/", http.StripPrefix("/lab", labpage.Handler(docs.SourcePage)))
	mux.Handle("GET /asyncapi.json", playground.Document("application/json",
		docs.AsyncAPI))
	serveDocs(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			broker.ServeHTTP(w, r)
			return
		}
		page.ServeHTTP(w, r)
	})
	return mux
}

// reportPageBuilds logs how the pages' WebAssembly, which this binary
// does not hold, was built from the checkout as serve started, or why it
// could not be: until then the playground and the lab wait for it.
func reportPageBuilds(logger *slog.Logger) {
	for pkg, build := range wasmbuild.Started() {
		logger.Info("building a page's WebAssembly from this checkout",
			"package", pkg)
		if err := build.Wait(); err != nil {
			logger.Error("a page's WebAssembly did not build", "package",
				pkg, "err", err)
			continue
		}
		logger.Info("built a page's WebAssembly", "package", pkg,
			"took", build.Took.Round(100*time.Millisecond))
	}
}

// pageKinds are the files --pages serves, by extension: what a page
// needs, and nothing a folder may also hold by accident, such as a
// config file with a secret in it, or the database.
var pageKinds = map[string]bool{".html": true, ".js": true, ".mjs": true,
	".css": true, ".svg": true, ".png": true, ".jpg": true, ".ico": true,
	".webp": true, ".woff2": true}

// withTopics serves HTTP publish and Server-Sent Events at
// /topics/{topic} with topics, the path as sent, and everything else
// with handler. A ServeMux would first redirect a path it cleans, such as
// /topics/a//b or /topics/a/./b, to the clean one, and a client that
// follows the redirect, as fetch and EventSource do, would publish to,
// or read, another topic: a//b is a topic of its own, as on a socket.
func withTopics(handler, topics http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/topics/") {
			topics.ServeHTTP(w, r)
			return
		}
		handler.ServeHTTP(w, r)
	})
}

// withPages serves the pages in folder at /pages/, beside handler. The
// pages share the broker's origin, so their sockets need no --origins.
// The folder is opened as an os.Root, so that no path, and no symbolic
// link, leads out of it; a folder's address serves its index.html, and
// a folder is never listed.
func withPages(handler http.Handler, root *os.Root) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", handler)
	mux.Handle("GET /pages", http.RedirectHandler("/pages/",
		http.StatusMovedPermanently))
	mux.HandleFunc("GET /pages/{path...}", func(w http.ResponseWriter,
		r *http.Request) {
		servePage(w, r, root, r.PathValue("path"))
	})
	return mux
}

// servePage serves the file at name inside root, index.html for a
// folder, if it is a page.
func servePage(w http.ResponseWriter, r *http.Request, root *os.Root,
	name string) {
	if name == "" || strings.HasSuffix(name, "/") {
		name += "index.html"
	}
	hidden := strings.HasPrefix(name, ".") || strings.Contains(name, "/.")
	if hidden || !pageKinds[strings.ToLower(filepath.Ext(name))] {
		http.Error(w, "--pages serves pages (.html, .js, .css, "+
			"pictures), not "+name, http.StatusNotFound)
		return
	}
	file, err := root.Open(name)
	if err != nil {
		http.Error(w, "no page "+name, http.StatusNotFound)
		return
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil || info.IsDir() {
		http.Error(w, "no page "+name, http.StatusNotFound)
		return
	}
	http.ServeContent(w, r, name, info.ModTime(), file)
}

// javascriptClient serves popsub.js, gzipped and revalidated like the
// other assets, to pages of any origin: a module script from another
// origin is fetched with CORS, and popsub.js holds nothing secret. Its
// sockets are another matter: --origins decides.
func javascriptClient() http.Handler {
	module := playground.Document("text/javascript; charset=utf-8",
		jsclient.Source)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		module.ServeHTTP(w, r)
	})
}

// serveDocs serves the docs as HTML under /docs/, gzipped like every
// other asset, each page at /docs/NAME and, for links made before they
// were pages, at /docs/NAME.md. The pages are the binary's own, and the
// tests render every one, so a failure here is a build's bug: the broker
// serves on without its docs.
func serveDocs(mux *http.ServeMux) {
	pages, pictures, err := docs.Pages()
	if err != nil {
		return
	}
	for _, page := range pages {
		where := "/docs/" + page.Name
		html := playground.Document("text/html; charset=utf-8", page.HTML)
		if page.Name == "" {
			mux.Handle("GET /docs/{$}", html)
			continue
		}
		mux.Handle("GET "+where, html)
		mux.Handle("GET "+where+".md", http.RedirectHandler(where,
			http.StatusMovedPermanently))
	}
	for name, picture := range pictures {
		mux.Handle("GET /docs/"+name, playground.Document("image/png",
			picture))
	}
	// protocol.md links the machine-readable protocol beside it.
	mux.Handle("GET /docs/asyncapi.json", http.RedirectHandler(
		"/asyncapi.json", http.StatusMovedPermanently))
}
