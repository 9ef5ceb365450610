package popsub

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
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
func (s *BoltStore) Commit(batch *Batch) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, m := range batch.Messages {
			if err := putMessage(tx, m); err != nil {
				return fmt.Errorf("append %q: %w", m.Topic, err)
			}
		}
		for topic, seq := range batch.Trims {
			if err := trimLog(tx, topic, seq); err != nil {
				return fmt.Errorf("trim %q: %w", topic, err)
			}
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

// putMessage appends m to its topic's bucket and moves the head.
func putMessage(tx *bolt.Tx, m *Message) error {
	topics, err := tx.CreateBucketIfNotExists(topicsBucket)
	if err != nil {
		return err
	}
	bucket, err := topics.CreateBucketIfNotExists([]byte(m.Topic))
	if err != nil {
		return err
	}
	records, err := bucket.CreateBucketIfNotExists(logBucket)
	if err != nil {
		return err
	}
	if err := records.Put(seqKey(m.Seq), encodeRecord(m)); err != nil {
		return err
	}
	if head := bucket.Get(headKey); head == nil ||
		binary.BigEndian.Uint64(head) < m.Seq {
		return bucket.Put(headKey, seqKey(m.Seq))
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

// Read returns up to limit records of topic after seq, skipping (and
// logging) any whose checksum does not match.
func (s *BoltStore) Read(topic string, after uint64,
	limit int) ([]*Message, error) {
	var msgs []*Message
	err := s.db.View(func(tx *bolt.Tx) error {
		records := logOf(tx, topic)
		if records == nil {
			return nil
		}
		cursor := records.Cursor()
		for k, v := cursor.Seek(seqKey(after + 1)); k != nil &&
			len(msgs) < limit; k, v = cursor.Next() {
			m, err := decodeRecord(v)
			if err != nil {
				s.logger.Error("corrupt record skipped", "topic", topic,
					"seq", binary.BigEndian.Uint64(k), "err", err)
				continue
			}
			msgs = append(msgs, m)
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

// encodeRecord is m as JSON behind a 4-byte CRC-32 (Castagnoli).
func encodeRecord(m *Message) []byte {
	body, _ := json.Marshal(m)
	record := binary.BigEndian.AppendUint32(nil, crc32.Checksum(body,
		castagnoli))
	return append(record, body...)
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
