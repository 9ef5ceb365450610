package memlog_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/popsub/popsub/groupcommit"
	"github.com/popsub/popsub/memlog"
)

// message is the smallest message: a place and a payload size, and the
// delayed record its storing deletes.
type message struct {
	topic    string
	seq      uint64
	size     int
	releases string
	released uint64
}

func placeOf(m message) memlog.Record {
	return memlog.Record{Topic: m.topic, Seq: m.seq, Size: m.size,
		Releases: m.releases, Released: m.released}
}

type batch = groupcommit.Batch[message]

// seqs lists the seqs topic holds after seq after, read as a replay
// would: limit messages at most, and stopping once maxBytes is passed.
func seqs(t *testing.T, s *memlog.Store[message], topic string, after uint64,
	limit, maxBytes int) []uint64 {
	t.Helper()
	msgs, err := s.Read(topic, after, limit, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, m := range msgs {
		out = append(out, m.seq)
	}
	return out
}

func TestStore_AppliesABatchAsTheBatchSays(t *testing.T) {
	s := memlog.New(placeOf)
	var first batch
	for seq := range uint64(5) {
		first.Messages = append(first.Messages,
			message{topic: "jobs", seq: seq + 1, size: 10})
	}
	first.Messages = append(first.Messages,
		message{topic: "$delayed/jobs", seq: 1, size: 10},
		message{topic: "$delayed/jobs", seq: 2, size: 10})
	first.Heads = map[string]uint64{"jobs": 100}
	first.Cursors = map[string]uint64{"alice": 3}
	if err := s.Commit(&first); err != nil {
		t.Fatal(err)
	}

	// The delayed record 1 goes as its message is stored; seq 1 is
	// trimmed and seq 3 deleted.
	second := batch{
		Messages: []message{{topic: "jobs", seq: 6, size: 10,
			releases: "$delayed/jobs", released: 1}},
		Trims:   map[string]uint64{"jobs": 1},
		Deletes: map[string][]uint64{"jobs": {3}},
	}
	if err := s.Commit(&second); err != nil {
		t.Fatal(err)
	}
	if got := seqs(t, s, "jobs", 0, 100, 1<<20); !slices.Equal(got,
		[]uint64{2, 4, 5, 6}) {
		t.Errorf("jobs holds %v, want 2 4 5 6", got)
	}
	if got := seqs(t, s, "$delayed/jobs", 0, 100, 1<<20); !slices.Equal(got,
		[]uint64{2}) {
		t.Errorf("$delayed/jobs holds %v, want 2", got)
	}
	heads, _ := s.Topics()
	if heads["jobs"] != 100 || heads["$delayed/jobs"] != 2 {
		t.Errorf("heads %v, want jobs 100 (reserved), $delayed/jobs 2", heads)
	}
	if position, ok, _ := s.Cursor("alice"); !ok || position != 3 {
		t.Errorf("cursor alice at %d (%v), want 3", position, ok)
	}
	if _, ok, _ := s.Cursor("bob"); ok {
		t.Error("cursor bob found, never stored")
	}

	// Reads stop at the count, after the first payload past the bytes,
	// and start after the seq asked.
	if got := seqs(t, s, "jobs", 0, 2, 1<<20); !slices.Equal(got,
		[]uint64{2, 4}) {
		t.Errorf("2 messages read as %v", got)
	}
	if got := seqs(t, s, "jobs", 0, 100, 15); !slices.Equal(got,
		[]uint64{2, 4}) {
		t.Errorf("15 bytes read as %v, want 2 4 (the second passes)", got)
	}
	if got := seqs(t, s, "jobs", 4, 100, 1<<20); !slices.Equal(got,
		[]uint64{5, 6}) {
		t.Errorf("after 4 read as %v", got)
	}
}

func TestStore_ACopyIsTheDiskARestartFinds(t *testing.T) {
	s := memlog.New(placeOf)
	s.Commit(&batch{Messages: []message{{topic: "jobs", seq: 1}}})
	kept := s.Copy()
	s.Commit(&batch{Messages: []message{{topic: "jobs", seq: 2}}})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	err := s.Commit(&batch{Messages: []message{{topic: "jobs", seq: 3}}})
	if !errors.Is(err, memlog.ErrClosed) {
		t.Errorf("a commit after Close: %v, want ErrClosed", err)
	}
	if got := seqs(t, s, "jobs", 0, 10, 1<<20); !slices.Equal(got,
		[]uint64{1, 2}) {
		t.Errorf("closed store reads %v, want 1 2", got)
	}
	if got := seqs(t, kept, "jobs", 0, 10, 1<<20); !slices.Equal(got,
		[]uint64{1}) {
		t.Errorf("the copy reads %v, want what there was: 1", got)
	}
	if err := kept.Commit(&batch{Messages: []message{{topic: "jobs",
		seq: 2}}}); err != nil {
		t.Errorf("the copy is open: %v", err)
	}
}

func TestContents_WithoutHeadsKeepsOnlyWhatWasStored(t *testing.T) {
	c := memlog.NewContents(placeOf)
	c.Apply(&batch{Messages: []message{{topic: "jobs", seq: 1}},
		Heads: map[string]uint64{"jobs": 50}}, false)
	if c.Heads["jobs"] != 1 {
		t.Errorf("head %d without reservations, want 1", c.Heads["jobs"])
	}
	clone := c.Clone()
	clone.Apply(&batch{Messages: []message{{topic: "jobs", seq: 2}}}, true)
	if len(c.Logs["jobs"]) != 1 || c.Heads["jobs"] != 1 {
		t.Errorf("a clone's batch changed the original: %v %v", c.Logs,
			c.Heads)
	}
}

// What waits is found as boltstore's index finds it: by due time,
// earliest first across logs, within until and at most n; and by its
// publisher and id. A record released (sent) is found no more.
func TestStore_FindsWhatWaits(t *testing.T) {
	waits := map[uint64]int64{1: 300, 2: 100, 3: 200}
	s := memlog.New(func(m message) memlog.Record {
		r := placeOf(m)
		if m.topic == "$delayed/a" {
			r.DeliverAt, r.Publisher, r.ID = waits[m.seq], "pub",
				string(rune('a'+m.seq))
		}
		return r
	})
	s.Commit(&batch{Messages: []message{{topic: "$delayed/a", seq: 1},
		{topic: "$delayed/a", seq: 2}, {topic: "$delayed/a", seq: 3},
		{topic: "a", seq: 1}}})
	due := func(until int64, n int) []uint64 {
		var found []uint64
		s.Due(until, n, func(_ string, seq uint64, _ int64) {
			found = append(found, seq)
		})
		return found
	}
	if got := due(250, 10); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("due by 250: %v, want [2 3]", got)
	}
	if got := due(1000, 2); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("two due by 1000: %v, want [2 3]", got)
	}
	if seq, ok, _ := s.Waiting("$delayed/a", "pub", "c"); seq != 2 || !ok {
		t.Fatalf("Waiting c = %d %v, want 2", seq, ok)
	}
	s.Commit(&batch{Messages: []message{{topic: "a", seq: 2,
		releases: "$delayed/a", released: 2}}})
	if got := due(1000, 10); !slices.Equal(got, []uint64{3, 1}) {
		t.Fatalf("due after seq 2 was sent: %v, want [3 1]", got)
	}
	if _, ok, _ := s.Waiting("$delayed/a", "pub", "c"); ok {
		t.Fatal("Waiting found a record sent")
	}
}
