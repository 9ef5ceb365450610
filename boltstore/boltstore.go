// Package boltstore is PopSub's log on disk: a popsub.Store in one bbolt
// file beside the binary, no server.
//
// # The contract
//
// popsub.go declares what a Store must do (its section "The machine
// room"): Commit applies a batch of forgets, appends, trims, heads, the
// reserve and cursor moves atomically and durably; Read returns a
// topic's messages after a seq, in seq order; Topics returns every
// topic's head, which survives the log being trimmed empty; Cursor reads
// a durable cursor. It is a Forgetter (section "Retention"): a forget
// deletes a topic whole, Floor says past which seq a topic made again
// starts (the highest head forgotten, or the reserve, whichever is
// higher), and CursorKeys which topics a cursor keeps. It is a DueIndex
// too (section "Delayed delivery"): Due and Waiting find what waits in
// the $delayed logs, by due time and by message_id. The broker's
// committer gathers the batches (group commit); this package writes each
// one in one transaction and one sync.
//
// # The mechanism
//
// bbolt is a single-file, transactional, embedded B+tree: one file beside
// the binary, no server. Each topic is a bucket of records keyed by
// big-endian seq, so a cursor walks them in seq order; the topic's head
// is kept beside them so seqs never restart after the log is trimmed
// empty, and once the broker forgets the topic, the floor keeps the
// highest head forgotten. Each record carries a CRC-32 of its bytes:
// bbolt checks only its own meta pages, and a flipped bit in a payload
// must not be delivered as if it were good. A log in bbolt costs a
// B+tree where an append-only file would do; the tree buys
// transactions, cursors by seq and trims without a compactor, in a
// library a reader can trust. bbolt panics on a damaged page and faults
// on a file cut short; here either costs the caller an error that names
// the file, never the process, and the command's db check and db salvage
// read what is left.
//
// A file written by a broker from before seqs were reserved on disk, and
// left unclean, has its heads raised once at Open (closeLegacyGap).
//
// # What waits
//
// A delayed message waits in a $delayed log until it is due, and the
// broker must find what falls due, and a publisher's repeat of one,
// without holding every waiting message in memory: the store is its
// DueIndex. Two buckets beside the logs index the $delayed records, by
// due time (then seq and log, so that one cursor walks them all in the
// order they fall due) and by log, publisher and message_id; each
// record is indexed in the transaction that appends it and unindexed in
// the one that deletes it, which is the one that stores its sent copy
// (Message.Releases), so the index never names a record the log lacks.
// Keeping the index in each $delayed log's own bucket was the other
// way, and made every read of what is due a merge across the logs. A
// file from before the index, or one Salvage wrote (it copies records
// alone), has it made at Open (indexWaiting).
//
// # What each speed trick buys
//
// Measured with the benchmarks named (docs/performance.md says how):
//
//	trick                                buys
//	one transaction per batch            one sync for up to 8,192 messages
//	one arena per batch (appendMessages) a tenth of a busy broker's allocations
//	pages filled (FillPercent 1.0)       half the file for the same log
//	trims walk backwards (trimLog)       BenchmarkTrim: 8x faster at 4,096
//	one head write per run of a topic    most of an append's work, 100 a batch
package boltstore

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/wire"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Errors that Open's and a Store's errors wrap.
var (
	// ErrInUse is what Open's error wraps when another process has the
	// file open.
	ErrInUse = errors.New("database is in use by another process")
	// ErrDamaged is what a Store's errors wrap when bbolt met a damaged
	// page or a file cut short.
	ErrDamaged = errors.New("damaged")
)

// The file's layout, which Store writes and Salvage reads back without a
// store (a damaged file may not open as one): a topics bucket with a
// bucket per topic, holding the topic's records under logBucket, keyed
// by seqKey (no logBucket while it has none), and its head under
// headKey; and a cursors bucket, from a durable key to its position as a
// seqKey, under floorKey the highest head of a topic the store forgot,
// and under reserveKey the reserve (popsub.Batch.Reserve). The index of
// what waits in the $delayed logs (the broker's DueIndex) is two more: a
// due bucket, keyed by dueKey (due time, seq and log), and a waiting
// bucket, from an idKey (log, publisher and message_id) to the record's
// seqKey. A record is what encodeRecord makes; recordIntact checks one.
var (
	topicsBucket  = []byte("topics")  // topic name → topic bucket
	cursorsBucket = []byte("cursors") // durable key → position
	logBucket     = []byte("log")     // in a topic bucket: seq → record
	headKey       = []byte("head")    // in a topic bucket: newest seq
	dueBucket     = []byte("due")     // dueKey → nil
	waitingBucket = []byte("waiting") // idKey → seq
)

