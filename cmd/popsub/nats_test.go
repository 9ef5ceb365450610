package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/popsub/popsub/jetstream/natstest"
)

// startNATS runs a NATS server with JetStream on 127.0.0.1 in the test
// process and returns its URL.
func startNATS(t *testing.T) string { return natstest.Start(t).ClientURL() }

func TestServe_TwoBrokersOnOneNATSShareTheLog(t *testing.T) {
	nats := startNATS(t)
	secret := "a-secret-both-brokers-share-32-bytes-long"
	one, _, _ := startServe(t, "--nats", nats, "--secret", secret)
	t.Setenv("POPSUB_NATS", nats) // the environment works as the flag
	two, _, _ := startServe(t, "--secret", secret)

	token := strings.TrimSpace(runToken(t, "--sub", "alice", "--secret",
		secret))
	runClient(t, "--url", one, "--token", token, "pub", "news", `"first"`,
		"--qos", "1", "--id", "n-1")
	// The second broker replays what the first one published, at the
	// same seq: one log.
	out := runClient(t, "--url", two, "--token", token, "sub", "news",
		"--after", "0", "--count", "1")
	if !strings.Contains(out, `"message_id":"n-1"`) ||
		!strings.Contains(out, `"seq":1`) {
		t.Fatalf("second broker replayed %q", out)
	}
}

// runToken runs the token command and returns what it printed.
func runToken(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"token"}, args...),
		&stdout, &stderr)
	if err != nil {
		t.Fatalf("token %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

func TestServe_SaysWhatIsWrongWithTheNATSItIsGiven(t *testing.T) {
	plain := natstest.Run(t, &server.Options{Host: "127.0.0.1", Port: -1,
		NoSigs: true, NoLog: true})
	for url, want := range map[string]string{
		plain.ClientURL():    "start nats-server with -js",
		"nats://127.0.0.1:1": "is a nats-server with -js running there?",
	} {
		err := run(context.Background(), []string{"serve", "--addr",
			"127.0.0.1:0", "--nats", url, "--log-level", "error"},
			io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("serve --nats %s: %v, want %q", url, err, want)
		}
	}
}

func TestConfig_NamesTheNATSLog(t *testing.T) {
	path := writeConfig(t, `
[server]
nats = "nats://10.0.0.7:4222"
nats_replicas = 3
`)
	cfg, err := parseServe([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.nats != "nats://10.0.0.7:4222" || cfg.natsReplicas != 3 {
		t.Fatalf("got nats %q, replicas %d, want the file's", cfg.nats,
			cfg.natsReplicas)
	}
	// The environment wins over the file, and the flag over both.
	t.Setenv("POPSUB_NATS", "nats://127.0.0.1:4222")
	cfg, _ = parseServe([]string{"--config", path}, io.Discard)
	if cfg.nats != "nats://127.0.0.1:4222" {
		t.Fatalf("got %q, want the environment's", cfg.nats)
	}
	cfg, _ = parseServe([]string{"--config", path, "--nats",
		"nats://127.0.0.1:5222"}, io.Discard)
	if cfg.nats != "nats://127.0.0.1:5222" {
		t.Fatalf("got %q, want the flag's", cfg.nats)
	}
}

// Tutorial 7's playground: the page on one broker shows a message
// published on the other, delivered to its clients and acked.
func TestPlayground_ShowsWhatAnotherBrokerPublished(t *testing.T) {
	chromium := browser(t)
	nats := startNATS(t)
	secret := strings.Repeat("playground-secret-", 2)
	other, _, _ := startServe(t, "--nats", nats, "--secret", secret)
	page, _, _ := playgroundURL(t, secret, "--nats", nats)
	ctx, problems := startBrowser(t, chromium)

	openPlayground(t, ctx, page, 1366, 900)
	token, err := localClaims().Sign([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, "--url", other, "--token", token, "pub", "jobs",
		`"from the other broker"`, "--qos", "1")
	for _, name := range []string{"alice", "bob"} {
		until(t, ctx, name+" receives it", contains("#"+name+"-messages",
			"from the other broker"))
		until(t, ctx, name+" acks it, as the broker says",
			exists(`#`+name+`-messages li[data-state="acked"]`))
	}
	if p := problems(); len(p) > 0 {
		t.Fatalf("the console reported: %v", p)
	}
}
