package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/popsub/popsub"
)

// minSecretBytes is the shortest secret serve accepts: HS256 keys shorter
// than the hash (32 bytes) are guessable offline from one token.
const minSecretBytes = 32

// localTokenTTL is how long the token printed for a random secret lasts.
const localTokenTTL = 24 * time.Hour

// serveConfig is everything serve reads from flags and the environment.
type serveConfig struct {
	addr, db, secret, origins, logLevel string
	options                             popsub.Options
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

	// The secret: configured, or random for this run with a ready token.
	localToken := ""
	if cfg.secret == "" {
		cfg.options.Secret = randomSecret()
		localToken, err = popsub.NewToken(cfg.options.Secret, "local",
			localTokenTTL)
		if err != nil {
			return fmt.Errorf("make local token: %w", err)
		}
	} else if len(cfg.secret) < minSecretBytes {
		return fmt.Errorf("the secret is %d bytes; use at least %d "+
			"(for example: openssl rand -hex 32)", len(cfg.secret),
			minSecretBytes)
	} else {
		cfg.options.Secret = []byte(cfg.secret)
	}

	store, err := popsub.OpenBolt(cfg.db, logger)
	if err != nil {
		return err
	}
	cfg.options.Store = store
	broker, err := popsub.New(cfg.options)
	if err != nil {
		store.Close()
		return err
	}
	listener, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		broker.Shutdown(context.Background())
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	printBanner(stdout, listener.Addr().String(), cfg.db, localToken)
	return serveUntilDone(ctx, listener, broker, logger)
}

// parseServe reads serve's flags over its environment variables.
func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	var cfg serveConfig
	o := &cfg.options
	var errs []error
	integer := func(name string, fallback int) int {
		n, err := envInt(name, fallback)
		errs = append(errs, err)
		return n
	}
	duration := func(name string, fallback time.Duration) time.Duration {
		d, err := envDuration(name, fallback)
		errs = append(errs, err)
		return d
	}
	fs := newFlagSet("popsub serve", stderr)
	fs.StringVar(&cfg.addr, "addr", env("POPSUB_ADDR", "127.0.0.1:8080"),
		"address to listen on (POPSUB_ADDR)")
	fs.StringVar(&cfg.db, "db", env("POPSUB_DB", "popsub.db"),
		"bbolt database file (POPSUB_DB)")
	fs.StringVar(&cfg.secret, "secret", env("POPSUB_SECRET", ""),
		"token secret, at least 32 bytes; empty makes a random one "+
			"(POPSUB_SECRET)")
	fs.DurationVar(&o.AckTimeout, "ack-timeout", duration(
		"POPSUB_ACK_TIMEOUT", popsub.DefaultAckTimeout),
		"wait for an ack before a retry (POPSUB_ACK_TIMEOUT)")
	fs.IntVar(&o.MaxRetries, "max-retries", integer("POPSUB_MAX_RETRIES",
		popsub.DefaultMaxRetries),
		"retries before a dead letter (POPSUB_MAX_RETRIES)")
	fs.IntVar(&o.MaxMessages, "max-messages", integer(
		"POPSUB_MAX_MESSAGES", popsub.DefaultMaxMessages),
		"messages kept per topic (POPSUB_MAX_MESSAGES)")
	fs.DurationVar(&o.TTL, "ttl", duration("POPSUB_TTL", popsub.DefaultTTL),
		"how long messages are kept (POPSUB_TTL)")
	frame := fs.Int("max-frame", integer("POPSUB_MAX_FRAME",
		popsub.DefaultMaxFrameBytes),
		"largest incoming frame in bytes (POPSUB_MAX_FRAME)")
	fs.IntVar(&o.Outbox, "outbox", integer("POPSUB_OUTBOX",
		popsub.DefaultOutbox),
		"frames queued per connection (POPSUB_OUTBOX)")
	fs.IntVar(&o.MaxInflight, "max-inflight", integer(
		"POPSUB_MAX_INFLIGHT", popsub.DefaultMaxInflight),
		"unacked QoS 1 deliveries per connection (POPSUB_MAX_INFLIGHT)")
	fs.DurationVar(&o.AuthTimeout, "auth-timeout", duration(
		"POPSUB_AUTH_TIMEOUT", popsub.DefaultAuthTimeout),
		"time a new connection has to authenticate (POPSUB_AUTH_TIMEOUT)")
	fs.StringVar(&cfg.origins, "origins", env("POPSUB_ORIGINS", ""),
		"foreign browser origins allowed, comma-separated "+
			"(POPSUB_ORIGINS)")
	fs.StringVar(&cfg.logLevel, "log-level", env("POPSUB_LOG_LEVEL", "info"),
		"debug, info, warn or error (POPSUB_LOG_LEVEL)")
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	if _, err := parseInterleaved(fs, args); err != nil {
		return cfg, err
	}
	o.MaxFrameBytes = int64(*frame)
	o.OriginPatterns = splitList(cfg.origins)
	return cfg, checkServe(cfg)
}

// checkServe rejects values that cannot work, naming the flag.
func checkServe(cfg serveConfig) error {
	o := cfg.options
	for name, v := range map[string]int64{
		"ack-timeout": int64(o.AckTimeout), "max-retries": int64(o.MaxRetries),
		"max-messages": int64(o.MaxMessages), "ttl": int64(o.TTL),
		"max-frame": o.MaxFrameBytes, "outbox": int64(o.Outbox),
		"max-inflight": int64(o.MaxInflight),
		"auth-timeout": int64(o.AuthTimeout),
	} {
		if v <= 0 {
			return fmt.Errorf("--%s must be greater than zero", name)
		}
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

// randomSecret returns 32 random bytes for a run without a secret.
func randomSecret() []byte {
	secret := make([]byte, 32)
	rand.Read(secret)
	return []byte(hex.EncodeToString(secret))
}

// printBanner tells the user where the broker is and how to reach it.
func printBanner(w io.Writer, addr, db, localToken string) {
	host := strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1)
	fmt.Fprintf(w, "popsub listening on http://%s (WebSocket at ws://%s/ws,"+
		" database %s)\n", host, host, db)
	if localToken == "" {
		return
	}
	fmt.Fprintf(w, "no secret configured: made a random one for this run.\n"+
		"token for user \"local\" (valid 24h):\n  %s\n"+
		"try: popsub client --url ws://%s --token %s\n",
		localToken, host, localToken)
}

// serveUntilDone serves HTTP until ctx ends, then closes clients with
// 1001, flushes the log and closes the database.
func serveUntilDone(ctx context.Context, listener net.Listener,
	broker *popsub.Broker, logger *slog.Logger) error {
	server := &http.Server{Handler: routes(broker),
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
// the original's clients expect; other requests to / get a short page.
func routes(broker *popsub.Broker) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/ws", broker)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			broker.ServeHTTP(w, r)
			return
		}
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "PopSub is running. Connect a WebSocket client to "+
			"/ws and send {\"type\":\"auth\",\"token\":\"…\"} first.\n")
	})
	return mux
}
