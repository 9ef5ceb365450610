package boltstore

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// # Salvage: checking a file, and copying what a damaged one holds
//
// popsub db check and popsub db salvage read a database the broker
// refuses. bbolt panics on a damaged page and faults on a file cut
// short, so every read here is guarded (a panic or a fault becomes an
// error of that read alone): one bad page costs the records on it, and
// nothing else. bbolt's own Tx.Check is not used: it walks the file on a
// goroutine of its own, where a fault cannot be caught, and a file cut
// short then takes the process down. It lives beside the store so that
// the check reads the very layout the store writes, and can never drift
// from it.

// Report is what a check or a salvage found.
type Report struct {
	path      string
	topics    int      // topics whose bucket could be read
	records   int      // records read whole, checksum and all
	bad       int      // records read but damaged (checksum)
	lost      int      // damaged stretches of a log skipped unread
	cursors   int      // durable cursors read
	problems  []string // what the walk could not read
	copiedTo  string   // the new file, for a salvage
	unopened  error    // why the file could not be opened at all
	truncated bool     // whether the walk of the topics was cut short
}

// Damaged reports whether the check found anything wrong.
func (r Report) Damaged() bool {
	return r.unopened != nil || r.bad > 0 || r.lost > 0 ||
		len(r.problems) > 0 || r.truncated
}

// String prints the report.
func (r Report) String() string {
	if r.unopened != nil {
		return fmt.Sprintf("%s: cannot be opened: %v\n", r.path, r.unopened)
	}
	text := fmt.Sprintf("%s: %d topics, %d records readable, %d damaged "+
		"records, %d damaged stretches skipped, %d cursors\n", r.path,
		r.topics, r.records, r.bad, r.lost, r.cursors)
	for _, p := range r.problems {
		text += "  " + p + "\n"
	}
	if r.copiedTo != "" {
		text += fmt.Sprintf("copied every readable record to %s\n",
			r.copiedTo)
	}
	return text
}

// Salvage walks the database at path and, when to is not empty, writes
// what it can read into a new database there, which must not exist yet.
// It reads the file read-only, and a damaged page costs the records on
// it alone.
func Salvage(path, to string) (Report, error) {
	// A missing file is the caller's mistake; a file that will not open
	// is the report's first finding.
	report := Report{path: path}
	if _, err := os.Stat(path); err != nil {
		return report, err
	}
	db, err := openGuarded(path)
	if err != nil {
		report.unopened = err
		return report, nil
	}
	defer db.Close()
	// The copy is a new file, never the damaged one written over.
	var out *bolt.DB
	if to != "" {
		if _, err := os.Stat(to); err == nil {
			return report, fmt.Errorf("%s exists: salvage writes a new file",
				to)
		}
		if out, err = bolt.Open(to, 0o600, &bolt.Options{Timeout: time.Second}); err != nil {
			return report, fmt.Errorf("create %s: %w", to, err)
		}
		defer out.Close()
		report.copiedTo = to
	}
	return report, copyAll(db, out, &report)
}

// guarded runs read, turning a panic or a memory fault into an error, as
// the store does.
func guarded(read func() error) (err error) {
	defer guard("the file", &err)()
	return read()
}

// openGuarded opens path read-only, which neither writes to a damaged
// file nor loads its free list.
func openGuarded(path string) (*bolt.DB, error) {
	var db *bolt.DB
	err := guarded(func() error {
		var err error
		db, err = bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true,
			Timeout: time.Second})
		return err
	})
	return db, err
}

// copyAll walks every topic and the cursors, counting what it reads, and
// writes it to out unless out is nil.
func copyAll(db, out *bolt.DB, report *Report) error {
	// The topics' names first, in a read of their own: a damaged page
	// among them cuts the list short, and the topics before it are kept.
	var names [][]byte
	err := guarded(func() error {
		return db.View(func(tx *bolt.Tx) error {
			topics := tx.Bucket(topicsBucket)
			if topics == nil {
				return errors.New("no topics bucket")
			}
			return topics.ForEachBucket(func(name []byte) error {
				names = append(names, append([]byte(nil), name...))
				return nil
			})
		})
	})
	if err != nil {
		report.truncated = true
		report.problems = append(report.problems, "topics: "+err.Error())
	}
	for _, name := range names {
		if err := copyTopic(db, out, name, report); err != nil {
			return err
		}
	}
	return copyCursors(db, out, report)
}

// copyTopic reads one topic's head and every record it can, stepping
// over damaged stretches of its log, and writes them to out.
func copyTopic(db, out *bolt.DB, name []byte, report *Report) error {
	report.topics++
	head, records := readHead(db, name), map[uint64][]byte{}
	keep := func(seq uint64, value []byte) {
		if !recordIntact(value) {
			report.bad++
			return
		}
		records[seq] = append([]byte(nil), value...)
		head = max(head, seq)
	}
	// Walk the log in runs: each run ends at the log's end or at a read
	// that fails, and the next starts past the damage.
	for next := uint64(0); ; {
		last, done, err := walkRun(db, name, next, keep)
		if err == nil && done {
			break
		}
		report.lost++
		if next = skipDamage(db, name, max(next, last+1)); next == 0 {
			break
		}
	}
	// A check stops here; a salvage writes the topic whole, its head at
	// least its newest record, so that seqs never go back.
	report.records += len(records)
	if out == nil {
		return nil
	}
	return writeTopic(out, name, head, records)
}