// Store is the Store kept in one bbolt file. bbolt allows one
// writing transaction at a time and any number of readers beside it, so
// replays read while the committer writes, and need no lock of ours.
type Store struct {
	db     *bolt.DB     // the open file
	path   string       // its name, for errors
	logger *slog.Logger // where corrupt records are reported
	// arena holds the records of the batch being committed, kept for the
	// next one (appendMessages): as large as the largest batch, about a
	// MiB, once per store. bbolt runs one Commit at a time.
	arena []byte
}

// Open opens (or creates) the bbolt file at path. It fails within a
// second if another process has the file open.
func Open(path string, logger *slog.Logger) (_ *Store, err error) {
	// A damaged file is closed again, so that its lock goes with it. A
	// panic inside bolt.Open leaves no DB to close: the lock then lasts
	// as long as the process, which serve ends at once.
	var db *bolt.DB
	defer func() {
		if err != nil && db != nil {
			db.Close()
		}
	}()
	defer guard(path, &err)()

	// bbolt locks the file; without a timeout, a second broker on the
	// same file would wait for the lock for ever, saying nothing.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open %s: %w", path, ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}

	// The two top buckets are made once, so that no reader need check
	// for them.
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{topicsBucket, cursorsBucket} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if err := closeLegacyGap(tx); err != nil {
			return err
		}
		return indexWaiting(tx)
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	logger = cmp.Or(logger, slog.Default())
	return &Store{db: db, path: path, logger: logger}, nil
}

// legacyClean is the cursor where brokers from before popsub.go reserved
// seqs on disk marked the file closed (1) or in use (0), and legacyGap
// how far past its stored head such a broker, stopped unclean, may have
// delivered a topic's seqs: 8,192, twice its queue.
const (
	legacyClean = "\x00clean"
	legacyGap   = 8192
)

// closeLegacyGap raises every topic's head by legacyGap, once, on a file
// such a broker left unclean, so that no seq a subscriber may have seen
// is given out again; then it marks the file closed.
func closeLegacyGap(tx *bolt.Tx) error {
	cursors, topics := tx.Bucket(cursorsBucket), tx.Bucket(topicsBucket)
	if clean, ok := seqOf(cursors.Get([]byte(legacyClean))); !ok || clean != 0 {
		return nil
	}
	err := topics.ForEachBucket(func(name []byte) error {
		bucket := topics.Bucket(name)
		head, _ := seqOf(bucket.Get(headKey))
		return bucket.Put(headKey, seqKey(head+legacyGap))
	})
	if err != nil {
		return fmt.Errorf("close the legacy gap: %w", err)
	}
	return cursors.Put([]byte(legacyClean), seqKey(1))
}

// guard turns a panic, or a fault on the file's memory map, into an
// error that names the file and wraps ErrDamaged: bbolt panics on a
// damaged page and faults on a file cut short, and one bad page must
// cost the caller an error, not the process. Use it as defer
// guard(path, &err)(): the call turns faults into panics on this
// goroutine, and the function it returns, deferred, recovers them
// (recover works only there). Salvage reads with it too.
func guard(path string, err *error) func() {
	old := debug.SetPanicOnFault(true)
	return func() {
		debug.SetPanicOnFault(old)
		if v := recover(); v != nil {
			*err = fmt.Errorf("%s is %w (%v)", path, ErrDamaged, v)
		}
	}
}

// Commit writes a batch in one transaction: one sync for all of it.
// Trims go first, and a message the same batch trims is not written at
// all (its topic's head still moves past it). Appending and then deleting
// in one transaction cost n² here: bbolt splits the pages a transaction
// filled only when it commits, so each delete from the front of a freshly
// filled page moved everything behind it.
func (s *Store) Commit(batch *popsub.Batch) (err error) {
	defer guard(s.path, &err)()
	return s.db.Update(func(tx *bolt.Tx) error {
		for topic, head := range batch.Forgets {
			if err := forget(tx, topic, head); err != nil {
				return fmt.Errorf("forget %q: %w", topic, err)
			}
		}
		for topic, seq := range batch.Trims {
			if err := trimLog(tx, topic, seq); err != nil {
				return fmt.Errorf("trim %q: %w", topic, err)
			}
		}
		if err := s.appendMessages(tx, batch); err != nil {
			return err
		}
		for topic, seqs := range batch.Deletes {
			for _, seq := range seqs {
				if err := deleteRecord(tx, topic, seq); err != nil {
					return err
				}
			}
		}
		for topic, head := range batch.Heads {
			if err := setHead(tx, topic, head); err != nil {
				return fmt.Errorf("set head of %q: %w", topic, err)
			}
		}
		cursors := tx.Bucket(cursorsBucket)
		if batch.Reserve != nil {
			err := cursors.Put(reserveKey, seqKey(*batch.Reserve))
			if err != nil {
				return fmt.Errorf("set the reserve: %w", err)
			}
		}
		// A cursor is its key and an 8-byte position: the newest
		// position wins, in the batch as on disk.
		for key, position := range batch.Cursors {
			if err := cursors.Put([]byte(key), seqKey(position)); err != nil {
				return fmt.Errorf("save cursor: %w", err)
			}
		}
		return nil
	})
}

