package popsub

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
)

// This file is the default Store: the log and the cursors in one bbolt
// file. popsub.go defines the seam (Store and Batch); an engine behind it
// needs to know nothing else about the broker.

// bbolt, the default store.
//
// bbolt is a single-file, transactional, embedded B+tree: one file beside
// the binary, no server. Each topic is a bucket of records keyed by
// big-endian seq, so a cursor walks them in seq order; the topic's head
// is kept beside them so seqs never restart after the log is trimmed
// empty. Each record carries a CRC-32 of its bytes: bbolt checks only its
// own meta pages, and a flipped bit in a payload must not be delivered as
// if it were good.

// Bucket and key names in the bbolt file.
var (
	topicsBucket  = []byte("topics")  // topic name → topic bucket
	cursorsBucket = []byte("cursors") // durable key → position
	logBucket     = []byte("log")     // in a topic bucket: seq → record
	headKey       = []byte("head")    // in a topic bucket: newest seq
)

// BoltStore is the Store kept in one bbolt file.
type BoltStore struct {
	db     *bolt.DB
	logger *slog.Logger
}

// OpenBolt opens (or creates) the bbolt file at path. It fails within a
// second if another process has the file open.
func OpenBolt(path string, logger *slog.Logger) (*BoltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("open %s: database is in use by another "+
			"process", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &BoltStore{db: db, logger: logger}, nil
}

// Commit writes a batch in one transaction: one sync for all of it.
// Trims go first, and a message the same batch trims is not written at
// all (its topic's head still moves past it). Appending and then deleting
// in one transaction cost n² here: bbolt splits the pages a transaction
// filled only when it commits, so each delete from the front of a freshly
// filled page moved everything behind it.
func (s *BoltStore) Commit(batch *Batch) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for topic, seq := range batch.Trims {
			if err := trimLog(tx, topic, seq); err != nil {
				return fmt.Errorf("trim %q: %w", topic, err)
			}
		}
		err := appendMessages(tx, batch.Messages, batch.Trims)
		if err != nil {
			return err
		}
		cursors, err := tx.CreateBucketIfNotExists(cursorsBucket)
		if err != nil {
			return err
		}
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
func appendMessages(tx *bolt.Tx, msgs []*Message,
	trims map[string]uint64) error {
	topics, err := tx.CreateBucketIfNotExists(topicsBucket)
	if err != nil {
		return err
	}
	// Records go into one arena, sized for the batch up front: bbolt
	// keeps a reference to each value until the transaction commits, so
	// none may be reused, and one allocation per batch beats one per
	// message, or a copy of the arena each time it outgrew itself. Keys
	// need no arena: bbolt copies them.
	size := 0
	for _, m := range msgs {
		size += recordOverhead + len(m.Topic) + len(m.ID) + len(m.Payload)
	}
	arena := make([]byte, 0, size)
	var key [8]byte
	for start := 0; start < len(msgs); {
		name := msgs[start].Topic
		bucket, err := topics.CreateBucketIfNotExists([]byte(name))
		if err != nil {
			return fmt.Errorf("append %q: %w", name, err)
		}
		records, err := bucket.CreateBucketIfNotExists(logBucket)
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
			if m.Seq <= trims[name] {
				continue
			}
			from := len(arena)
			arena = encodeRecord(arena, m)
			record := arena[from:len(arena):len(arena)]
			binary.BigEndian.PutUint64(key[:], m.Seq)
			if err := records.Put(key[:], record); err != nil {
				return fmt.Errorf("append %q: %w", name, err)
			}
		}
		if old := bucket.Get(headKey); len(old) == 8 {
			head = max(head, binary.BigEndian.Uint64(old))
		}
		if err := bucket.Put(headKey, seqKey(head)); err != nil {
			return err
		}
	}
	return nil
}

