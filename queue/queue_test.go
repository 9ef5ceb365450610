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

// A schedule hands back, at each time, exactly the items due by then,
// earliest first, whatever order they were added in, and those due at
// the same time in the order they were added.
func TestSchedule_HandsBackWhatIsDueEarliestFirst(t *testing.T) {
	random := rand.New(rand.NewPCG(3, 4))
	var s Schedule[int]
	var want []int // each item is its due time, then its order added
	for i := range 1000 {
		due := random.IntN(100)
		earliest := len(want) == 0 || due <= slices.Min(want)/10000
		if s.Add(int64(due), due*10000+i) != earliest {
			t.Fatalf("add %d: earliest %v, want %v", i, !earliest, earliest)
		}
		want = append(want, due*10000+i)
	}
	slices.Sort(want)
	var got []int
	for now := int64(0); now < 100; now += 7 {
		got = append(got, s.Due(now)...)
		if next, ok := s.Next(); ok && next <= now {
			t.Fatalf("at %d the next is due at %d, and was not handed back",
				now, next)
		}
	}
	got = append(got, s.Due(100)...)
	if !slices.Equal(got, want) {
		t.Fatalf("handed back %d items out of order or not all", len(got))
	}
	if _, ok := s.Next(); ok {
		t.Fatal("an emptied schedule says something is due")
	}
}
