package groupcommit

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memory is a Store that keeps batches, and fails while fail is set;
// each commit first waits for hold, if there is one, then calls during,
// if set, from the committer's goroutine.
type memory struct {
	mu      sync.Mutex
	batches []*Batch[int]
	cursors map[string]uint64
	fail    bool
	hold    chan struct{}
	during  func(*Batch[int])
}

func (m *memory) Commit(b *Batch[int]) error {
	if m.hold != nil {
		<-m.hold
	}
	if m.during != nil {
		m.during(b)
	}
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
// their value, odd ones are urgent, and those under 10 go to the topic
// "small", the others to "large". Its queue holds 4 messages and 100
// bytes.
func start(store *memory, committed func(*Batch[int], error)) *Log[int] {
	return startSized(store, 4, 100, committed)
}

// startSized starts a log as start does, its queue holding at most
// messages and bytes.
func startSized(store *memory, messages, bytes int,
	committed func(*Batch[int], error)) *Log[int] {
	return Start(Config[int]{Store: store,
		Size: func(m int) int { return m }, Urgent: func(m int) bool {
			return m%2 == 1
		},
		Topic: func(m int) string {
			return map[bool]string{true: "small", false: "large"}[m < 10]
		},
		MaxMessages: messages, MaxBytes: bytes, Linger: 5 * time.Millisecond,
		Committed: func(b *Batch[int], _ time.Duration, err error) {
			committed(b, err)
		}}, errors.New("stopped"))
}

func TestLog_BatchesWhatIsQueuedAndResolvesItsOutcome(t *testing.T) {
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
			if !l.Admit(m, false, nil, func() {}) {
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

func TestLog_ABatchOfHalfTheQueueGoesAtOnceAndLessLingers(t *testing.T) {
	// The queue holds 4 messages and 100 bytes: half is 2 messages or 50
	// bytes.
	for _, c := range []struct {
		name    string
		queued  []int
		lingers bool
	}{
		{"one message", []int{2}, true},
		{"half the count", []int{2, 4}, false},
		{"almost half the bytes", []int{48}, true},
		{"half the bytes", []int{50}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := start(&memory{cursors: map[string]uint64{}},
					func(*Batch[int], error) {})
				defer l.Stop()
				began := time.Now()
				var fate *Outcome
				for _, m := range c.queued {
					l.Admit(m, false, nil, func() {})
					fate = l.Append(m)
				}
				<-fate.Done()
				if waited := time.Since(began); (waited > 0) != c.lingers {
					t.Fatalf("committed after %v; lingers: %v", waited,
						c.lingers)
				}
			})
		})
	}
}

func TestLog_AdmitWaitsForRoomAndGivesUpWithItsCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &memory{cursors: map[string]uint64{}, fail: true}
		l := start(store, func(*Batch[int], error) {})
		defer l.Stop()
		for range 4 {
			l.Admit(2, false, nil, func() {})
		}
		// The queue holds four: a fifth waits, runs beforeWait first, and
		// gives up when its caller does.
		done, waited := make(chan struct{}), false
		go func() {
			time.Sleep(time.Second)
			close(done)
		}()
		if l.Admit(2, false, done, func() { waited = true }) || !waited {
			t.Fatalf("a fifth message was admitted (waited %v)", waited)
		}
		// Room given back lets it in.
		l.GiveBack(2)
		if !l.Admit(2, false, nil, func() {}) {
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

// startHeld starts a log as startSized does, over a store whose commits
// wait for store.hold to close, and puts a commit of the message 40 in
// flight, a barrier making it go at once: what is queued next waits for
// it, in one batch. Run it in a
// synctest bubble.
func startHeld(messages, bytes int) (*memory, *Log[int]) {
	store := &memory{cursors: map[string]uint64{},
		hold: make(chan struct{})}
	l := startSized(store, messages, bytes, func(*Batch[int], error) {})
	l.Admit(40, false, nil, func() {})
	l.Append(40)
	l.Barrier()
	synctest.Wait()
	return store, l
}

// enqueue admits m, urgent if odd, and appends it, as the broker does.
func enqueue(t *testing.T, l *Log[int], m int) *Outcome {
	if !l.Admit(m, m%2 == 1, nil, func() {}) {
		t.Errorf("no room for %d", m)
	}
	return l.Append(m)
}

// committed checks that the store committed want's batches, in order.
func (m *memory) committed(t *testing.T, want [][]int) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	var got [][]int
	for _, b := range m.batches {
		got = append(got, b.Messages)
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}

func TestLog_AWaitedTopicCommitsBeforeAFloodOnAnother(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, l := startHeld(4, 200)
		defer l.Stop()

		// While the commit in flight holds the loop, the next batch
		// fills: a flood of 42 bytes on "large", and on "small" a
		// message nobody waits for, then one somebody does.
		flood := enqueue(t, l, 20)
		enqueue(t, l, 22)
		enqueue(t, l, 2)
		confirm := enqueue(t, l, 3)
		close(store.hold)
		<-confirm.Done()
		<-flood.Done()

		// "small" went first, in its own order; the flood after it.
		store.committed(t, [][]int{{40}, {2, 3}, {20, 22}})
	})
}

