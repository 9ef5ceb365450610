package nemesis

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/popsub/popsub/internal/built"
)

// A short run on one bbolt broker: the nemesis kills, pauses, cuts and
// stalls it, every fault is healed, and the checker finds every promise
// held. The seed is fixed, so a failure here replays with popsub chaos
// --seed 7.
func TestNemesis_RunsBrokersUnderFaultsAndChecksThem(t *testing.T) {
	cfg := Defaults
	cfg.Popsub, cfg.Seed = built.PopsubFor(t), 7
	cfg.Duration, cfg.Every, cfg.Rate = 6*time.Second, time.Second, 200
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, cfg, &out); err != nil {
		t.Fatalf("chaos: %v\n%s", err, out.String())
	}
	for _, want := range []string{"--seed 7", "every fault was healed:",
		"healed; draining"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "VIOLATED") {
		t.Fatalf("chaos found a violation:\n%s", out.String())
	}
}

func TestNemesis_RefusesWhatItCannotRun(t *testing.T) {
	for _, change := range []func(*Config){
		func(c *Config) { c.Engine = "sled" },
		func(c *Config) { c.Replicas = 2 },
		func(c *Config) { c.Topics = 0 },
		func(c *Config) { c.Popsub = "" },
		func(c *Config) { c.Every = 0 },
	} {
		cfg := Defaults
		cfg.Popsub = "popsub"
		change(&cfg)
		if err := Run(context.Background(), cfg, nil); err == nil {
			t.Errorf("%+v ran, want an error", cfg)
		}
	}
}

// The NATS nodes' ports must be ones the kernel never hands out by
// itself, or a dial elsewhere may take one before the node binds it.
func TestFreePorts_AreDistinctAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := freePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, port := range ports {
		if port < 20000 || port >= 32768 || seen[port] {
			t.Fatalf("ports %v: want distinct ones in [20000, 32768)", ports)
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprint("127.0.0.1:", port))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		l.Close()
	}
	if len(ports) != 6 {
		t.Fatalf("got %d ports, want 6", len(ports))
	}
}
