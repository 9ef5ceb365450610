package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
)

// writeConfig writes a TOML file into the test's folder.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "popsub.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfig_AcceptsTheOriginalLayout(t *testing.T) {
	path := writeConfig(t, `
[server]
host = "127.0.0.1"
port = 9090
jwt_secret = "an-original-popsub-secret-of-32-bytes"

[broker]
max_connections = 50
message_ttl_secs = 120
`)
	cfg, err := parseServe([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.options
	if cfg.addr != "127.0.0.1:9090" || o.MaxConnections != 50 ||
		o.TTL != 2*time.Minute ||
		cfg.secret != "an-original-popsub-secret-of-32-bytes" {
		t.Fatalf("got addr %q, max %d, ttl %v, secret %q", cfg.addr,
			o.MaxConnections, o.TTL, cfg.secret)
	}
}

func TestConfig_UnknownKeysAreNamed(t *testing.T) {
	path := writeConfig(t, "[broker]\nmax_retrys = 3\n")
	_, err := parseServe([]string{"--config", path}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "broker.max_retrys") {
		t.Fatalf("got %v, want an error naming broker.max_retrys", err)
	}
}

func TestConfig_FlagThenEnvironmentThenFileThenDefault(t *testing.T) {
	path := writeConfig(t, `
[broker]
max_retries = 7
outbox_bytes = 64
ack_timeout = "2s"
`)
	t.Setenv("POPSUB_OUTBOX_BYTES", "128")
	t.Setenv("POPSUB_ACK_TIMEOUT", "3s")
	cfg, err := parseServe([]string{"--config", path, "--ack-timeout",
		"4s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.options
	if o.AckTimeout != 4*time.Second || o.OutboxBytes != 128 ||
		o.MaxRetries != 7 || o.MaxInflight != popsub.DefaultMaxInflight {
		t.Fatalf("ack %v (want the flag's 4s), outbox %d (the "+
			"environment's 128), retries %d (the file's 7), inflight %d "+
			"(the default)", o.AckTimeout, o.OutboxBytes, o.MaxRetries,
			o.MaxInflight)
	}
}

func TestConfig_UsersLogIn(t *testing.T) {
	var hash bytes.Buffer
	if err := hashPasswordCommand(nil, strings.NewReader("s3cret pass\n"),
		&hash, io.Discard); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, `
[server]
jwt_secret = "a-configured-secret-of-at-least-32-bytes"

[users.alice]
password_hash = "`+strings.TrimSpace(hash.String())+`"
publish = ["alice/#"]
`)
	url, _, _ := startServe(t, "--config", path)
	// A login hashes the password on purpose slowly: 600,000 rounds of
	// HMAC, many seconds under the race detector on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	wsjson.Write(ctx, ws, map[string]string{"type": "login",
		"username": "alice", "password": "s3cret pass"})
	var reply struct{ Type, Token string }
	if err := wsjson.Read(ctx, ws, &reply); err != nil ||
		reply.Type != "login_response" {
		t.Fatalf("login: %+v, %v", reply, err)
	}
	wsjson.Write(ctx, ws, map[string]string{"type": "auth",
		"token": reply.Token})
	if err := wsjson.Read(ctx, ws, &reply); err != nil ||
		reply.Type != "authenticated" {
		t.Fatalf("auth with the login token: %+v, %v", reply, err)
	}
}

func TestToken_CarriesGrants(t *testing.T) {
	secret := strings.Repeat("s", 32)
	var out bytes.Buffer
	err := run(context.Background(), []string{"token", "--sub", "sensor",
		"--secret", secret, "--publish", "sensors/#",
		"--subscribe", "sensors/+/config,$sys/#"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var claims popsub.Claims
	_, err = jwt.ParseWithClaims(strings.TrimSpace(out.String()), &claims,
		func(*jwt.Token) (any, error) { return []byte(secret), nil })
	if err != nil || strings.Join(claims.Publish, ",") != "sensors/#" ||
		strings.Join(claims.Subscribe, ",") != "sensors/+/config,$sys/#" {
		t.Fatalf("claims %+v, %v", claims, err)
	}
}

// A setting declared once answers to its flag, its variable and its key.
func TestConfig_ASettingAnswersToItsFlagVariableAndKey(t *testing.T) {
	path := writeConfig(t, "[broker]\nlogin_token_ttl = \"2h\"\n")
	for _, tc := range []struct {
		args []string
		env  string
		want time.Duration
	}{
		{nil, "", popsub.DefaultLoginTokenTTL},
		{[]string{"--config", path}, "", 2 * time.Hour},
		{[]string{"--config", path}, "3h", 3 * time.Hour},
		{[]string{"--config", path, "--login-token-ttl", "4h"}, "3h",
			4 * time.Hour},
	} {
		t.Setenv("POPSUB_LOGIN_TOKEN_TTL", tc.env)
		if tc.env == "" {
			os.Unsetenv("POPSUB_LOGIN_TOKEN_TTL")
		}
		cfg, err := parseServe(tc.args, io.Discard)
		if err != nil || cfg.options.LoginTokenTTL != tc.want {
			t.Errorf("%v with %q: LoginTokenTTL %v, %v; want %v", tc.args,
				tc.env, cfg.options.LoginTokenTTL, err, tc.want)
		}
	}
}
