package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/popsub/popsub/bench"
)

// popsub bench is package bench's flags: they reach its Config, and its
// JSON summary comes back. Package bench's own tests load the servers.
func TestBench_FlagsReachThePackage(t *testing.T) {
	secret := strings.Repeat("bench-test-secret-", 2)
	url, _, _ := startServe(t, "--secret", secret)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, []string{"bench", "--url", url, "--secret", secret,
		"--json", "--subscribers", "2", "--qos", "1", "--duration",
		"200ms", "--window", "20"}, &out, io.Discard)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	var r bench.Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench printed %q: %v", out.String(), err)
	}
	if r.Subscribers != 2 || r.QoS != 1 || r.Published == 0 ||
		r.Delivered != 2*r.Published || r.Lost != 0 {
		t.Fatalf("bench: %+v; want 2 subscribers at QoS 1, each with "+
			"every message", r)
	}
	if err := run(ctx, []string{"bench", "--qos", "2"}, io.Discard,
		io.Discard); err == nil {
		t.Fatal("bench --qos 2 ran, want an error")
	}
}
