package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestChaos_RunsBrokersUnderFaultsAndChecksThem(t *testing.T) {
	// The brokers are real processes: this package's command, built.
	bin := filepath.Join(t.TempDir(), "popsub")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, _, err := runCapture("chaos", "--popsub", bin, "--duration", "6s",
		"--every", "1s", "--seed", "7", "--rate", "200")
	if err != nil {
		t.Fatalf("chaos: %v\n%s", err, out)
	}
	for _, want := range []string{"--seed 7", "every fault was healed:",
		"healed; draining"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "VIOLATED") {
		t.Fatalf("chaos found a violation:\n%s", out)
	}
}

func TestChaos_RefusesWhatItCannotRun(t *testing.T) {
	for _, args := range [][]string{{"--engine", "sled"},
		{"--nats-replicas", "2"}, {"--topics", "0"}} {
		_, _, err := runCapture(append([]string{"chaos"}, args...)...)
		if err == nil {
			t.Errorf("chaos %v ran, want an error", args)
		}
	}
}
