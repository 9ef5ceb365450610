package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/popsub/popsub"
)

// fileConfig is the TOML configuration file. It accepts the original
// PopSub's config/default.toml layout ([server] host, port, jwt_secret;
// [broker] max_connections, message_ttl_secs), so its users can bring
// their file, plus a key for everything the flags cover.
type fileConfig struct {
	Server struct {
		Host      string   `toml:"host"`       // the original's
		Port      int      `toml:"port"`       // the original's
		JWTSecret string   `toml:"jwt_secret"` // the original's
		Addr      string   `toml:"addr"`       // wins over host and port
		DB        string   `toml:"db"`
		NATS      string   `toml:"nats"`
		Replicas  int      `toml:"nats_replicas"`
		Origins   []string `toml:"origins"`
		LogLevel  string   `toml:"log_level"`
		Issuer    string   `toml:"issuer"`
		Audience  string   `toml:"audience"`
	} `toml:"server"`
	Broker struct {
		MaxConnections int      `toml:"max_connections"`  // the original's
		MessageTTLSecs int      `toml:"message_ttl_secs"` // the original's
		AckTimeout     duration `toml:"ack_timeout"`
		MaxRetries     *int     `toml:"max_retries"` // 0 is none
		MaxMessages    int      `toml:"max_messages"`
		MaxLogBytes    int      `toml:"max_log_bytes"`
		TTL            duration `toml:"ttl"`
		MaxFrame       int      `toml:"max_frame"`
		OutboxBytes    int      `toml:"outbox_bytes"`
		MaxInflight    int      `toml:"max_inflight"`
		InflightBytes  int      `toml:"max_inflight_bytes"`
		WriteTimeout   duration `toml:"write_timeout"`
		AuthTimeout    duration `toml:"auth_timeout"`
		PublishRate    float64  `toml:"publish_rate"`
		PingInterval   duration `toml:"ping_interval"`
	} `toml:"broker"`
	Users map[string]struct {
		PasswordHash string   `toml:"password_hash"`
		Publish      []string `toml:"publish"`
		Subscribe    []string `toml:"subscribe"`
	} `toml:"users"`
}

// duration is a TOML string such as "5s" or "1h".
type duration time.Duration

// UnmarshalText parses a duration string.
func (d *duration) UnmarshalText(text []byte) error {
	parsed, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("%q is not a duration (try 5s or 1h)", text)
	}
	*d = duration(parsed)
	return nil
}

// loadConfig reads a TOML file. A key PopSub does not know is an error
// that names it: a typo must not silently fall back to a default.
func loadConfig(path string) (fileConfig, error) {
	var cfg fileConfig
	meta, err := toml.DecodeFile(path, &cfg)
	if err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if unknown := meta.Undecoded(); len(unknown) > 0 {
		keys := make([]string, len(unknown))
		for i, key := range unknown {
			keys[i] = key.String()
		}
		return cfg, fmt.Errorf("config %s: unknown key %s", path,
			strings.Join(keys, ", "))
	}
	return cfg, nil
}

// configPath finds --config in args, or POPSUB_CONFIG. It is read before
// the flags, because the file's values are the flags' defaults.
func configPath(args []string) string {
	for i, arg := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if name != "config" || !strings.HasPrefix(arg, "-") {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return os.Getenv("POPSUB_CONFIG")
}

// defaults turns the file into serve's defaults, over the built-in ones.
func (f fileConfig) defaults() serveDefaults {
	d := builtinDefaults()
	s, b := f.Server, f.Broker
	if s.Host != "" || s.Port != 0 {
		host, port := "127.0.0.1", "8080"
		if s.Host != "" {
			host = s.Host
		}
		if s.Port != 0 {
			port = strconv.Itoa(s.Port)
		}
		d.addr = net.JoinHostPort(host, port)
	}
	d.addr = orString(s.Addr, d.addr)
	d.db = orString(s.DB, d.db)
	d.nats = orString(s.NATS, d.nats)
	d.natsReplicas = orInt(s.Replicas, d.natsReplicas)
	d.secret = orString(s.JWTSecret, d.secret)
	d.logLevel = orString(s.LogLevel, d.logLevel)
	d.issuer, d.audience = s.Issuer, s.Audience
	if len(s.Origins) > 0 {
		d.origins = strings.Join(s.Origins, ",")
	}
	d.maxConnections = orInt(b.MaxConnections, d.maxConnections)
	if b.MessageTTLSecs > 0 {
		d.ttl = time.Duration(b.MessageTTLSecs) * time.Second
	}
	d.ttl = orDuration(b.TTL, d.ttl)
	d.ackTimeout = orDuration(b.AckTimeout, d.ackTimeout)
	if b.MaxRetries != nil {
		d.maxRetries = *b.MaxRetries
	}
	d.maxMessages = orInt(b.MaxMessages, d.maxMessages)
	d.maxLogBytes = orInt(b.MaxLogBytes, d.maxLogBytes)
	d.maxFrame = orInt(b.MaxFrame, d.maxFrame)
	d.outboxBytes = orInt(b.OutboxBytes, d.outboxBytes)
	d.maxInflight = orInt(b.MaxInflight, d.maxInflight)
	d.inflightBytes = orInt(b.InflightBytes, d.inflightBytes)
	d.writeTimeout = orDuration(b.WriteTimeout, d.writeTimeout)
	d.authTimeout = orDuration(b.AuthTimeout, d.authTimeout)
	d.pingInterval = orDuration(b.PingInterval, d.pingInterval)
	if b.PublishRate > 0 {
		d.publishRate = b.PublishRate
	}
	return d
}

// users converts the file's users for the broker.
func (f fileConfig) users() (map[string]popsub.User, error) {
	users := map[string]popsub.User{}
	for name, u := range f.Users {
		if !strings.HasPrefix(u.PasswordHash, "pbkdf2-sha256$") {
			return nil, errors.New("config: user " + name + " needs a " +
				"password_hash from 'popsub hash-password'")
		}
		users[name] = popsub.User{PasswordHash: u.PasswordHash,
			Publish: u.Publish, Subscribe: u.Subscribe}
	}
	return users, nil
}

// orString returns v, or fallback when v is empty.
func orString(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}

// orInt returns v, or fallback when v is zero.
func orInt(v, fallback int) int {
	if v == 0 {
		return fallback
	}
	return v
}

// orDuration returns v, or fallback when v is zero.
func orDuration(v duration, fallback time.Duration) time.Duration {
	if v == 0 {
		return fallback
	}
	return time.Duration(v)
}
