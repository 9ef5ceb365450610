package lab

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/popsub/popsub"
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
		fmt.Fprintf(&b, "%d %s %s %s→%s: %s\n", e.At, e.Topic, e.Kind,
			e.From, e.To, e.Label)
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
					bite := reused && p.Name == "no seq is given to two messages" ||
						!s.Beside && slices.Contains(s.Breaks, p.Name)
					if (p.Violations > 0) != bite {
						t.Errorf("%s: %d violations %v\n%s", p.Name,
							p.Violations, p.Examples, labels(l))
					}
				}
			})
		})
	}
}

// Every check bites once: each promise the checker holds a run to is
// broken in some scenario, by the article's broker or by a fault no
// broker can mend, so that no line of the checker is decoration.
func TestScenarios_EveryPromiseIsBrokenInOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := New()
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, p := range l.Promises() {
			if !slices.ContainsFunc(Scenarios, func(s Scenario) bool {
				return slices.Contains(s.Breaks, p.Name)
			}) {
				t.Errorf("no scenario breaks %q", p.Name)
			}
		}
	})
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

// held fails the test for each broken promise.
func held(t *testing.T, l *Lab) {
	t.Helper()
	for _, p := range l.Promises() {
		if p.Violations > 0 {
			t.Errorf("%s: broken: %v\n%s", p.Name, p.Examples, labels(l))
		}
	}
}

// A delivery acked long ago keeps the retry promise, and one whose ack
// is held is retried, then dead-lettered once, as the promise says.
func TestLab_HeldAcksAreRetriedThenDeadLettered(t *testing.T) {
	run(t, []Action{
		{Do: "subscribe", Client: "bob", Topic: "jobs"},
		{Do: "subscribe", Client: "carol", Topic: "jobs"},
		{Do: "hold", Client: "carol"},
		{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1},
	}, 20*time.Second, func(l *Lab) {
		held(t, l)
		got := labels(l)
		for _, want := range []string{"message broker→carol: retry 1 of seq 1",
			"message broker→carol: retry 2 of seq 1",
			"dead broker→carol: seq 1 to $dead/jobs"} {
			if !strings.Contains(got, want) {
				t.Errorf("no %q in\n%s", want, got)
			}
		}
		if n := strings.Count(got, "dead broker→carol"); n != 1 {
			t.Errorf("%d dead letters for carol, want 1", n)
		}
		for _, c := range l.View().Clients {
			if c.Name == "carol" && len(c.Held) != 0 {
				t.Errorf("carol still holds %v after its dead letter", c.Held)
			}
		}
	})
}

// The disk: a kill keeps what was written and not synced, a power cut
// drops it; and the broker whose process died commits nothing more.
func TestDisk_AKillKeepsThePageCacheAPowerCutDoesNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		written := make(chan string, 10)
		d := &Disk{gate: &gate{}, synced: newContents(),
			written: func(what string, _ *popsub.Batch) { written <- what }}
		m := func(seq uint64) *popsub.Message {
			return &popsub.Message{Topic: "t", Seq: seq, ID: fmt.Sprint(seq)}
		}
		if err := d.Commit(&popsub.Batch{Messages: []*popsub.Message{m(1)}}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- d.Commit(&popsub.Batch{Messages: []*popsub.Message{m(2)}}) }()
		synctest.Wait() // the second batch is written, its sync under way
		kill, power := d.after(false), d.after(true)
		if err := <-done; err == nil {
			t.Error("a dead broker's commit succeeded")
		}
		for _, c := range []struct {
			disk *Disk
			want int
		}{{kill, 2}, {power, 1}} {
			if got, _ := c.disk.Read("t", 0, 10, 1<<20); len(got) != c.want {
				t.Errorf("kept %d messages, want %d", len(got), c.want)
			}
		}
		if err := d.Commit(&popsub.Batch{}); err == nil {
			t.Error("a commit after the crash succeeded")
		}
	})
}

// A click the lab cannot do says why, and does nothing.
func TestLab_ABadActionSaysWhy(t *testing.T) {
	run(t, nil, 0, func(l *Lab) {
		for _, a := range []Action{{Do: "publish", Client: "mallory", Topic: "t"},
			{Do: "publish", Client: "alice", Topic: "a/#"},
			{Do: "subscribe", Client: "alice", Topic: ""},
			{Do: "dance", Client: "alice", Topic: "t"}} {
			if err := l.Do(a); err == nil {
				t.Errorf("%+v: no error", a)
			}
		}
		if got := labels(l); got != "" {
			t.Errorf("bad actions did something:\n%s", got)
		}
	})
}

