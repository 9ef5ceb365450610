package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/popsub/popsub"
)

// This file declares serve's settings, each once: its flag, the
// environment variable named after it (--ack-timeout is
// POPSUB_ACK_TIMEOUT), its key in the config file, its default, what -h
// says, and its check. Adding a setting is one line in serveSettings,
// and a field for it to fill. A flag wins over the environment, which
// wins over the file, which wins over the default.

// serveSettings lists serve's settings; each fills a field of cfg.
func serveSettings(c *serveConfig) []setting {
	o := &c.options
	return []setting{
		text("addr", "server.addr", "127.0.0.1:8080", "address to listen on",
			&c.addr, nil),
		text("db", "server.db", "popsub.db", "bbolt database file", &c.db,
			nil),
		text("pages", "server.pages", "", "serve this folder's pages "+
			"(.html, .js, .css, pictures) at /pages/, for an app of your "+
			"own", &c.pages, nil),
		text("tls-cert", "server.tls_cert", "", "serve https and wss with "+
			"this PEM certificate (with --tls-key)", &c.tlsCert, nil),
		text("tls-key", "server.tls_key", "", "the certificate's PEM "+
			"private key", &c.tlsKey, nil),
		text("nats", "server.nats", "", "keep the log on NATS JetStream at "+
			"this URL, shared by every broker using it, instead of --db",
			&c.nats, nil),
		number("nats-replicas", "server.nats_replicas", 1, "NATS servers "+
			"keeping each topic, 3 on a cluster", &c.natsReplicas, positive),
		span("ack-timeout", "broker.ack_timeout", popsub.DefaultAckTimeout,
			"wait for an ack before a retry", &o.AckTimeout, positive),
		number("max-retries", "broker.max_retries", popsub.DefaultMaxRetries,
			"retries before a dead letter, 0 for none", &o.MaxRetries,
			notNegative),
		number("retry-backoff", "broker.retry_backoff",
			float64(popsub.DefaultRetryBackoff), "each retry waits this "+
				"many times longer than the one before, 1 for no growth",
			&o.RetryBackoff, atLeastOne),
		span("max-retry-delay", "broker.max_retry_delay",
			popsub.DefaultMaxRetryDelay, "the longest wait between retries",
			&o.MaxRetryDelay, positive),
		number("max-messages", "broker.max_messages",
			popsub.DefaultMaxMessages, "messages kept per topic",
			&o.MaxMessages, positive),
		number("max-log-bytes", "broker.max_log_bytes",
			popsub.DefaultMaxLogBytes, "bytes kept per topic", &o.MaxLogBytes,
			positive),
		span("ttl", "broker.ttl", popsub.DefaultTTL, "how long messages are "+
			"kept", &o.TTL, positive),
		number[int64]("max-frame", "broker.max_frame",
			popsub.DefaultMaxFrameBytes, "largest incoming frame in bytes",
			&o.MaxFrameBytes, positive),
		number("outbox-bytes", "broker.outbox_bytes",
			popsub.DefaultOutboxBytes, "bytes queued per connection",
			&o.OutboxBytes, positive),
		number("max-inflight", "broker.max_inflight",
			popsub.DefaultMaxInflight, "unacked QoS 1 deliveries per "+
				"connection", &o.MaxInflight, positive),
		number("max-inflight-bytes", "broker.max_inflight_bytes",
			popsub.DefaultMaxInflightBytes, "their bytes, per connection",
			&o.MaxInflightBytes, positive),
		number("max-subscriptions", "broker.max_subscriptions",
			popsub.DefaultMaxSubscriptions, "subscriptions one connection "+
				"may hold at once", &o.MaxSubscriptions, positive),
		number("max-topics", "broker.max_topics",
			popsub.DefaultMaxTopics, "topics the broker holds at once",
			&o.MaxTopics, positive),
		number("group-window", "broker.group_window",
			popsub.DefaultGroupWindow, "unacked QoS 1 jobs per member of "+
				"a work queue", &o.GroupWindow, positive),
		number("max-delayed", "broker.max_delayed",
			popsub.DefaultMaxDelayed, "delayed messages waiting per topic "+
				"and per token", &o.MaxDelayed, positive),
		number("max-delayed-bytes", "broker.max_delayed_bytes",
			popsub.DefaultMaxDelayedBytes, "their bytes, per topic and per "+
				"token", &o.MaxDelayedBytes, positive),
		span("write-timeout", "broker.write_timeout",
			popsub.DefaultWriteTimeout, "wait for a peer that does not read, "+
				"then cut it off", &o.WriteTimeout, positive),
		span("auth-timeout", "broker.auth_timeout",
			popsub.DefaultAuthTimeout, "time a new connection has to "+
				"authenticate", &o.AuthTimeout, upTo(10*time.Second)),
		span("ping-interval", "broker.ping_interval",
			popsub.DefaultPingInterval, "how often connections are pinged",
			&o.PingInterval, positive),
		span("login-token-ttl", "broker.login_token_ttl",
			popsub.DefaultLoginTokenTTL, "how long a token from login is "+
				"valid", &o.LoginTokenTTL, positive),
		number("max-connections", "broker.max_connections", 0,
			"open sockets allowed, WebSocket and HTTP, 0 for no cap",
			&o.MaxConnections, notNegative),
		number("publish-rate", "broker.publish_rate", 0.0, "publishes per "+
			"second per connection, 0 for no cap", &o.PublishRate,
			notNegative),
		text("issuer", "server.issuer", "", "required token iss, if set",
			&o.Issuer, nil),
		text("audience", "server.audience", "", "required token aud, if set",
			&o.Audience, nil),
		list("origins", "server.origins", "foreign browser origins allowed "+
			"to open a WebSocket, publish and stream, comma-separated",
			&o.OriginPatterns),
		text("log-level", "server.log_level", "info", "debug, info, warn or "+
			"error", &c.logLevel, nil),
	}
}

