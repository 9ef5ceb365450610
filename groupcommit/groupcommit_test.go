package groupcommit

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memory is a Store that keeps batches, and fails while fail is set.
type memory struct {
	mu      sync.Mutex
	batches []*Batch[int]
	cursors map[string]uint64
	fail    bool
}

func (m *memory) Commit(b *Batch[int]) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("disk away")
	}
	m.batches = append(m.batches, b)
	for k, v := range b.Cursors {
		m.cursors[k] = v
	}
	return nil
}

func (m *memory) Cursor(key string) (uint64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.cursors[key]
	return v, ok, nil
}

// start starts a log over store whose messages are ints: their size is
// their value, and odd ones are urgent.
func start(store *memory, committed func(*Batch[int], error)) *Log[int] {
	return Start(Config[int]{Store: store,
		Size: func(m int) int { return m }, Urgent: func(m int) bool {
			return m%2 == 1
		},
		MaxMessages: 4, MaxBytes: 100, Linger: 5 * time.Millisecond,
		Committed: func(b *Batch[int], _ time.Duration, err error) {
			committed(b, err)
		}}, errors.New("stopped"))
}

func TestLog_BatchesWhatIsQueuedAndSettlesItsOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &memory{cursors: map[string]uint64{}}
		var heard []int
		l := start(store, func(b *Batch[int], err error) {
			heard = append(heard, b.Messages...)
		})
		defer l.Stop()

		// Two quiet messages linger together; Committed hears them
		// before their outcome is done.
		for _, m := range []int{2, 4} {
			if !l.Admit(m, nil, func() {}) {
				t.Fatal("Admit refused room in an empty queue")
			}
		}
		first, second := l.Append(2), l.Append(4)
		if first != second {
			t.Fatal("two appends to one queue got two outcomes")
		}
		<-first.Done()
		if first.Err() != nil || !slices.Equal(heard, []int{2, 4}) {
			t.Fatalf("outcome %v, heard %v; want nil, [2 4]", first.Err(),
				heard)
		}
		if len(store.batches) != 1 {
			t.Fatalf("%d batches, want the two messages in one",
				len(store.batches))
		}

		// A cursor saved a moment ago is read back before it is on disk.
		l.SaveCursor("k", 7)
		if position, ok, _ := l.Cursor("k"); !ok || position != 7 {
			t.Fatalf("Cursor = %d, %v; want 7 from the queue", position, ok)
		}
		<-l.Barrier().Done()
		if store.cursors["k"] != 7 {
			t.Fatal("the barrier's outcome came before the cursor's commit")
		}
	})
}

func TestLog_AdmitWaitsForRoomAndGivesUpWithItsCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &memory{cursors: map[string]uint64{}, fail: true}
		l := start(store, func(*Batch[int], error) {})
		defer l.Stop()
		for range 4 {
			l.Admit(2, nil, func() {})
		}
		// The queue holds four: a fifth waits, runs beforeWait first, and
		// gives up when its caller does.
		done, waited := make(chan struct{}), false
		go func() {
			time.Sleep(time.Second)
			close(done)
		}()
		if l.Admit(2, done, func() { waited = true }) || !waited {
			t.Fatalf("a fifth message was admitted (waited %v)", waited)
		}
		// Room given back lets it in.
		l.GiveBack(2)
		if !l.Admit(2, nil, func() {}) {
			t.Fatal("Admit refused the room GiveBack made")
		}
	})
}

func TestLog_AFailedCursorMoveIsCommittedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &memory{cursors: map[string]uint64{}, fail: true}
		var failures int
		l := start(store, func(_ *Batch[int], err error) {
			if err != nil {
				failures++
			}
		})
		defer l.Stop()
		l.SaveCursor("k", 3)
		failed := l.Barrier()
		<-failed.Done()
		if failed.Err() == nil {
			t.Fatal("a failed commit's outcome has no error")
		}
		store.mu.Lock()
		store.fail = false
		store.mu.Unlock()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		position, _, _ := store.Cursor("k")
		if position != 3 || failures == 0 {
			t.Fatalf("cursor %d after %d failures, want 3 retried", position,
				failures)
		}
	})
}
