package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/wire"
)

// clientFlags are the flags every client command shares.
type clientFlags struct {
	url           string
	ca            string              // a PEM file of certificates to trust
	token, secret func(string) string // read after parsing; see secretFlag
}

// add registers the shared flags on fs.
func (f *clientFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", env("POPSUB_URL", "ws://127.0.0.1:8080"),
		"the broker's WebSocket URL, ws:// or wss:// (POPSUB_URL)")
	fs.StringVar(&f.ca, "ca", env("POPSUB_CA", ""), "trust the "+
		"certificates in this PEM file too, for a wss:// broker with a "+
		"self-signed one (POPSUB_CA)")
	f.token = secretFlag(fs, "token", "POPSUB_TOKEN",
		"token to authenticate with")
	f.secret = secretFlag(fs, "secret", "POPSUB_SECRET",
		"without --token, sign one for user \"cli\"")
}

// credentials returns the token to send, signing one if need be.
func (f *clientFlags) credentials() (string, error) {
	if token := f.token(""); token != "" {
		return token, nil
	}
	if secret := f.secret(""); secret != "" {
		return popsub.NewToken([]byte(secret), "cli", time.Hour)
	}
	return "", errors.New("no token: pass --token (popsub serve prints " +
		"one) or set POPSUB_TOKEN")
}

// clientCommand runs sub, pub, or with no command the original's demo.
// The command may come after the shared flags (client --url U pub …).
func clientCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	command, rest := splitCommand(args, "url", "ca", "token", "secret", "qos",
		"id", "after", "last", "durable", "group", "count", "ttl",
		"delay", "nak-delay")
	switch command {
	case "sub":
		return subCommand(ctx, rest, stdout, stderr)
	case "pub":
		return pubCommand(ctx, rest, stdout, stderr)
	case "frames":
		return framesCommand(ctx, rest, os.Stdin, stdout, stderr)
	case "":
		return demoCommand(ctx, rest, stdout, stderr)
	}
	return fmt.Errorf("unknown client command %q: use pub TOPIC PAYLOAD, "+
		"sub TOPIC, frames (type frames at the broker, NAME → {…} a line; "+
		"with --check, a transcript to compare), or no command for the "+
		"original's demo", command)
}

// splitCommand finds the first argument that is not a flag nor the value
// of one of valued, and returns it with the other arguments.
func splitCommand(args []string, valued ...string) (string, []string) {
	for i := 0; i < len(args); i++ {
		name, hasValue := strings.CutPrefix(args[i], "-")
		name = strings.TrimPrefix(name, "-")
		switch {
		case args[i] == "--":
			return "", args
		case !hasValue:
			rest := append(slices.Clone(args[:i]), args[i+1:]...)
			return args[i], rest
		case slices.Contains(valued, name):
			i++ // its value
		}
	}
	return "", args
}

// frame is any frame the broker sends: the protocol's own type.
type frame = wire.Received

// session is one authenticated connection.
type session struct {
	ws *websocket.Conn
}

// dialOptions are the WebSocket library's options for the flags: with
// --ca, a client that trusts its certificates beside the system's.
func (f *clientFlags) dialOptions() (*websocket.DialOptions, error) {
	if f.ca == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(f.ca)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca %s holds no PEM certificate", f.ca)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: transport}}, nil
}

// connect dials the broker and authenticates.
func connect(ctx context.Context, f clientFlags) (*session, error) {
	tok, err := f.credentials()
	if err != nil {
		return nil, err
	}
	options, err := f.dialOptions()
	if err != nil {
		return nil, err
	}
	ws, err := dialAuthenticated(ctx, f.url, options,
		map[string]any{"token": tok})
	if err != nil {
		return nil, err
	}
	return &session{ws: ws}, nil
}

// dialAuthenticated connects to url and sends an auth frame with the
// given fields (token, and batch or client if wanted), returning once
// the broker has said "authenticated". The bench uses it too.
func dialAuthenticated(ctx context.Context, url string,
	options *websocket.DialOptions, auth map[string]any) (*websocket.Conn,
	error) {
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, response, err := websocket.Dial(dialCtx, url, options)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w%s", url, err,
			dialHint(url, response, err))
	}
	ws.SetReadLimit(-1)
	s := &session{ws: ws}
	auth["type"] = "auth"
	if err := s.send(dialCtx, auth); err != nil {
		ws.CloseNow()
		return nil, err
	}
	reply, _, err := s.read(dialCtx)
	if err == nil && reply.Type != "authenticated" {
		err = fmt.Errorf("authentication refused: %s%s", reply.Message,
			refusalHint(reply.Code))
	}
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	return ws, nil
}

