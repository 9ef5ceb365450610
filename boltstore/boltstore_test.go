package boltstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/popsub/popsub"
	bolt "go.etcd.io/bbolt"
)

// What every Store must do is checked in popsub's own tests
// (TestStore_Contract, on this store too); here is what is particular to
// bbolt: the arena, the backwards trim, and a file that is not ours.

// openStore opens the store at path or fails the test.
func openStore(t testing.TB, path string) *Store {
	t.Helper()
	store, err := Open(path, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return store
}

// message returns a message on topic t at seq, as a store reads one back,
// with payload (JSON) and publisher.
func message(t *testing.T, seq uint64,
	payload, publisher string) *popsub.Message {
	t.Helper()
	frame := fmt.Sprintf(`{"topic":"t","message_id":"m%d","seq":%d,`+
		`"payload":%s}`, seq, seq, payload)
	m, err := popsub.RestoreMessage([]byte(frame), publisher)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The bbolt store writes each batch's records into one arena that the
// next batch reuses, and grows it when its estimate falls short (a
// publisher's name with characters to escape): every record must come
// back as it went in, from batches of any size in any order.
func TestBoltStore_EachBatchKeepsItsOwnRecords(t *testing.T) {
	store := openStore(t, filepath.Join(t.TempDir(), "popsub.db"))
	defer store.Close()
	want := map[uint64]string{}
	seq := uint64(0)
	for _, size := range []int{40, 1, 300, 2, 120} {
		var batch popsub.Batch
		for range size {
			seq++
			payload := strings.Repeat("x", int(seq*7%200))
			publisher := strings.Repeat(`"\`, int(seq%5))
			m := message(t, seq, strconv.Quote(payload), publisher)
			batch.Messages = append(batch.Messages, m)
			want[seq] = payload + "|" + publisher
		}
		if err := store.Commit(&batch); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := store.Read("t", 0, 1<<20, 1<<30)
	if err != nil || len(msgs) != len(want) {
		t.Fatalf("Read: %d messages, %v; want %d", len(msgs), err, len(want))
	}
	for _, m := range msgs {
		var payload string
		json.Unmarshal(m.Payload, &payload)
		if got := payload + "|" + m.Publisher(); got != want[m.Seq] {
			t.Fatalf("seq %d came back as %q, want %q", m.Seq, got,
				want[m.Seq])
		}
	}
}

// A trim deletes from the last seq it drops back to the first, across
// many of bbolt's pages, over gaps in the seqs, and never a seq it keeps.
func TestBoltStore_TrimsExactlyUpToItsSeq(t *testing.T) {
	store := openStore(t, filepath.Join(t.TempDir(), "popsub.db"))
	defer store.Close()
	var batch popsub.Batch
	for seq := uint64(1); seq <= 5000; seq++ {
		if seq%7 != 3 { // a gap every seventh seq
			batch.Messages = append(batch.Messages, &popsub.Message{Topic: "t",
				ID: fmt.Sprint(seq), Seq: seq, Payload: json.RawMessage(`1`)})
		}
	}
	if err := store.Commit(&batch); err != nil {
		t.Fatal(err)
	}
	for _, upTo := range []uint64{0, 1, 2, 3, 1000, 3001, 3003, 4999, 4999,
		6000} {
		if err := store.Commit(&popsub.Batch{Trims: map[string]uint64{
			"t": upTo}}); err != nil {
			t.Fatal(err)
		}
		msgs, err := store.Read("t", 0, 1<<20, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for seq := upTo + 1; seq <= 5000; seq++ {
			if seq%7 != 3 {
				want++
			}
		}
		if len(msgs) != want || want > 0 && msgs[0].Seq <= upTo {
			t.Fatalf("after a trim to %d: %d messages from seq %v, want %d",
				upTo, len(msgs), firstSeqOf(msgs), want)
		}
	}
}

// A log trimmed or deleted empty leaves its topic's head alone in the
// file, inside its parent's page: a topic whose messages all expired
// must not keep a page of 4 KiB for as long as the file lives, which a
// publisher of many topic names (one per device, say) turned into
// gigabytes. Its seqs go on from the head, after a reopen too.
func TestBoltStore_AnEmptiedLogKeepsItsHeadInNoPageOfItsOwn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	store := openStore(t, path)
	const n = 200
	var batch popsub.Batch
	trims := map[string]uint64{}
	for i := range n {
		topic := fmt.Sprintf("device/%d", i)
		batch.Messages = append(batch.Messages, &popsub.Message{
			Topic: topic, ID: "m", Seq: 7, Payload: json.RawMessage(`1`)})
		trims[topic] = 7
	}
	if err := store.Commit(&batch); err != nil {
		t.Fatal(err)
	}
	// Half go by a trim, as the TTL takes them; half by a delete.
	deletes := map[string][]uint64{}
	for i := n / 2; i < n; i++ {
		topic := fmt.Sprintf("device/%d", i)
		delete(trims, topic)
		deletes[topic] = []uint64{7}
	}
	err := store.Commit(&popsub.Batch{Trims: trims, Deletes: deletes})
	if err != nil {
		t.Fatal(err)
	}
	var pages int
	store.db.View(func(tx *bolt.Tx) error {
		stats := tx.Bucket(topicsBucket).Stats()
		pages = stats.BranchPageN + stats.LeafPageN
		return nil
	})
	if pages > n/20 {
		t.Errorf("%d emptied logs take %d pages, want a few in all", n, pages)
	}
	store.Close()

	store = openStore(t, path)
	defer store.Close()
	heads, err := store.Topics()
	if err != nil || len(heads) != n || heads["device/3"] != 7 {
		t.Fatalf("after a reopen: %d heads (device/3 at %d), %v; want %d "+
			"at 7", len(heads), heads["device/3"], err, n)
	}
	// The next append makes the log again.
	err = store.Commit(&popsub.Batch{Messages: []*popsub.Message{{
		Topic: "device/3", ID: "m8", Seq: 8, Payload: json.RawMessage(`2`)}}})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := store.Read("device/3", 0, 10, 1<<20)
	if err != nil || len(msgs) != 1 || msgs[0].Seq != 8 {
		t.Fatalf("Read after the next append: %d messages, %v", len(msgs),
			err)
	}
}

// firstSeqOf returns the first message's seq, or nil for none.
func firstSeqOf(msgs []*popsub.Message) any {
	if len(msgs) == 0 {
		return nil
	}
	return msgs[0].Seq
}

func TestBoltStore_Faults(t *testing.T) {
	t.Run("a second open of the same file fails with a clear error",
		func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "popsub.db")
			first := openStore(t, path)
			defer first.Close()
			_, err := Open(path, nil)
			if err == nil || !strings.Contains(err.Error(), "in use") {
				t.Fatalf("second open: %v, want 'in use'", err)
			}
		})
	t.Run("a file that is not a database is refused", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "popsub.db")
		junk := []byte(strings.Repeat("not a database ", 1024))
		if err := os.WriteFile(path, junk, 0o600); err != nil {
			t.Fatal(err)
		}
		if store, err := Open(path, nil); err == nil {
			store.Close()
			t.Fatal("OpenBolt accepted a corrupt file")
		}
	})
}

// BenchmarkCommitWithTrim commits what a busy topic at its count cap
// commits: 256 new 64-byte messages and a trim of the 256 oldest, on a
// log of 4,096. The syncs are off, to measure the work around them.
func BenchmarkCommitWithTrim(b *testing.B) {
	store, err := Open(filepath.Join(b.TempDir(), "log.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	store.db.NoSync = true
	seq := uint64(0)
	if err := store.Commit(benchBatch(&seq, 4096)); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		next := benchBatch(&seq, 256)
		next.Trims["t"] = seq - 4096
		if err := store.Commit(next); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTrim times a commit that trims n records, and nothing else,
// from the front of an 8,192-record log: a busy topic's trim per commit.
// Trimming forwards from First again after each delete made it n
// squared; backwards it is linear.
func BenchmarkTrim(b *testing.B) {
	for _, n := range []int{256, 1024, 4096} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			store, err := Open(filepath.Join(b.TempDir(), "log.db"),
				nil)
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			store.db.NoSync = true
			seq := uint64(0)
			fill := func(n int) {
				if err := store.Commit(benchBatch(&seq, n)); err != nil {
					b.Fatal(err)
				}
			}
			fill(8192)
			for b.Loop() {
				b.StopTimer()
				fill(n)
				b.StartTimer()
				trim := map[string]uint64{"t": seq - 8192}
				if err := store.Commit(&popsub.Batch{Trims: trim}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchBatch returns a batch of n 64-byte messages on topic t, after seq,
// which it advances.
func benchBatch(seq *uint64, n int) *popsub.Batch {
	payload := json.RawMessage(`"` + strings.Repeat("x", 62) + `"`)
	batch := &popsub.Batch{Trims: map[string]uint64{}}
	for range n {
		*seq++
		m := &popsub.Message{Topic: "t", ID: fmt.Sprint(*seq), Seq: *seq,
			Payload: payload}
		batch.Messages = append(batch.Messages, m)
	}
	return batch
}

// A file that a broker from before reserved seqs left unclean has every
// head raised by legacyGap, once: seqs go on past any a subscriber may
// have seen, and a second Open changes nothing.
func TestOpen_ClosesALegacyGapOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	store := openStore(t, path)
	err := store.Commit(&popsub.Batch{Heads: map[string]uint64{"t": 5},
		Cursors: map[string]uint64{legacyClean: 0}})
	if err != nil {
		t.Fatal(err)
	}
	store.Close()
	for range 2 {
		store = openStore(t, path)
		heads, err := store.Topics()
		store.Close()
		if err != nil || heads["t"] != 5+legacyGap {
			t.Fatalf("head %d, %v; want %d", heads["t"], err, 5+legacyGap)
		}
	}
}

// The index of what waits: Due finds the $delayed logs' records by due
// time, earliest first across logs, within until and at most n; Waiting
// finds one by its publisher and message_id; a delete takes a record out
// of both; and a file whose index is missing (one written before there
// was one) has it made again at Open.
func TestBoltStore_IndexesWhatWaits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	store := openStore(t, path)
	waiting := func(log string, seq uint64, at int64) *popsub.Message {
		frame := fmt.Sprintf(`{"topic":%q,"message_id":"m%d","seq":%d,`+
			`"payload":1,"deliver_at":%d}`, log, seq, seq, at)
		m, err := popsub.RestoreMessage([]byte(frame), "pub")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	batch := popsub.Batch{Messages: []*popsub.Message{
		waiting("$delayed/a", 1, 300), waiting("$delayed/a", 2, 100),
		waiting("$delayed/b", 1, 200), waiting("$delayed/b", 2, 900),
		message(t, 1, "1", "pub"), // sent, not waiting: never indexed
	}}
	if err := store.Commit(&batch); err != nil {
		t.Fatal(err)
	}
	due := func(s *Store, until int64, n int) string {
		var found []string
		err := s.Due(until, n, func(log string, seq uint64, at int64) {
			found = append(found, fmt.Sprintf("%s %d@%d", log, seq, at))
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(found, ", ")
	}
	check := func(s *Store, until int64, n int, want string) {
		t.Helper()
		if got := due(s, until, n); got != want {
			t.Fatalf("Due(%d, %d) = %q, want %q", until, n, got, want)
		}
	}
	check(store, 1000, 10, "$delayed/a 2@100, $delayed/b 1@200, "+
		"$delayed/a 1@300, $delayed/b 2@900")
	check(store, 250, 10, "$delayed/a 2@100, $delayed/b 1@200")
	check(store, 1000, 1, "$delayed/a 2@100")
	if seq, ok, err := store.Waiting("$delayed/b", "pub", "m2"); seq != 2 ||
		!ok || err != nil {
		t.Fatalf("Waiting = %d %v %v, want 2", seq, ok, err)
	}
	if _, ok, _ := store.Waiting("$delayed/b", "other", "m2"); ok {
		t.Fatal("Waiting found another publisher's id")
	}

	deletes := popsub.Batch{Deletes: map[string][]uint64{"$delayed/a": {2}}}
	if err := store.Commit(&deletes); err != nil {
		t.Fatal(err)
	}
	check(store, 1000, 10, "$delayed/b 1@200, $delayed/a 1@300, "+
		"$delayed/b 2@900")
	if _, ok, _ := store.Waiting("$delayed/a", "pub", "m2"); ok {
		t.Fatal("Waiting found a deleted record")
	}

	// The index gone, as in a file from before it, is made at Open.
	store.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return errors.Join(tx.DeleteBucket(dueBucket),
			tx.DeleteBucket(waitingBucket))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	store = openStore(t, path)
	defer store.Close()
	check(store, 1000, 10, "$delayed/b 1@200, $delayed/a 1@300, "+
		"$delayed/b 2@900")
	if seq, ok, _ := store.Waiting("$delayed/a", "pub", "m1"); seq != 1 ||
		!ok {
		t.Fatalf("Waiting after the index was made again = %d %v", seq, ok)
	}
}

// BenchmarkCursors_DiskPerName reports what a durable name keeps on disk
// once its subscription has ended: the file's growth for 20,000 names'
// cursors (subject, name and topic, as a durable key joins them),
// committed a hundred at a time as a busy committer would, divided by
// 20,000. Nothing deletes a cursor (docs/security.md).
func BenchmarkCursors_DiskPerName(b *testing.B) {
	const names = 20000
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "log.db")
		store, err := Open(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		store.db.NoSync = true
		before := fileSize(b, path)
		for i := 0; i < names; i += 100 {
			batch := &popsub.Batch{Cursors: map[string]uint64{}}
			for j := i; j < i+100; j++ {
				key := "alice\x00name-" + strconv.Itoa(j) + "\x00dur/t"
				batch.Cursors[key] = uint64(j)
			}
			if err := store.Commit(batch); err != nil {
				b.Fatal(err)
			}
		}
		if err := store.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(fileSize(b, path)-before)/names,
			"file-B/name")
	}
}

// fileSize is the size of the file at path.
func fileSize(b *testing.B, path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return info.Size()
}
