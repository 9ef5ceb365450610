package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// built is this package's command, built once for the tests that run
// it as a reader would.
var built = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "popsub-built")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "popsub")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// popsubBinary returns the built command, or fails the test.
func popsubBinary(t *testing.T) string {
	t.Helper()
	bin, err := built()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestChaos_RunsBrokersUnderFaultsAndChecksThem(t *testing.T) {
	// The brokers are real processes: this package's command, built.
	bin := popsubBinary(t)
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

// TestFreePorts_AreDistinctAndBelowTheEphemeralRange: the NATS nodes'
// ports must be ones the kernel never hands out by itself, or a dial
// elsewhere may take one before the node binds it.
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