// A newcomer's clicks come in every order: seeded random runs of every
// action the page offers, faults among them, keep every promise.
func TestLab_RandomClicksKeepEveryPromise(t *testing.T) {
	kinds := []string{"subscribe", "subscribe", "subscribe", "publish",
		"publish", "publish", "publish", "publish", "ack", "hold",
		"release", "cut", "stop", "read", "read", "kill", "power", "pause",
		"resume", "resume", "slow", "heal"}
	topics := []string{"jobs", "news"}
	for seed := range uint64(200) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 1))
				l, err := New()
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				for range 40 {
					a := Action{Do: kinds[r.IntN(len(kinds))],
						Client: Names[r.IntN(len(Names))],
						Topic:  topics[r.IntN(len(topics))], QoS: r.IntN(2)}
					if a.Do == "subscribe" {
						switch r.IntN(4) {
						case 1:
							a.Durable = a.Client + "-" + a.Topic
						case 2:
							a.Group = "workers"
						case 3:
							a.After = new(uint64)
						}
					}
					click(t, l, r, a)
				}
				heal(l)
				time.Sleep(30 * time.Second)
				held(t, l)
			})
		})
	}
}

// click does a random run's action, then lets up to 1.5 s pass.
func click(t *testing.T, l *Lab, r *rand.Rand, a Action) {
	t.Helper()
	if err := l.Do(a); err != nil {
		t.Fatalf("%+v: %v", a, err)
	}
	time.Sleep(time.Duration(r.IntN(1500)) * time.Millisecond)
}

// heal ends a random run's faults: the broker resumes, the disk is
// well, and every client reads and sends the acks it held.
func heal(l *Lab) {
	l.Do(Action{Do: "resume"})
	l.Do(Action{Do: "heal"})
	for _, name := range Names {
		l.Do(Action{Do: "read", Client: name})
		l.Do(Action{Do: "ack", Client: name})
	}
}

// The article's broker takes the same clicks in every order, every
// fault among them, without a panic or a stuck goroutine, and its page
// draws: its promises are its own to break.
func TestArticle_TakesRandomClicks(t *testing.T) {
	kinds := []string{"subscribe", "subscribe", "publish", "publish",
		"publish", "ack", "hold", "release", "cut", "stop", "read", "drop",
		"kill", "power", "pause", "resume", "slow", "lie", "heal"}
	for seed := range uint64(50) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 2))
				l, err := NewOn(Article)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				for range 40 {
					a := Action{Do: kinds[r.IntN(len(kinds))],
						Client: Names[r.IntN(len(Names))], Topic: "jobs",
						QoS: r.IntN(2), Count: r.IntN(20)}
					if a.Do == "subscribe" && r.IntN(2) == 0 {
						a.Group = "workers"
					}
					click(t, l, r, a)
				}
				heal(l)
				time.Sleep(5 * time.Second)
				if v := l.View(); len(v.Events) == 0 || len(v.Checks) != 5 {
					t.Errorf("the view: %d events, %d promises", len(v.Events),
						len(v.Checks))
				}
			})
		})
	}
}

// The diagram folds a run of like frames into one row that counts them,
// and never folds a fault.
func TestDiagram_FoldsARunOfLikeFrames(t *testing.T) {
	var v View
	for i := range 5 {
		v.Events = append(v.Events, Event{Kind: "publish", From: "alice",
			To: "broker", Label: fmt.Sprint("publish alice-", i+1)})
	}
	v.Events = append(v.Events, Event{Kind: "kill", From: "broker",
		To: "broker"}, Event{Kind: "kill", From: "broker", To: "broker"},
		Event{Kind: "kill", From: "broker", To: "broker"})
	rows := v.shown()
	if len(rows) != 4 || rows[0].Label != "publish alice-1 … publish alice-5 (5)" ||
		rows[0].last != 4 {
		t.Errorf("rows: %+v", rows)
	}
}