// walkRun reads topic's records from seq from on, handing each to keep,
// until the log ends (done) or a read fails; last is the last seq read.
// Keys that do not climb count as damage too: a damaged page could
// otherwise send the walk round in a loop.
func walkRun(db *bolt.DB, topic []byte, from uint64,
	keep func(uint64, []byte)) (last uint64, done bool, err error) {
	err = guarded(func() error {
		return db.View(func(tx *bolt.Tx) error {
			log := logOf(tx, string(topic))
			if log == nil {
				done = true
				return nil
			}
			c := log.Cursor()
			for k, v := c.Seek(seqKey(from)); ; k, v = c.Next() {
				if k == nil {
					done = true
					return nil
				}
				seq, _ := seqOf(k)
				if seq < from || seq <= last && last != 0 {
					return errors.New("keys out of order")
				}
				keep(seq, v)
				last = seq
			}
		})
	})
	return last, done, err
}

// skipDamage finds the first seq after from at which the log can be read
// again, or 0 if none: doubling steps find a readable seq, then a binary
// search the first one. A seek lands on the page that would hold its
// seq, so the first readable seq past a damaged page is the first key
// of the page after it.
func skipDamage(db *bolt.DB, topic []byte, from uint64) uint64 {
	readable := func(seq uint64) bool {
		return guarded(func() error {
			return db.View(func(tx *bolt.Tx) error {
				if log := logOf(tx, string(topic)); log != nil {
					log.Cursor().Seek(seqKey(seq))
				}
				return nil
			})
		}) == nil
	}
	// Doubling steps past the damage until a seq reads.
	low, high := from, uint64(0)
	for step := uint64(1); step < 1<<62; step *= 2 {
		if readable(from + step) {
			high = from + step
			break
		}
		low = from + step
	}
	if high == 0 {
		return 0
	}
	// Then the first readable seq between the last bad and the good.
	for high-low > 1 {
		if middle := low + (high-low)/2; readable(middle) {
			high = middle
		} else {
			low = middle
		}
	}
	return high
}

// readHead reads a topic's head, or 0 if it cannot be read.
func readHead(db *bolt.DB, topic []byte) uint64 {
	var head uint64
	guarded(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(topicsBucket).Bucket(topic); b != nil {
				head, _ = seqOf(b.Get(headKey))
			}
			return nil
		})
	})
	return head
}

// writeTopic writes a topic's head and records into out.
func writeTopic(out *bolt.DB, topic []byte, head uint64,
	records map[uint64][]byte) error {
	return out.Update(func(tx *bolt.Tx) error {
		topics, err := tx.CreateBucketIfNotExists(topicsBucket)
		if err != nil {
			return err
		}
		bucket, err := topics.CreateBucketIfNotExists(topic)
		if err != nil {
			return err
		}
		// An empty log is its head alone, as Commit leaves one.
		if len(records) > 0 {
			log, err := bucket.CreateBucketIfNotExists(logBucket)
			if err != nil {
				return err
			}
			log.FillPercent = 1.0 // keys go in in order, as Commit's do
			for _, seq := range slices.Sorted(maps.Keys(records)) {
				if err := log.Put(seqKey(seq), records[seq]); err != nil {
					return err
				}
			}
		}
		return bucket.Put(headKey, seqKey(head))
	})
}

// copyCursors reads the durable cursors, and the floor and the reserve
// kept among them (floorKey, reserveKey: not counted as cursors), and
// writes them into out.
func copyCursors(db, out *bolt.DB, report *Report) error {
	// A cursor whose value is not a seq is damage, and is left behind:
	// its subscriber resumes from the default, not from garbage.
	cursors := map[string][]byte{}
	err := guarded(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(cursorsBucket); b != nil {
				return b.ForEach(func(k, v []byte) error {
					if _, ok := seqOf(v); ok {
						cursors[string(k)] = append([]byte(nil), v...)
					}
					return nil
				})
			}
			return nil
		})
	})
	if err != nil {
		report.problems = append(report.problems, "cursors: "+err.Error())
	}
	report.cursors = len(cursors)
	for _, key := range [][]byte{floorKey, reserveKey} {
		if _, ok := cursors[string(key)]; ok {
			report.cursors--
		}
	}
	if out == nil {
		return nil
	}
	return out.Update(func(tx *bolt.Tx) error {
		bucket, err := tx.CreateBucketIfNotExists(cursorsBucket)
		for key, value := range cursors {
			if err == nil {
				err = bucket.Put([]byte(key), value)
			}
		}
		return err
	})
}