// setting is one of serve's settings, bound to the field it fills.
type setting struct {
	flag, key, usage string
	value            settingValue
}

// variable is the setting's environment variable: POPSUB_ and its flag
// in capitals, - as _.
func (s setting) variable() string {
	return "POPSUB_" + strings.ToUpper(strings.ReplaceAll(s.flag, "-", "_"))
}

// settingValue is a setting's field as the flag package, the config file
// and the checks see it.
type settingValue interface {
	flag.Value
	fromFile(v any) error // a value as the TOML decoder gives it
	check() error         // nil if the value can work
	kind() string         // what -h calls its values: duration, …
}

// settingField is a settingValue of type T.
type settingField[T any] struct {
	at    *T
	parse func(string) (T, error)
	what  string        // what a good value looks like, for errors
	name  string        // what -h calls its values
	valid func(T) error // nil: any value
	file  func(any) (T, bool)
}

// Set parses text into the field.
func (f settingField[T]) Set(text string) error {
	v, err := f.parse(text)
	if err != nil {
		return fmt.Errorf("not %s", f.what)
	}
	*f.at = v
	return nil
}

// String is the field's value, for -h.
func (f settingField[T]) String() string {
	if f.at == nil {
		return ""
	}
	if list, ok := any(*f.at).([]string); ok {
		return strings.Join(list, ",")
	}
	return fmt.Sprint(*f.at)
}

// fromFile takes a value from the config file.
func (f settingField[T]) fromFile(v any) error {
	if text, ok := v.(string); ok {
		return f.Set(text)
	}
	got, ok := f.file(v)
	if !ok {
		return fmt.Errorf("%v is not %s", v, f.what)
	}
	*f.at = got
	return nil
}

// kind is what -h calls the field's values.
func (f settingField[T]) kind() string { return f.name }

// check runs the field's check.
func (f settingField[T]) check() error {
	if f.valid == nil {
		return nil
	}
	return f.valid(*f.at)
}

// text is a setting of a string.
func text(name, key, def, usage string, at *string,
	valid func(string) error) setting {
	*at = def
	return setting{name, key, usage, settingField[string]{at: at, what: "a string", name: "string",
		parse: func(s string) (string, error) { return s, nil },
		valid: valid, file: func(any) (string, bool) { return "", false }}}
}