// A burst at one instant folds though its writes and its deliveries
// alternate, as the article's broker makes them; a fault at that instant
// keeps its place, and nothing folds across it.
func TestDiagram_FoldsABurstAtOneInstant(t *testing.T) {
	var v View
	for i := range 3 {
		v.Events = append(v.Events,
			Event{At: 800, Kind: "write", From: "broker", To: "disk",
				Label: fmt.Sprint("write alice-", i+1)},
			Event{At: 800, Kind: "message", From: "broker", To: "bob",
				Label: fmt.Sprint("alice-", i+1)})
	}
	v.Events = append(v.Events,
		Event{At: 800, Kind: "cut", From: "bob", To: "bob"},
		Event{At: 800, Kind: "write", From: "broker", To: "disk"})
	var got []string
	for _, r := range v.shown() {
		got = append(got, r.Kind+": "+r.Label)
	}
	want := []string{"write: write alice-1 … write alice-3 (3)",
		"message: alice-1 … alice-3 (3)", "cut: ", "write: "}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%q\nwant\n%q", got, want)
	}
}

func TestRanges_WritesRunsOfSeqs(t *testing.T) {
	if got := ranges([]uint64{2, 3, 4, 5, 9, 11, 12}); got != "2-5,9,11-12" {
		t.Errorf("ranges: %q", got)
	}
}

// A broker killed while paused is not paused after its restart: the
// pause ends with the kill, and each fault is healed once.
func TestLab_AKillEndsAPause(t *testing.T) {
	run(t, []Action{{Do: "pause"}, {Do: "kill"}}, time.Second,
		func(l *Lab) {
			faults := l.history.FaultsSoFar()
			if len(faults) != 2 {
				t.Fatalf("faults: %+v", faults)
			}
			for _, f := range faults {
				if !f.Healed {
					t.Errorf("%s never healed", f.Kind)
				}
			}
		})
}

// Each scenario's words match what its run shows: what its question says
// of the moment it asks, and what its explanation says happened after.
func TestScenarios_ShowWhatTheyExplain(t *testing.T) {
	play := func(t *testing.T, name string, check func(setup, all []Event)) {
		s, _ := ScenarioNamed(name)
		synctest.Test(t, func(t *testing.T) {
			l, err := New()
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.Play(s.Setup); err != nil {
				t.Fatal(err)
			}
			events := func() []Event {
				l.mu.Lock()
				defer l.mu.Unlock()
				return slices.Clone(l.events)
			}
			setup := events()
			if err := l.Play(s.Fault); err != nil {
				t.Fatal(err)
			}
			check(setup, events())
			if t.Failed() {
				t.Log(labels(l))
			}
		})
	}
	t.Run("power-durable", func(t *testing.T) {
		play(t, "power-durable", func(setup, all []Event) {
			// Asked: bob has alice's second message, written, not synced,
			// and alice has no confirm for it.
			last := setup[len(setup)-1]
			second := slices.IndexFunc(setup, func(e Event) bool {
				return e.Kind == "message" && e.To == "bob" && e.Seq == 2
			})
			if second < 0 || slices.ContainsFunc(setup, func(e Event) bool {
				return e.Kind == "published" && e.Seq == 2
			}) {
				t.Errorf("when asked (last: %s %q), bob should have seq 2 "+
					"and alice no confirm for it", last.Kind, last.Label)
				return
			}
			id := setup[second].ID
			// After: alice sent it again, it was stored under a new seq,
			// and bob got it again.
			power := slices.IndexFunc(all, func(e Event) bool {
				return e.Kind == "power"
			})
			again := slices.ContainsFunc(all[power:], func(e Event) bool {
				return e.Kind == "message" && e.To == "bob" && e.ID == id &&
					e.Seq != 2
			})
			if power < 0 || !again {
				t.Errorf("after the power cut bob did not get %s again "+
					"under a new seq", id)
			}
		})
	})
	t.Run("slow-reader", func(t *testing.T) {
		play(t, "slow-reader", func(_, all []Event) {
			if !slices.ContainsFunc(all, func(e Event) bool {
				return e.Kind == "disconnect" && e.To == "carol" &&
					strings.Contains(e.Label, "a write waited")
			}) {
				t.Error("carol was not cut off for a write that waited, " +
					"as the explanation says")
			}
		})
	})
}