// appendMessages appends msgs to their topics' buckets, but for those at
// or below their topic's trim. Each run of one topic's messages looks its
// buckets up once and writes the head once: with a hundred messages in a
// batch, that was most of an append's work.
func (s *Store) appendMessages(tx *bolt.Tx, batch *popsub.Batch) error {
	msgs, topics := batch.Messages, tx.Bucket(topicsBucket)
	// Records go into one arena, sized for the batch up front: bbolt
	// keeps a reference to each value until the transaction commits, so
	// none may be reused before then, and one arena beats one allocation
	// per message, or a copy each time it outgrew itself. After the
	// commit nothing holds it, and the next batch reuses it: a fresh one
	// per batch was a tenth of what a busy broker allocated. Keys need
	// no arena: bbolt copies them.
	size := 0
	for _, m := range msgs {
		size += 4 + len(m.Frame()) + 3 + len(m.Publisher()) // encodeRecord
	}
	s.arena = slices.Grow(s.arena[:0], size)
	var key [8]byte
	for start := 0; start < len(msgs); {
		name := msgs[start].Topic
		bucket, err := topics.CreateBucketIfNotExists([]byte(name))
		var records *bolt.Bucket
		if err == nil {
			records, err = bucket.CreateBucketIfNotExists(logBucket)
		}
		if err != nil {
			return fmt.Errorf("append %q: %w", name, err)
		}

		// Keys only grow, so pages can be filled: splitting them half
		// full, bbolt's default, would double the file for nothing.
		records.FillPercent = 1.0
		head := uint64(0)
		for ; start < len(msgs) && msgs[start].Topic == name; start++ {
			m := msgs[start]
			head = max(head, m.Seq)
			if err := deleteReleased(tx, m); err != nil {
				return err
			}
			if m.Seq <= batch.Trims[name] {
				continue
			}
			from := len(s.arena)
			s.arena = encodeRecord(s.arena, m)
			record := s.arena[from:len(s.arena):len(s.arena)]
			binary.BigEndian.PutUint64(key[:], m.Seq)
			if err := records.Put(key[:], record); err != nil {
				return fmt.Errorf("append %q: %w", name, err)
			}
			if err := index(tx, m, true); err != nil {
				return fmt.Errorf("index %q: %w", name, err)
			}
		}
		// The head is written even when every record of the run was
		// trimmed: seqs must go on from it after a restart.
		if old, ok := seqOf(bucket.Get(headKey)); ok {
			head = max(head, old)
		}
		if err := bucket.Put(headKey, seqKey(head)); err != nil {
			return err
		}
	}
	return nil
}

// deleteReleased deletes the $delayed record m was sent from when it
// fell due, if it was (Message.Releases): in the transaction that
// stores m, so that no restart sends it twice.
func deleteReleased(tx *bolt.Tx, m *popsub.Message) error {
	if log, seq := m.Releases(); seq != 0 {
		return deleteRecord(tx, log, seq)
	}
	return nil
}

// deleteRecord deletes topic's record seq, if it has one, and its place
// in the index of what waits, if it has one.
func deleteRecord(tx *bolt.Tx, topic string, seq uint64) error {
	records := logOf(tx, topic)
	if records == nil {
		return nil
	}
	if v := records.Get(seqKey(seq)); v != nil &&
		strings.HasPrefix(topic, popsub.DelayedPrefix) {
		// A damaged record cannot say where it is indexed: its place
		// stays, and the broker finds the record gone when it is due.
		if m, err := decodeRecord(v); err == nil {
			if err := index(tx, m, false); err != nil {
				return fmt.Errorf("unindex %q seq %d: %w", topic, seq, err)
			}
		}
	}
	if err := records.Delete(seqKey(seq)); err != nil {
		return fmt.Errorf("delete %q seq %d: %w", topic, seq, err)
	}
	return dropIfEmpty(tx, topic, records)
}