// span is a setting of a duration, written "5s" or "1h".
func span(name, key string, def time.Duration, usage string,
	at *time.Duration, valid func(time.Duration) error) setting {
	*at = def
	return setting{name, key, usage, settingField[time.Duration]{at: at,
		what: "a duration (try 5s or 1h)", name: "duration",
		parse: time.ParseDuration,
		valid: valid, file: func(any) (time.Duration, bool) { return 0, false }}}
}

// number is a setting of an integer or a float.
func number[T int | int64 | float64](name, key string, def T, usage string,
	at *T, valid func(T) error) setting {
	*at = def
	what, kind := "a whole number", "int"
	parse := func(s string) (T, error) {
		n, err := strconv.ParseInt(s, 10, 64)
		return T(n), err
	}
	if _, ok := any(def).(float64); ok {
		what, kind = "a number", "number"
		parse = func(s string) (T, error) {
			n, err := strconv.ParseFloat(s, 64)
			return T(n), err
		}
	}
	return setting{name, key, usage, settingField[T]{at: at, what: what,
		name: kind, parse: parse, valid: valid, file: func(v any) (T, bool) {
			switch n := v.(type) {
			case int64:
				return T(n), true
			case float64:
				return T(n), what == "a number"
			}
			return 0, false
		}}}
}

// list is a setting of a list: comma-separated in a flag or a variable,
// an array in the file.
func list(name, key, usage string, at *[]string) setting {
	return setting{name, key, usage, settingField[[]string]{at: at,
		what: "a list", name: "list", parse: func(s string) ([]string,
			error) {
			return splitList(s), nil
		}, file: func(v any) ([]string, bool) {
			items, ok := v.([]any)
			var out []string
			for _, item := range items {
				s, isText := item.(string)
				ok = ok && isText
				out = append(out, s)
			}
			return out, ok
		}}}
}

// positive, notNegative and upTo are the settings' checks.
func positive[T int | int64 | float64 | time.Duration](v T) error {
	if v <= 0 {
		return errors.New("must be greater than zero")
	}
	return nil
}

// notNegative refuses a negative value.
func notNegative[T int | int64 | float64](v T) error {
	if v < 0 {
		return errors.New("may not be negative")
	}
	return nil
}

// atLeastOne refuses a multiplier that would shrink what it multiplies.
func atLeastOne(v float64) error {
	if v < 1 {
		return errors.New("must be 1 or more")
	}
	return nil
}

// upTo refuses a duration that is not positive or is over limit.
func upTo(limit time.Duration) func(time.Duration) error {
	return func(v time.Duration) error {
		if err := positive(v); err != nil {
			return err
		}
		if v > limit {
			return fmt.Errorf("must be at most %s", limit)
		}
		return nil
	}
}

// applySettings fills cfg from the file's values (by key), then the
// environment, and registers each setting's flag on fs, to fill it
// last. It returns every malformed value, each naming where it came
// from.
func applySettings(settings []setting, file map[string]any,
	fs *flag.FlagSet) []error {
	var errs []error
	for _, s := range settings {
		if v, ok := file[s.key]; ok {
			if err := s.value.fromFile(v); err != nil {
				errs = append(errs, fmt.Errorf("config: %s: %w", s.key, err))
			}
		}
		if v, ok := os.LookupEnv(s.variable()); ok {
			if err := s.value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", s.variable(), v,
					err))
			}
		}
		fs.Var(s.value, s.flag, s.usage+" ("+s.variable()+")")
	}
	return errs
}

// settingsUsage prints -h: each flag with the kind of its values, what
// it does, its environment variable and its default.
func settingsUsage(fs *flag.FlagSet) func() {
	return func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: popsub serve [flags]\n\nflags, each "+
			"with its environment variable; a config file's keys are in "+
			"README.md:\n")
		fs.VisitAll(func(f *flag.Flag) {
			kind := "string"
			if v, ok := f.Value.(settingValue); ok {
				kind = v.kind()
			}
			fmt.Fprintf(out, "  -%s %s\n    \t%s", f.Name, kind, f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(out, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(out)
		})
	}
}

// checkSettings runs every setting's check, naming the flag that failed.
func checkSettings(settings []setting) error {
	for _, s := range settings {
		if err := s.value.check(); err != nil {
			return fmt.Errorf("--%s %w", s.flag, err)
		}
	}
	return nil
}