func TestLog_ASmallRestCommitsWithWhatIsWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, l := startHeld(4, 100)
		defer l.Stop()
		// 10 bytes of rest, under an eighth of the queue: one sync.
		for _, m := range []int{10, 3} {
			l.Admit(m, m%2 == 1, nil, func() {})
		}
		l.Append(10)
		confirm := l.Append(3)
		close(store.hold)
		<-confirm.Done()
		if len(store.batches) != 2 || len(store.batches[1].Messages) != 2 {
			t.Fatalf("%d batches, want the last two messages in one",
				len(store.batches))
		}
	})
}

func TestLog_AnUrgentMessageFindsRoomAFloodCannotTake(t *testing.T) {
	// The queue holds 16 messages and 160 bytes. A flood fills it by
	// bytes (8 of 20) or by count (16 of 2), and its next message waits
	// for room, first in line; the urgent ones that fit in the eighth
	// kept for them do not wait behind it, and one more does.
	for _, c := range []struct {
		name           string
		flood          []int
		urgent         []int
		over, floodOne int
	}{
		{"bytes", slices.Repeat([]int{20}, 8), []int{19}, 3, 20},
		{"count", slices.Repeat([]int{2}, 16), []int{1, 1}, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, l := startHeld(16, 160)
				defer l.Stop()
				for _, m := range c.flood {
					l.Admit(m, false, nil, func() {})
				}
				waiting := make(chan bool)
				go func() {
					waiting <- l.Admit(c.floodOne, false, nil, func() {})
				}()
				synctest.Wait()
				select {
				case <-waiting:
					t.Fatal("a message nobody waits for took urgent room")
				default:
				}
				for _, m := range c.urgent {
					if !l.Admit(m, true, nil, func() {}) {
						t.Fatal("an urgent message waited behind the flood")
					}
				}
				if l.Admit(c.over, true, closedChannel(), func() {}) {
					t.Fatal("urgent messages took more than an eighth more")
				}
				// The commit in flight ends, and the loop takes the
				// queue: room.
				for _, m := range append(c.flood, c.urgent...) {
					l.Append(m)
				}
				close(store.hold)
				if !<-waiting {
					t.Fatal("the flood's message got no room made for it")
				}
			})
		})
	}
}

