package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/cmd/popsub/jetstream"
	"github.com/popsub/popsub/docs"
	"github.com/popsub/popsub/playground"
)

// minSecretBytes is the shortest secret serve accepts: HS256 keys shorter
// than the hash (32 bytes) are guessable offline from one token.
const minSecretBytes = 32

// localTokenTTL is how long the token printed for a random secret lasts.
const localTokenTTL = 24 * time.Hour

// serveConfig is everything serve reads from flags and the environment.
type serveConfig struct {
	addr, db, secret, origins, logLevel string
	secretFrom                          string // where secret came from
	nats                                string // a NATS URL, or bbolt
	natsReplicas                        int
	options                             popsub.Options
}

// serveDefaults are serve's settings before the environment and flags:
// the built-in defaults, overridden by the config file if there is one.
type serveDefaults struct {
	addr, db, secret, origins, logLevel, issuer, audience    string
	nats                                                     string
	natsReplicas                                             int
	ackTimeout, ttl, authTimeout, pingInterval, writeTimeout time.Duration
	maxRetries, maxMessages, maxFrame, maxInflight           int
	outboxBytes, inflightBytes, maxConnections, maxLogBytes  int
	publishRate                                              float64
}

// builtinDefaults are the package's defaults, for a run with no file.
func builtinDefaults() serveDefaults {
	return serveDefaults{
		addr: "127.0.0.1:8080", db: "popsub.db", logLevel: "info",
		natsReplicas: 1,
		ackTimeout:   popsub.DefaultAckTimeout, ttl: popsub.DefaultTTL,
		authTimeout:   popsub.DefaultAuthTimeout,
		pingInterval:  popsub.DefaultPingInterval,
		maxRetries:    popsub.DefaultMaxRetries,
		maxMessages:   popsub.DefaultMaxMessages,
		maxLogBytes:   popsub.DefaultMaxLogBytes,
		maxFrame:      popsub.DefaultMaxFrameBytes,
		outboxBytes:   popsub.DefaultOutboxBytes,
		maxInflight:   popsub.DefaultMaxInflight,
		inflightBytes: popsub.DefaultMaxInflightBytes,
		writeTimeout:  popsub.DefaultWriteTimeout,
	}
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
	listener, err := listen(cfg.addr)
	if err != nil {
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
	printBanner(stdout, listener.Addr().String(), where, localToken, random)
	ops.watch(broker)
	page := playground.Settings{Clients: []string{"alice", "bob", "carol"},
		AckTimeout:    cmp.Or(cfg.options.AckTimeout, popsub.DefaultAckTimeout),
		MaxRetries:    cfg.options.MaxRetries,
		RetryInterval: popsub.RetryInterval(cfg.options.AckTimeout)}
	return serveUntilDone(ctx, listener, routes(broker, page, ops), broker,
		ops, logger)
}

// openLog opens the log serve was asked for: a bbolt file, or with
// --nats a JetStream log shared with every broker using that NATS. It
// returns the log and how the banner names it.
func openLog(cfg serveConfig, logger *slog.Logger) (popsub.Store, string,
	error) {
	if cfg.nats == "" {
		store, err := popsub.OpenBolt(cfg.db, logger)
		if errors.Is(err, popsub.ErrInUse) {
			err = fmt.Errorf("%w (perhaps by another popsub serve in this "+
				"folder: stop it, or give this one a file of its own, such "+
				"as --db popsub-2.db)", err)
		}
		return store, "database " + cfg.db, err
	}
	o := cfg.options
	store, err := jetstream.Open(jetstream.Options{URL: cfg.nats,
		Replicas: cfg.natsReplicas, MaxMessages: o.MaxMessages,
		MaxBytes: int64(o.MaxLogBytes), MaxAge: o.TTL, Logger: logger})
	return store, "log on NATS JetStream at " + cfg.nats, err
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

// parseServe reads serve's settings. Precedence: a flag, then its
// environment variable, then the config file, then the default.
func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	var cfg serveConfig
	d := builtinDefaults()
	path := configPath(args)
	if path != "" {
		file, err := loadConfig(path)
		if err != nil {
			return cfg, err
		}
		if cfg.options.Users, err = file.users(); err != nil {
			return cfg, err
		}
		d = file.defaults()
	}
	fs, frame, errs := serveFlags(&cfg, d, stderr)
	secret := secretFlag(fs, "secret", "POPSUB_SECRET", "token secret, at "+
		"least 32 bytes; empty makes a random one")
	fs.String("config", path, "TOML configuration file (POPSUB_CONFIG)")
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
	cfg.secret, cfg.secretFrom = secret(d.secret), secretSource(fs, path)
	cfg.options.MaxFrameBytes = int64(*frame)
	cfg.options.OriginPatterns = splitList(cfg.origins)
	if err := checkServe(cfg); err != nil {
		return cfg, err
	}
	// The flag's 0 is "none"; the broker's zero is "the default".
	if cfg.options.MaxRetries == 0 {
		cfg.options.MaxRetries = -1
	}
	return cfg, nil
}

// serveFlags declares serve's flags over the environment and d, and
// returns any malformed environment values.
func serveFlags(cfg *serveConfig, d serveDefaults,
	stderr io.Writer) (*flag.FlagSet, *int, []error) {
	o := &cfg.options
	var errs []error
	integer := func(name string, fallback int) int {
		n, err := envInt(name, fallback)
		errs = append(errs, err)
		return n
	}
	duration := func(name string, fallback time.Duration) time.Duration {
		v, err := envDuration(name, fallback)
		errs = append(errs, err)
		return v
	}
	fs := newFlagSet("popsub serve", stderr)
	fs.StringVar(&cfg.addr, "addr", env("POPSUB_ADDR", d.addr),
		"address to listen on (POPSUB_ADDR)")
	fs.StringVar(&cfg.db, "db", env("POPSUB_DB", d.db),
		"bbolt database file (POPSUB_DB)")
	fs.StringVar(&cfg.nats, "nats", env("POPSUB_NATS", d.nats), "keep the "+
		"log on NATS JetStream at this URL, shared by every broker "+
		"using it, instead of --db (POPSUB_NATS)")
	fs.IntVar(&cfg.natsReplicas, "nats-replicas", integer(
		"POPSUB_NATS_REPLICAS", d.natsReplicas), "NATS servers keeping "+
		"each topic, 3 on a cluster (POPSUB_NATS_REPLICAS)")
	fs.DurationVar(&o.AckTimeout, "ack-timeout", duration(
		"POPSUB_ACK_TIMEOUT", d.ackTimeout),
		"wait for an ack before a retry (POPSUB_ACK_TIMEOUT)")
	fs.IntVar(&o.MaxRetries, "max-retries", integer("POPSUB_MAX_RETRIES",
		d.maxRetries), "retries before a dead letter, 0 for none "+
		"(POPSUB_MAX_RETRIES)")
	fs.IntVar(&o.MaxMessages, "max-messages", integer(
		"POPSUB_MAX_MESSAGES", d.maxMessages),
		"messages kept per topic (POPSUB_MAX_MESSAGES)")
	fs.IntVar(&o.MaxLogBytes, "max-log-bytes", integer(
		"POPSUB_MAX_LOG_BYTES", d.maxLogBytes),
		"bytes kept per topic (POPSUB_MAX_LOG_BYTES)")
	fs.DurationVar(&o.TTL, "ttl", duration("POPSUB_TTL", d.ttl),
		"how long messages are kept (POPSUB_TTL)")
	frame := fs.Int("max-frame", integer("POPSUB_MAX_FRAME", d.maxFrame),
		"largest incoming frame in bytes (POPSUB_MAX_FRAME)")
	fs.IntVar(&o.OutboxBytes, "outbox-bytes", integer("POPSUB_OUTBOX_BYTES",
		d.outboxBytes), "bytes queued per connection (POPSUB_OUTBOX_BYTES)")
	fs.IntVar(&o.MaxInflight, "max-inflight", integer(
		"POPSUB_MAX_INFLIGHT", d.maxInflight),
		"unacked QoS 1 deliveries per connection (POPSUB_MAX_INFLIGHT)")
	fs.IntVar(&o.MaxInflightBytes, "max-inflight-bytes", integer(
		"POPSUB_MAX_INFLIGHT_BYTES", d.inflightBytes), "their bytes, "+
		"per connection (POPSUB_MAX_INFLIGHT_BYTES)")
	fs.DurationVar(&o.WriteTimeout, "write-timeout", duration(
		"POPSUB_WRITE_TIMEOUT", d.writeTimeout), "wait for a peer that "+
		"does not read, then cut it off (POPSUB_WRITE_TIMEOUT)")
	fs.DurationVar(&o.AuthTimeout, "auth-timeout", duration(
		"POPSUB_AUTH_TIMEOUT", d.authTimeout),
		"time a new connection has to authenticate (POPSUB_AUTH_TIMEOUT)")
	fs.DurationVar(&o.PingInterval, "ping-interval", duration(
		"POPSUB_PING_INTERVAL", d.pingInterval),
		"how often connections are pinged (POPSUB_PING_INTERVAL)")
	fs.IntVar(&o.MaxConnections, "max-connections", integer(
		"POPSUB_MAX_CONNECTIONS", d.maxConnections),
		"open connections allowed, 0 for no cap (POPSUB_MAX_CONNECTIONS)")
	rate, err := envFloat("POPSUB_PUBLISH_RATE", d.publishRate)
	errs = append(errs, err)
	fs.Float64Var(&o.PublishRate, "publish-rate", rate, "publishes per "+
		"second per connection, 0 for no cap (POPSUB_PUBLISH_RATE)")
	fs.StringVar(&o.Issuer, "issuer", env("POPSUB_ISSUER", d.issuer),
		"required token iss, if set (POPSUB_ISSUER)")
	fs.StringVar(&o.Audience, "audience", env("POPSUB_AUDIENCE", d.audience),
		"required token aud, if set (POPSUB_AUDIENCE)")
	fs.StringVar(&cfg.origins, "origins", env("POPSUB_ORIGINS", d.origins),
		"foreign browser origins allowed, comma-separated "+
			"(POPSUB_ORIGINS)")
	fs.StringVar(&cfg.logLevel, "log-level", env("POPSUB_LOG_LEVEL",
		d.logLevel), "debug, info, warn or error (POPSUB_LOG_LEVEL)")
	return fs, frame, errs
}

// checkServe rejects values that cannot work, naming the flag.
func checkServe(cfg serveConfig) error {
	o := cfg.options
	for name, v := range map[string]int64{
		"ack-timeout":  int64(o.AckTimeout),
		"max-messages": int64(o.MaxMessages), "ttl": int64(o.TTL),
		"max-log-bytes": int64(o.MaxLogBytes),
		"max-frame":     o.MaxFrameBytes, "outbox-bytes": int64(o.OutboxBytes),
		"max-inflight":       int64(o.MaxInflight),
		"max-inflight-bytes": int64(o.MaxInflightBytes),
		"write-timeout":      int64(o.WriteTimeout),
		"auth-timeout":       int64(o.AuthTimeout),
		"ping-interval":      int64(o.PingInterval),
	} {
		if v <= 0 {
			return fmt.Errorf("--%s must be greater than zero", name)
		}
	}
	if o.MaxConnections < 0 || o.PublishRate < 0 || o.MaxRetries < 0 {
		return errors.New("--max-connections, --publish-rate and " +
			"--max-retries may not be negative")
	}
	if o.AuthTimeout > 10*time.Second {
		return errors.New("--auth-timeout must be at most 10s")
	}
	return nil
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

// printBanner tells the user where the broker is and how to reach it.
func printBanner(w io.Writer, addr, where, localToken string,
	random bool) {
	host := strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1)
	fmt.Fprintf(w, "popsub listening on http://%s (playground at /, "+
		"WebSocket at ws://%s/ws, %s)\n", host, host, where)
	if !random {
		// The link's token is signed with the configured secret: whoever
		// can read this terminal could sign one anyway.
		fmt.Fprintf(w, "open the playground: http://%s/#token=%s\n", host,
			localToken)
		return
	}
	fmt.Fprintf(w, "no secret configured: made a random one for this run.\n"+
		"open the playground: http://%s/#token=%s\n"+
		"token for user \"local\" (valid 24h):\n  %s\n"+
		"try: %s client --url ws://%s --token %s\n",
		host, localToken, localToken, commandName(), host, localToken)
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
// 1001, flushes the log and closes the database.
func serveUntilDone(ctx context.Context, listener net.Listener,
	handler http.Handler, broker *popsub.Broker, ops *operations,
	logger *slog.Logger) error {
	server := &http.Server{Handler: handler,
		ReadHeaderTimeout: 10 * time.Second}
	failed := make(chan error, 1)
	go func() { failed <- server.Serve(listener) }()

	select {
	case err := <-failed:
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
	if err := broker.Shutdown(stop); err != nil {
		return err
	}
	logger.Info("stopped cleanly")
	return nil
}

// routes serves the WebSocket at /ws, and at / for upgrade requests as
// the original's clients expect; popsub.go as a page at /source; the
// tutorials and references as pages under /docs/; /metrics,
// /healthz and /readyz for an operator's tools; other requests get the
// playground.
func routes(broker *popsub.Broker, settings playground.Settings,
	ops *operations) http.Handler {
	page := playground.Handler(settings)
	mux := http.NewServeMux()
	ops.register(mux)
	mux.Handle("/ws", broker)
	mux.Handle("GET /source", playground.Document("text/html; charset=utf-8",
		docs.SourcePage))
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
}