// trimLog deletes topic's records with seq <= upTo.
func trimLog(tx *bolt.Tx, topic string, upTo uint64) error {
	records := logOf(tx, topic)
	if records == nil {
		return nil
	}
	cursor := records.Cursor()
	for k, _ := cursor.First(); k != nil &&
		binary.BigEndian.Uint64(k) <= upTo; k, _ = cursor.First() {
		if err := cursor.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// logOf returns topic's record bucket, or nil if it has none.
func logOf(tx *bolt.Tx, topic string) *bolt.Bucket {
	topics := tx.Bucket(topicsBucket)
	if topics == nil {
		return nil
	}
	bucket := topics.Bucket([]byte(topic))
	if bucket == nil {
		return nil
	}
	return bucket.Bucket(logBucket)
}

// Read returns up to limit records of topic after seq, and no more once
// their payloads pass maxBytes, skipping (and logging) any whose checksum
// does not match.
func (s *BoltStore) Read(topic string, after uint64,
	limit, maxBytes int) ([]*Message, error) {
	var msgs []*Message
	err := s.db.View(func(tx *bolt.Tx) error {
		records := logOf(tx, topic)
		if records == nil {
			return nil
		}
		cursor := records.Cursor()
		size := 0
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

// Topics returns every topic bucket's name and head.
func (s *BoltStore) Topics() (map[string]uint64, error) {
	heads := map[string]uint64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		topics := tx.Bucket(topicsBucket)
		if topics == nil {
			return nil
		}
		return topics.ForEachBucket(func(name []byte) error {
			head := topics.Bucket(name).Get(headKey)
			if len(head) == 8 {
				heads[string(name)] = binary.BigEndian.Uint64(head)
			}
			return nil
		})
	})
	return heads, err
}

// Cursor returns the stored position of a durable cursor.
func (s *BoltStore) Cursor(key string) (uint64, bool, error) {
	var position uint64
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		cursors := tx.Bucket(cursorsBucket)
		if cursors == nil {
			return nil
		}
		if v := cursors.Get([]byte(key)); len(v) == 8 {
			position, found = binary.BigEndian.Uint64(v), true
		}
		return nil
	})
	return position, found, err
}

// Close closes the bbolt file.
func (s *BoltStore) Close() error {
	return s.db.Close()
}

// recordOverhead is the room a record needs beside its topic, id and
// payload: the checksum, the field names and the three numbers.
const recordOverhead = 4 + 64 + 3*20

// encodeRecord appends to buffer m as JSON behind a 4-byte CRC-32
// (Castagnoli) of the JSON. It is written by hand, like the delivery
// frame, because it runs once per message; decodeRecord reads it with
// encoding/json.
func encodeRecord(buffer []byte, m *Message) []byte {
	start := len(buffer)
	buffer = append(buffer, 0, 0, 0, 0)
	buffer = append(buffer, `{"topic":`...)
	buffer = appendString(buffer, m.Topic)
	buffer = append(buffer, `,"message_id":`...)
	buffer = appendString(buffer, m.ID)
	buffer = append(buffer, `,"seq":`...)
	buffer = strconv.AppendUint(buffer, m.Seq, 10)
	buffer = append(buffer, `,"timestamp":`...)
	buffer = strconv.AppendInt(buffer, m.Timestamp, 10)
	buffer = append(buffer, `,"qos":`...)
	buffer = strconv.AppendInt(buffer, int64(m.QoS), 10)
	buffer = append(buffer, `,"payload":`...)
	buffer = append(append(buffer, m.Payload...), '}')
	binary.BigEndian.PutUint32(buffer[start:], crc32.Checksum(buffer[start+4:],
		castagnoli))
	return buffer
}

// castagnoli is the CRC-32 table for records: hardware-accelerated.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// decodeRecord checks a record's CRC and decodes it.
func decodeRecord(record []byte) (*Message, error) {
	if len(record) < 4 {
		return nil, errors.New("record too short")
	}
	body := record[4:]
	if crc32.Checksum(body, castagnoli) !=
		binary.BigEndian.Uint32(record) {
		return nil, errors.New("checksum mismatch")
	}
	m := &Message{}
	if err := json.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return m, nil
}

// seqKey is seq as an 8-byte big-endian key, which sorts numerically.
func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}