func TestLog_AFloodBesideAWaiterGetsHalfTheQueue(t *testing.T) {
	// The queue holds 16 messages and 320 bytes: 16 of 20 fit, but once
	// someone waited (the loop hurries), 8.
	synctest.Test(t, func(t *testing.T) {
		store, l := startHeld(16, 320)
		defer l.Stop()
		close(store.hold)
		synctest.Wait()
		admitted := func() (n int) {
			for l.Admit(20, false, closedChannel(), func() {}) {
				n++
			}
			for range n {
				l.GiveBack(20)
			}
			return n
		}
		calm := admitted()
		<-enqueue(t, l, 3).Done()
		if hurried := admitted(); calm != 16 || hurried != 8 {
			t.Fatalf("%d admitted while calm, %d beside a waiter; want "+
				"16 and 8", calm, hurried)
		}
	})
}

func TestLog_AnAwaitedHeadGoesBeforeAFloodAndHurriesItBriefly(t *testing.T) {
	// The queue holds 16 messages and 320 bytes: chunks of 40 bytes.
	// While the commit in flight holds the loop, a flood of 92 bytes on
	// "large" fills the next batch, and a new topic's head is awaited,
	// with the reserve: they commit first, alone, and the flood after
	// them in chunks.
	// The loop hurries for at most headTakes batches, then commits a
	// flood whole.
	synctest.Test(t, func(t *testing.T) {
		store, l := startHeld(16, 320)
		defer l.Stop()
		flood := func() {
			for _, m := range []int{20, 22, 24, 26} {
				enqueue(t, l, m)
			}
		}
		flood()
		l.SetHead("small", 100)
		l.Reserve(200)
		head := l.Await("small")
		close(store.hold)
		<-head.Done()
		synctest.Wait()
		for range headTakes {
			flood()
			time.Sleep(time.Second) // it lingers: it is under half
		}
		store.mu.Lock()
		batches := slices.Clone(store.batches)
		store.mu.Unlock()
		var got [][]int
		for _, b := range batches {
			got = append(got, b.Messages)
		}
		switch {
		case len(got[1]) != 0 || batches[1].Heads["small"] != 100 ||
			batches[1].Reserve == nil || *batches[1].Reserve != 200:
			t.Fatalf("batches %v, the second with heads %v and reserve "+
				"%v; want the head and the reserve alone", got,
				batches[1].Heads, batches[1].Reserve)
		case !slices.Equal(got[2], []int{20, 22}):
			t.Fatalf("batches %v; want the flood after the head in chunks",
				got)
		case !slices.Equal(got[len(got)-1], []int{20, 22, 24, 26}):
			t.Fatalf("batches %v; want the last flood whole", got)
		}
	})
}

func TestLog_TheMessageBehindAnAwaitedHeadGoesBeforeTheFlood(t *testing.T) {
	// As above, a new topic's head commits before a flood of 92 bytes.
	// Its publisher then appends the topic's first message: a confirmed
	// one commits before the flood's first chunk, which the loop holds
	// back for it; one nobody waits for, with the flood, which the loop
	// held back no longer than it took to come.
	for _, c := range []struct {
		name    string
		message int
		want    [][]int
	}{
		{"confirmed", 3, [][]int{{40}, nil, {3}, {20, 22}, {24, 26}}},
		{"unconfirmed", 2, [][]int{{40}, nil, {20, 22}, {24, 26}, {2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, l := startHeld(16, 320)
				defer l.Stop()
				var flood *Outcome
				for _, m := range []int{20, 22, 24, 26} {
					flood = enqueue(t, l, m)
				}
				l.SetHead("small", 100)
				head := l.Await("small")
				var floodAt time.Duration
				start := time.Now()
				store.during = func(b *Batch[int]) {
					if slices.Equal(b.Messages, []int{20, 22}) {
						floodAt = time.Since(start)
					}
				}
				close(store.hold)
				<-head.Done()
				message := enqueue(t, l, c.message)
				<-message.Done()
				<-flood.Done()
				store.committed(t, c.want)
				if floodAt != 0 {
					t.Errorf("the flood waited %v for a message that came "+
						"at once", floodAt)
				}
			})
		})
	}
}