// dropIfEmpty deletes topic's record bucket once it holds none, so that
// the topic's bucket holds its head alone: bbolt keeps such a bucket in
// its parent's page, where one with a bucket in it takes a page of its
// own, 4 KiB, for as long as the file lives. A topic whose messages all
// expired, one of many names a publisher used once, then costs the file
// 100 to 170 bytes, as the names fill pages (the root package's
// BenchmarkStart_WithManyEmptiedTopics). The next append makes the
// bucket again.
func dropIfEmpty(tx *bolt.Tx, topic string, records *bolt.Bucket) error {
	if k, _ := records.Cursor().First(); k != nil {
		return nil
	}
	err := tx.Bucket(topicsBucket).Bucket([]byte(topic)).DeleteBucket(
		logBucket)
	if err != nil {
		return fmt.Errorf("drop the empty log of %q: %w", topic, err)
	}
	return nil
}

// index adds m to the index of what waits, or, with add false, takes it
// out, if m waits in a $delayed log. Its id is taken out only if it
// still names m.
func index(tx *bolt.Tx, m *popsub.Message, add bool) error {
	if m.DeliverAt == 0 || !strings.HasPrefix(m.Topic, popsub.DelayedPrefix) {
		return nil
	}
	due, ids := tx.Bucket(dueBucket), tx.Bucket(waitingBucket)
	at, id := dueKey(m.DeliverAt, m.Seq, m.Topic), idKey(m.Topic,
		m.Publisher(), m.ID)
	if add {
		return errors.Join(due.Put(at, nil), ids.Put(id, seqKey(m.Seq)))
	}
	if seq, _ := seqOf(ids.Get(id)); seq == m.Seq {
		if err := ids.Delete(id); err != nil {
			return err
		}
	}
	return due.Delete(at)
}

// dueKey is a due time, a seq and a log as a key, which sorts by time.
func dueKey(at int64, seq uint64, log string) []byte {
	return append(binary.BigEndian.AppendUint64(seqKey(uint64(at)), seq),
		log...)
}

// idKey is a log, a publisher and a message_id as one key: each length
// but the last's first, so that no two triples make the same key.
func idKey(log, publisher, id string) []byte {
	key := binary.AppendUvarint(nil, uint64(len(log)))
	key = binary.AppendUvarint(append(key, log...), uint64(len(publisher)))
	return append(append(key, publisher...), id...)
}

// indexWaiting makes the index of what waits, if the file has none yet
// (one from before the index), from the records of every $delayed log.
func indexWaiting(tx *bolt.Tx) error {
	if tx.Bucket(dueBucket) != nil {
		return nil
	}
	for _, name := range [][]byte{dueBucket, waitingBucket} {
		if _, err := tx.CreateBucket(name); err != nil {
			return err
		}
	}
	topics := tx.Bucket(topicsBucket)
	c, prefix := topics.Cursor(), []byte(popsub.DelayedPrefix)
	for name, _ := c.Seek(prefix); bytes.HasPrefix(name, prefix); name, _ =
		c.Next() {
		records := topics.Bucket(name).Bucket(logBucket)
		if records == nil {
			continue
		}
		err := records.ForEach(func(_, v []byte) error {
			if m, err := decodeRecord(v); err == nil {
				return index(tx, m, true)
			}
			return nil // a damaged record is skipped, as a read skips it
		})
		if err != nil {
			return fmt.Errorf("index %q: %w", name, err)
		}
	}
	return nil
}

// floorKey is where the cursors bucket keeps the store's floor, the
// highest head of a topic it forgot: among the cursors, which Salvage
// copies, as a position is an 8-byte seq too. No cursor's key is a zero
// byte and one word: a durable's and a group's hold two zero bytes.
var floorKey = []byte("\x00floor")

// reserveKey is where the cursors bucket keeps the reserve, beside the
// floor: the seqs a topic with no head on disk may be given.
var reserveKey = []byte("\x00reserve")

// forget deletes topic's bucket, its records and its head, and raises
// the floor to head: a topic made again under the name starts its seqs
// past it (popsub.Forgetter).
func forget(tx *bolt.Tx, topic string, head uint64) error {
	err := tx.Bucket(topicsBucket).DeleteBucket([]byte(topic))
	if err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
		return err
	}
	cursors := tx.Bucket(cursorsBucket)
	if floor, _ := seqOf(cursors.Get(floorKey)); floor >= head {
		return nil
	}
	return cursors.Put(floorKey, seqKey(head))
}

