package lab

import (
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
		ours, err := NewOn(Popsub)
		if err != nil {
			t.Fatal(err)
		}
		defer ours.Close()
		theirs, err := NewOn(Article)
		if err != nil {
			t.Fatal(err)
		}
		defer theirs.Close()
		var wg sync.WaitGroup
		for _, l := range []*Lab{ours, theirs} {
			wg.Go(func() {
				if err := l.Play(append(s.Setup, s.Fault...)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		check(ours, theirs)
	})
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
