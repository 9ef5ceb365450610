package main

import "testing"

// popsub chaos's flags reach package nemesis, which refuses what it
// cannot run before it starts anything. Package nemesis's own tests run
// brokers under faults.
func TestChaos_RefusesWhatItCannotRun(t *testing.T) {
	for _, args := range [][]string{{"--engine", "sled"},
		{"--nats-replicas", "2"}, {"--topics", "0"}} {
		_, _, err := runCapture(append([]string{"chaos"}, args...)...)
		if err == nil {
			t.Errorf("chaos %v ran, want an error", args)
		}
	}
}