// Floor returns the highest head of a topic the store forgot, or the
// reserve if that is higher: a topic made again starts past it.
func (s *Store) Floor() (floor uint64, err error) {
	defer guard(s.path, &err)()
	err = s.db.View(func(tx *bolt.Tx) error {
		cursors := tx.Bucket(cursorsBucket)
		floor, _ = seqOf(cursors.Get(floorKey))
		reserve, _ := seqOf(cursors.Get(reserveKey))
		floor = max(floor, reserve)
		return nil
	})
	return floor, err
}

// CursorKeys returns the key of every durable cursor.
func (s *Store) CursorKeys() (keys []string, err error) {
	defer guard(s.path, &err)()
	err = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(cursorsBucket).ForEach(func(k, _ []byte) error {
			switch string(k) {
			case legacyClean, string(floorKey), string(reserveKey):
			default:
				keys = append(keys, string(k))
			}
			return nil
		})
	})
	return keys, err
}

// setHead sets topic's stored head, making its bucket if it has none:
// a new topic's first block of seqs comes before its first message.
func setHead(tx *bolt.Tx, topic string, head uint64) error {
	bucket, err := tx.Bucket(topicsBucket).CreateBucketIfNotExists(
		[]byte(topic))
	if err != nil {
		return err
	}
	return bucket.Put(headKey, seqKey(head))
}

// trimLog deletes topic's records with seq <= upTo.
func trimLog(tx *bolt.Tx, topic string, upTo uint64) error {
	records := logOf(tx, topic)
	if records == nil {
		return nil
	}
	// The oldest records are first, so the trim deletes from the last
	// seq it drops back to the front: a Seek past it, then Prev, which
	// after a Seek past the end is the last record. Backwards, because
	// after a delete bbolt's cursor may skip the next key but never the
	// one before; starting again from First after each delete, as this
	// did, walked past every page the trim had emptied, so trimming n
	// records cost n squared (BenchmarkTrim: 8 times slower at 4,096).
	cursor := records.Cursor()
	kept, _ := cursor.Seek(seqKey(upTo + 1))
	for k, _ := cursor.Prev(); k != nil; k, _ = cursor.Prev() {
		if err := cursor.Delete(); err != nil {
			return err
		}
	}
	// A record past upTo stays: the usual trim, one record at the cap,
	// needs no second look.
	if kept != nil {
		return nil
	}
	return dropIfEmpty(tx, topic, records)
}

// logOf returns topic's record bucket, or nil if it has none.
func logOf(tx *bolt.Tx, topic string) *bolt.Bucket {
	bucket := tx.Bucket(topicsBucket).Bucket([]byte(topic))
	if bucket == nil {
		return nil
	}
	return bucket.Bucket(logBucket)
}

// Read returns up to limit records of topic after seq, and no more once
// their payloads pass maxBytes, skipping (and logging) any whose checksum
// does not match.
func (s *Store) Read(topic string, after uint64,
	limit, maxBytes int) (msgs []*popsub.Message, err error) {
	defer guard(s.path, &err)()
	err = s.db.View(func(tx *bolt.Tx) error {
		records := logOf(tx, topic)
		if records == nil {
			return nil
		}
		// A damaged record is logged and skipped, never delivered: its
		// neighbours are still good, and replay steps over the gap.
		cursor, size := records.Cursor(), 0
		for k, v := cursor.Seek(seqKey(after + 1)); k != nil &&
			len(msgs) < limit && size < maxBytes; k, v = cursor.Next() {
			m, err := decodeRecord(v)
			if err != nil {
				s.logger.Error("corrupt record skipped", "topic", topic,
					"seq", binary.BigEndian.Uint64(k), "err", err)
				continue
			}
			msgs = append(msgs, m)
			size += len(m.Payload)
		}
		return nil
	})
	return msgs, err
}

// Topics returns every topic bucket's name and head. A topic whose log
// was trimmed empty still has its bucket and its head, so it is listed:
// its next seq must not start again from 1. One the broker forgot has
// neither, and its seqs go on past the floor (Floor).
func (s *Store) Topics() (heads map[string]uint64, err error) {
	defer guard(s.path, &err)()
	heads = map[string]uint64{}
	err = s.db.View(func(tx *bolt.Tx) error {
		topics := tx.Bucket(topicsBucket)
		return topics.ForEachBucket(func(name []byte) error {
			if head, ok := seqOf(topics.Bucket(name).Get(headKey)); ok {
				heads[string(name)] = head
			}
			return nil
		})
	})
	return heads, err
}

