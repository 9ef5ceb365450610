package queue

import (
	"fmt"
	"testing"
)

// An outbox that drained a burst keeps no array for its idle connection:
// the array goes to spareFrames, and whichever outbox takes it next
// starts empty, with nothing of the frames it held before.
func TestOutbox_AnIdleOutboxKeepsNoArrayAndReusesOneEmpty(t *testing.T) {
	writes := make(chan struct{}, 10)
	o := NewOutbox(1<<20, func() { writes <- struct{}{} }, nil)
	for i := range 100 {
		o.Push([]byte(fmt.Sprint("a", i)))
	}
	<-writes // the first push into the idle outbox started a writer
	batch := o.Take(nil)
	if len(batch) != 100 || string(batch[99]) != "a99" {
		t.Fatalf("took %d frames, want the 100 pushed", len(batch))
	}
	if rest := o.Take(batch[:0]); len(rest) != 0 || o.writing ||
		o.frames != nil {
		t.Fatalf("idle outbox: %d frames taken, writing %v, array of %d",
			len(rest), o.writing, cap(o.frames))
	}
	for _, next := range []*Outbox{o, NewOutbox(1<<20,
		func() { writes <- struct{}{} }, nil)} {
		next.Push([]byte("b"))
		<-writes
		if got := next.Take(nil); len(got) != 1 || string(got[0]) != "b" {
			t.Fatalf("after the array was pooled: took %q, want [b]", got)
		}
	}
}
