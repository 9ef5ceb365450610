package lab

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
)

// beside plays a scenario on both brokers at once, in one fake clock, as
// the page does, and hands both runs to check before closing them.
func beside(t *testing.T, s Scenario, check func(ours, theirs *Lab)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		runs, _ := play(t, s, Popsub, Article)
		check(runs[0], runs[1])
	})
}

// play plays a scenario on each kind of broker at once, in the fake
// clock of the bubble it is called in, and returns the runs and how many
// events each had when its fault began. The runs close with the test.
func play(t *testing.T, s Scenario, kinds ...string) ([]*Lab, []int) {
	t.Helper()
	var runs []*Lab
	for _, kind := range kinds {
		l, err := NewOn(kind)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		runs = append(runs, l)
	}
	faulted := make([]int, len(runs))
	var wg sync.WaitGroup
	for i, l := range runs {
		wg.Go(func() {
			if err := l.Play(s.Setup); err != nil {
				t.Error(err)
			}
			faulted[i] = l.count()
			if err := l.Play(s.Fault); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	return runs, faulted
}

// Each scenario's explanation is what its diagram shows: the events it
// names happened, in its order, and those it says did not, did not, in
// popsub.go's run and in the article's beside it.
func TestScenarios_ShowWhatTheySay(t *testing.T) {
	for _, s := range Scenarios {
		t.Run(s.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kinds := []string{Popsub}
				if s.Beside {
					kinds = append(kinds, Article)
				}
				runs, faulted := play(t, s, kinds...)
				for i, patterns := range [][]string{s.Shows, s.TheirsShow} {
					if i >= len(runs) {
						break
					}
					runs[i].mu.Lock()
					events := slices.Clone(runs[i].events[faulted[i]:])
					runs[i].mu.Unlock()
					if missing := Shown(patterns, events); missing != "" {
						t.Errorf("%s's run does not show %q:\n%s", kinds[i],
							missing, labels(runs[i]))
					}
				}
			})
		})
	}
}

// broken lists the promises a run broke, by name.
func broken(l *Lab) []string {
	var names []string
	for _, p := range l.Promises() {
		if p.Violations > 0 {
			names = append(names, p.Name)
		}
	}
	return names
}

// Each of the article's limits, played on both brokers: popsub.go keeps
// every promise; the article's broker breaks the one its scenario says
// it breaks, and nothing else; and every cost the scenario measures is
// higher on the article's broker than on popsub.go.
func TestLimits_TheArticlesBrokerBreaksWhatPopsubKeeps(t *testing.T) {
	for _, s := range limits {
		t.Run(s.Name, func(t *testing.T) {
			beside(t, s, func(ours, theirs *Lab) {
				if got := broken(ours); len(got) > 0 {
					t.Errorf("popsub.go broke %q\n%s", got, labels(ours))
				}
				got, want := broken(theirs), s.Breaks
				if strings.Join(got, "|") != strings.Join(want, "|") {
					t.Errorf("the article's broker broke %q, want %q\n%s",
						got, want, labels(theirs))
				}
				// Red is the deliveries that break it, to carol, and
				// nothing else.
				if s.Name == "one-ack" {
					v, marked := theirs.View(), 0
					for _, e := range v.Events {
						if !v.marked(e) {
							continue
						}
						marked++
						if e.Kind != "message" || e.To != "carol" {
							t.Errorf("marked: %s %s→%s %s", e.Kind, e.From,
								e.To, e.Label)
						}
					}
					if marked == 0 {
						t.Errorf("no event marked")
					}
				}
				for _, spec := range s.Figures {
					a, b := ours.Measure(spec), theirs.Measure(spec)
					t.Logf("%s: popsub.go %d, the article's %d %s", a.Name,
						a.Value, b.Value, a.Unit)
					if b.Value <= a.Value {
						t.Errorf("%s: popsub.go %d, the article's %d: the "+
							"limit costs nothing\nours:\n%s\ntheirs:\n%s",
							a.Name, a.Value, b.Value, labels(ours),
							labels(theirs))
					}
				}
			})
		})
	}
}