// dialHint says what most often makes a dial fail this way, or "".
func dialHint(url string, response *http.Response, err error) string {
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &unknown):
		return " (a self-signed certificate? trust it with --ca FILE)"
	case errors.As(err, &hostname) &&
		len(hostname.Certificate.DNSNames) == 0 &&
		len(hostname.Certificate.IPAddresses) == 0:
		return " (the certificate names its host only in its Common " +
			"Name, which Go no longer reads: make it with a " +
			"subjectAltName, such as openssl's -addext " +
			"subjectAltName=IP:127.0.0.1, or generate_cert.go --host)"
	case response != nil && response.StatusCode == http.StatusBadRequest &&
		strings.HasPrefix(url, "ws://"):
		return " (does the broker serve TLS? then use wss://)"
	}
	return ""
}

// refusalHint says what most often makes a broker refuse a token.
func refusalHint(code string) string {
	if code != "auth_failed" {
		return ""
	}
	return " (is the token from an earlier run of popsub serve? With no " +
		"secret configured, serve makes a new one each time it starts, " +
		"and the tokens of the last run no longer verify: use the token " +
		"it printed this time, or give serve a secret of its own with " +
		"--secret or POPSUB_SECRET, and sign tokens with popsub token)"
}

// send writes v as one JSON frame.
func (s *session) send(ctx context.Context, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if err := s.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// read returns the next frame, decoded and raw. An error frame is
// returned as a frame, not as an error: the caller decides.
func (s *session) read(ctx context.Context) (frame, []byte, error) {
	_, data, err := s.ws.Read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return frame{}, nil, ctx.Err()
		}
		return frame{}, nil, fmt.Errorf("read: %w", err)
	}
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		return frame{}, nil, fmt.Errorf("decode %s: %w", data, err)
	}
	return f, data, nil
}

// close says goodbye with 1000.
func (s *session) close() {
	s.ws.Close(websocket.StatusNormalClosure, "bye")
}

// ack acknowledges a QoS 1 delivery.
func (s *session) ack(ctx context.Context, f frame) error {
	return s.send(ctx, map[string]any{"type": "ack",
		"message_id": f.MessageID, "topic": f.Topic})
}

// payloadJSON uses text as JSON if it is valid JSON, and other text as a
// string, saying so on stderr. Text that starts like JSON and is not
// (`{"a":`) is a typo, refused with a way to send it anyway.
func payloadJSON(text string, stderr io.Writer) (json.RawMessage, error) {
	if json.Valid([]byte(text)) {
		return json.RawMessage(text), nil
	}
	quoted, _ := json.Marshal(text)
	if text != "" && strings.ContainsRune(`{["`, rune(text[0])) {
		problem := json.Unmarshal([]byte(text), new(any))
		return nil, fmt.Errorf("the payload is not valid JSON (%v); to "+
			"send it as a string, quote it: '%s'", problem, quoted)
	}
	fmt.Fprintf(stderr, "sending %s as the JSON string %s\n", text, quoted)
	return quoted, nil
}

// demoCommand is the original's example client: authenticate, subscribe
// to chat, publish a greeting, print everything until it comes back.
func demoCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	var cf clientFlags
	fs := newFlagSet("popsub client", stderr)
	cf.add(fs)
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := connect(ctx, cf)
	if err != nil {
		return err
	}
	defer s.close()
	fmt.Fprintln(stdout, "connected to", cf.url)

	frames := []map[string]any{
		{"type": "subscribe", "topic": "chat", "last": 0},
		{"type": "publish", "topic": "chat", "qos": 1,
			"payload": "Hello from the popsub client"},
	}
	for _, f := range frames {
		data, _ := json.Marshal(f)
		fmt.Fprintf(stdout, "→ %s\n", data)
		if err := s.send(ctx, f); err != nil {
			return err
		}
	}
	return printUntilEcho(ctx, s, stdout)
}

// printUntilEcho prints frames until both the demo's message and its
// confirm have arrived, acking the message.
func printUntilEcho(ctx context.Context, s *session, stdout io.Writer) error {
	delivered, confirmed := false, false
	for !delivered || !confirmed {
		f, data, err := s.read(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "← %s\n", data)
		switch f.Type {
		case "message":
			delivered = true
			if err := s.ack(ctx, f); err != nil {
				return err
			}
		case "published":
			confirmed = true
		case "error":
			return fmt.Errorf("broker said: %s (%s)", f.Message, f.Code)
		}
	}
	return nil
}