func TestLog_AConfirmWaitsForAChunkOfAFloodNotAllOfIt(t *testing.T) {
	// The queue holds 16 messages and 320 bytes: chunks of 40 bytes. A
	// flood of 92 bytes on "large" is queued beside a waited-for message
	// on "small", which commits first and makes the loop hurry: the flood
	// commits in chunks. While its first chunk commits, another message
	// is waited for: on "small", it commits before the flood's second
	// chunk; on "large", which that chunk must precede, after it. With
	// nobody waiting, the flood commits whole.
	for _, c := range []struct {
		name        string
		first, late int
		want        [][]int
	}{
		{"another topic", 3, 5,
			[][]int{{40}, {3}, {20, 22}, {5}, {24, 26}}},
		{"the flood's topic", 3, 11,
			[][]int{{40}, {3}, {20, 22}, {24, 26}, {11}}},
		{"nobody waiting", 2, 0,
			[][]int{{40}, {20, 22, 24, 26, 2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, l := startHeld(16, 320)
				defer l.Stop()
				for _, m := range []int{20, 22, 24, 26, c.first} {
					enqueue(t, l, m)
				}
				var late *Outcome
				store.during = func(b *Batch[int]) {
					if c.late != 0 && late == nil &&
						slices.Equal(b.Messages, []int{20, 22}) {
						late = enqueue(t, l, c.late)
					}
				}
				close(store.hold)
				synctest.Wait()
				if late != nil {
					<-late.Done()
				}
				// A flood nobody waits for lingers: it is less than
				// half the queue.
				time.Sleep(time.Second)
				store.committed(t, c.want)
			})
		})
	}
}

func TestLog_AForgetCommitsNoLaterThanAHeadSetAfterIt(t *testing.T) {
	// A topic forgotten in a batch that commits in chunks, and made again
	// while the first chunk commits: its new head, awaited, is stolen
	// before the flood's next chunk, and the forget must not follow it,
	// or it would delete the head the new topic's seqs stand on.
	synctest.Test(t, func(t *testing.T) {
		store, l := startHeld(16, 320)
		defer l.Stop()
		var head *Outcome
		store.during = func(b *Batch[int]) {
			if head == nil && slices.Equal(b.Messages, []int{20, 22}) {
				l.SetHead("gone", 50)
				head = l.Await("gone")
			}
		}
		// A confirm makes the loop hurry: the next batch goes in chunks.
		confirmed := enqueue(t, l, 3)
		close(store.hold)
		<-confirmed.Done()
		for _, m := range []int{20, 22, 24, 26} {
			enqueue(t, l, m)
		}
		l.Forget("gone", 7)
		synctest.Wait()
		time.Sleep(time.Second)
		if head == nil {
			t.Fatal("the flood did not commit in chunks")
		}
		<-head.Done()
		time.Sleep(time.Second)
		store.mu.Lock()
		defer store.mu.Unlock()
		forgot, headSet := -1, -1
		for i, b := range store.batches {
			if _, ok := b.Forgets["gone"]; ok {
				forgot = i
			}
			if b.Heads["gone"] == 50 {
				headSet = i
			}
		}
		if forgot < 0 || headSet < 0 || forgot > headSet {
			t.Fatalf("the forget committed in batch %d, the head set after "+
				"it in batch %d", forgot, headSet)
		}
	})
}

// A batch that carries only the reserve is committed: it is not empty.
func TestLog_AReserveAloneIsCommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &memory{cursors: map[string]uint64{}}
		l := start(store, func(*Batch[int], error) {})
		defer l.Stop()
		l.Reserve(0)
		<-l.Barrier().Done()
		store.mu.Lock()
		defer store.mu.Unlock()
		if len(store.batches) != 1 || store.batches[0].Reserve == nil ||
			*store.batches[0].Reserve != 0 {
			t.Fatalf("batches %v; want one with the reserve 0",
				store.batches)
		}
	})
}

// closedChannel returns a channel that is already closed: Admit gives
// up at once when there is no room.
func closedChannel() chan struct{} {
	done := make(chan struct{})
	close(done)
	return done
}
