package queue

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// A queue used as a queue (in at the back, out at the front, now and
// then from the middle) keeps its items in order and its array within a
// few times the most it held.
func TestQueue_KeepsOrderAndBoundsItsArray(t *testing.T) {
	random := rand.New(rand.NewPCG(1, 2))
	var q Queue[int]
	var want []int
	next, widest := 0, 0
	for step := range 20000 {
		switch r := random.IntN(10); {
		case r < 6:
			q.Insert(len(q.Live()), next)
			want = append(want, next)
			next++
		case r == 6:
			odd := func(v int) bool { return v%2 == 1 }
			before := len(want)
			want = slices.DeleteFunc(want, odd)
			if dropped := q.Drop(odd); dropped != before-len(want) {
				t.Fatalf("step %d: dropped %d, want %d", step, dropped,
					before-len(want))
			}
		case len(want) > 0:
			i := 0
			if r == 9 {
				i = random.IntN(len(want))
			}
			j := i + 1 + random.IntN(len(want)-i)
			q.Remove(i, j)
			want = slices.Delete(want, i, j)
		}
		if !slices.Equal(q.Live(), want) {
			t.Fatalf("step %d: live %v, want %v", step, q.Live(), want)
		}
		widest = max(widest, len(want))
	}
	if cap(q.items) > 4*widest {
		t.Fatalf("the array grew to %d items for at most %d live",
			cap(q.items), widest)
	}
}