// Cursor returns the stored position of a durable cursor. The committer
// asks only when the cursor is not in a batch it still holds.
func (s *Store) Cursor(key string) (position uint64, found bool,
	err error) {
	defer guard(s.path, &err)()
	err = s.db.View(func(tx *bolt.Tx) error {
		position, found = seqOf(tx.Bucket(cursorsBucket).Get([]byte(key)))
		return nil
	})
	return position, found, err
}

// Due calls found for each record of a $delayed log due by until (Unix
// ms), earliest first, at most n of them.
func (s *Store) Due(until int64, n int,
	found func(log string, seq uint64, at int64)) (err error) {
	defer guard(s.path, &err)()
	type due struct {
		log string
		seq uint64
		at  int64
	}
	var list []due
	err = s.db.View(func(tx *bolt.Tx) error {
		// Keys sort by due time first: the first n keys, up to until,
		// are the answer, however many wait past it.
		c := tx.Bucket(dueBucket).Cursor()
		for k, _ := c.First(); k != nil && len(list) < n; k, _ = c.Next() {
			at := int64(binary.BigEndian.Uint64(k))
			if at > until {
				break
			}
			list = append(list, due{string(k[16:]),
				binary.BigEndian.Uint64(k[8:]), at})
		}
		return nil
	})
	// found is called once the read is over: it may use the store.
	for _, d := range list {
		found(d.log, d.seq, d.at)
	}
	return err
}

// Waiting returns the seq of the record in $delayed log that publisher
// sent with message_id id, if the log holds one.
func (s *Store) Waiting(log, publisher, id string) (seq uint64, ok bool,
	err error) {
	defer guard(s.path, &err)()
	err = s.db.View(func(tx *bolt.Tx) error {
		seq, ok = seqOf(tx.Bucket(waitingBucket).Get(idKey(log, publisher,
			id)))
		return nil
	})
	return seq, ok, err
}

// Close closes the bbolt file.
func (s *Store) Close() error { return s.db.Close() }

// encodeRecord appends m's record to buffer: its delivery frame, which
// holds every field of a Message, then a newline and its publisher as a
// JSON string if it has one, behind a 4-byte CRC-32 (Castagnoli) of the
// rest. One encoding serves the log and every subscriber; decodeRecord
// reads it back with encoding/json, which ignores the frame's type and
// attempt. A record written before frames were stored holds the
// Message's fields alone, and reads the same.
func encodeRecord(buffer []byte, m *popsub.Message) []byte {
	start := len(buffer)
	buffer = append(append(buffer, 0, 0, 0, 0), m.Frame()...)
	if publisher := m.Publisher(); publisher != "" {
		buffer = wire.AppendString(append(buffer, '\n'), publisher)
	}
	sum := crc32.Checksum(buffer[start+4:], castagnoli)
	binary.BigEndian.PutUint32(buffer[start:], sum)
	return buffer
}

// castagnoli is the CRC-32 table for records: the polynomial that
// processors compute in hardware, so a checksum costs little beside the
// write it guards.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordIntact reports whether record's checksum matches what it holds.
func recordIntact(record []byte) bool {
	return len(record) >= 4 && crc32.Checksum(record[4:], castagnoli) ==
		binary.BigEndian.Uint32(record)
}

// decodeRecord checks a record's CRC and decodes it.
func decodeRecord(record []byte) (*popsub.Message, error) {
	if !recordIntact(record) {
		return nil, errors.New("checksum mismatch")
	}
	body := record[4:]

	// The Message gets its own copies of the bytes: bbolt's are valid
	// only until the reading transaction ends. A frame has no newline of
	// its own, so one ends it.
	publisher := ""
	if i := bytes.IndexByte(body, '\n'); i >= 0 {
		if err := json.Unmarshal(body[i+1:], &publisher); err != nil {
			return nil, fmt.Errorf("decode record: %w", err)
		}
		body = body[:i]
	}
	m, err := popsub.RestoreMessage(body, publisher)
	if err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return m, nil
}

// seqKey is seq as an 8-byte big-endian key, which sorts numerically.
func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

// seqOf reads a seqKey back, and reports false for anything else.
func seqOf(key []byte) (uint64, bool) {
	if len(key) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(key), true
}
