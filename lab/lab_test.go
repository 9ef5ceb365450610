package lab

import (
	"os/exec"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// run starts a lab in fake time, applies actions a tick apart, lets
// wait pass, and hands the lab to check before closing it.
func run(t *testing.T, actions []Action, wait time.Duration,
	check func(*Lab)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		l, err := New()
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, a := range actions {
			if err := l.Do(a); err != nil {
				t.Fatalf("%+v: %v", a, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(wait)
		check(l)
	})
}

// labels lists the events' kinds and labels, one a line.
func labels(l *Lab) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, e := range l.events {
		b.WriteString(e.Kind + " " + e.From + "→" + e.To + ": " + e.Label + "\n")
	}
	return b.String()
}

func TestLab_AQoS1PublishIsDeliveredAckedAndConfirmed(t *testing.T) {
	run(t, []Action{
		{Do: "subscribe", Client: "bob", Topic: "jobs"},
		{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1},
	}, time.Second, func(l *Lab) {
		got := labels(l)
		for _, want := range []string{"message broker→bob: seq 1: alice-1",
			"ack bob→broker: ack seq 1",
			"published broker→alice: confirmed alice-1: seq 1"} {
			if !strings.Contains(got, want) {
				t.Errorf("no %q in\n%s", want, got)
			}
		}
		for _, p := range l.Promises() {
			if p.Violations > 0 {
				t.Errorf("%s: %v", p.Name, p.Examples)
			}
		}
	})
}

func TestLab_Trace(t *testing.T) {
	run(t, []Action{
		{Do: "subscribe", Client: "bob", Topic: "news"},
		{Do: "publish", Client: "alice", Topic: "news"},
	}, 0, func(l *Lab) {
		l.Do(Action{Do: "kill"})
		time.Sleep(2 * time.Second)
		l.Do(Action{Do: "publish", Client: "alice", Topic: "news"})
		time.Sleep(time.Second)
		t.Log("\n" + labels(l))
		for _, p := range l.Promises() {
			t.Log(p.Name, p.Violations, p.Examples)
		}
	})
}

// Each guided scenario, played as the page plays it, keeps every
// promise; its answer is what the run shows.
func TestScenarios_KeepEveryPromise(t *testing.T) {
	for _, s := range Scenarios {
		t.Run(s.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, err := New()
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				if err := l.Play(append(s.Setup, s.Fault...)); err != nil {
					t.Fatal(err)
				}
				// Built with -tags labnoreserve, the disk forgets the
				// reserved heads, and the first scenario must catch the
				// seq reused (TestChecker_BitesWithoutReservations).
				reused := !keepHeads && s.Name == "seq-reuse"
				for _, p := range l.Promises() {
					bite := reused && p.Name == "no seq is given to two messages"
					if (p.Violations > 0) != bite {
						t.Errorf("%s: %d violations %v\n%s", p.Name,
							p.Violations, p.Examples, labels(l))
					}
				}
			})
		})
	}
}

// The checker bites: built without seq reservations, the lab's broker
// gives seq 1 of the first scenario to two messages, and the
// scenario's test (with its build tag) sees the promise broken.
func TestChecker_BitesWithoutReservations(t *testing.T) {
	if !keepHeads {
		return // this is the inner run
	}
	test := exec.Command("go", "test", "-count=1", "-tags", "labnoreserve",
		"-run", "TestScenarios_KeepEveryPromise/seq-reuse", ".")
	if out, err := test.CombinedOutput(); err != nil {
		t.Fatalf("go test -tags labnoreserve: %v\n%s", err, out)
	}
}
