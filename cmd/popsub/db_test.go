package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
)

// dbRecords is how many records the damaged databases start with.
const dbRecords = 2000

// makeDatabase writes a database with dbRecords messages on one topic
// and a durable cursor, and returns its path.
func makeDatabase(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "popsub.db")
	store, err := boltstore.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := &popsub.Batch{Cursors: map[string]uint64{"alice\x00d\x00jobs": 7}}
	for seq := uint64(1); seq <= dbRecords; seq++ {
		payload, _ := json.Marshal(strings.Repeat("x", 200))
		batch.Messages = append(batch.Messages, &popsub.Message{
			Topic: "jobs", ID: fmt.Sprint("m-", seq), Seq: seq,
			Timestamp: 1, QoS: 1, Payload: payload})
	}
	if err := store.Commit(batch); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// leafOfLog finds a leaf page of the log in the middle of the file and
// returns its number and how many records it holds, reading bbolt's page
// layout: a 16-byte header (id, flags, count, overflow), then 16-byte
// elements (flags, pos, key size, value size).
func leafOfLog(t *testing.T, data []byte) (page int, count int) {
	t.Helper()
	size := os.Getpagesize()
	for page = len(data) / size / 2; page*size < len(data); page++ {
		p := data[page*size:]
		flags := binary.LittleEndian.Uint16(p[8:])
		count = int(binary.LittleEndian.Uint16(p[10:]))
		if flags != 0x02 || count == 0 {
			continue
		}
		element := p[16:]
		position := binary.LittleEndian.Uint32(element[4:])
		keySize := binary.LittleEndian.Uint32(element[8:])
		value := element[position+keySize:]
		if keySize == 8 && bytes.Contains(value[:60], []byte(`"type":"message"`)) {
			return page, count
		}
	}
	t.Fatal("no leaf page of the log found")
	return 0, 0
}

// damage changes the file at path in place.
func damage(t *testing.T, path string, change func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, change(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// countRecords opens a salvaged file as the broker would and counts the
// records of jobs.
func countRecords(t *testing.T, path string) int {
	t.Helper()
	store, err := boltstore.Open(path, nil)
	if err != nil {
		t.Fatalf("the salvaged file does not open: %v", err)
	}
	defer store.Close()
	msgs, err := store.Read("jobs", 0, 1<<30, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return len(msgs)
}

func TestDB_DamagedFilesAreReportedAndSalvaged(t *testing.T) {
	random := rand.New(rand.NewPCG(1, 2))
	size := os.Getpagesize()
	cases := []struct {
		name   string
		change func(t *testing.T, data []byte) ([]byte, int)
	}{
		{"a leaf page overwritten with random bytes",
			func(t *testing.T, data []byte) ([]byte, int) {
				page, count := leafOfLog(t, data)
				for i := range size {
					data[page*size+i] = byte(random.Uint32())
				}
				return data, dbRecords - count
			}},
		{"sixteen bytes on page 2", func(t *testing.T, data []byte) ([]byte,
			int) {
			for i := range 16 {
				data[2*size+i] = byte(random.Uint32())
			}
			return data, -1
		}},
		{"the file truncated to half", func(t *testing.T, data []byte) ([]byte,
			int) {
			return data[:len(data)/2], -1
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := makeDatabase(t)
			want := 0
			damage(t, path, func(data []byte) []byte {
				var changed []byte
				changed, want = tc.change(t, data)
				return changed
			})

			// check reports it; salvage copies what is readable.
			var report bytes.Buffer
			err := run(context.Background(), []string{"db", "check", "--db",
				path}, &report, new(bytes.Buffer))
			if err == nil || !strings.Contains(err.Error(), "damaged") {
				t.Fatalf("check: %v\n%s", err, report.String())
			}
			to := filepath.Join(t.TempDir(), "salvaged.db")
			report.Reset()
			err = run(context.Background(), []string{"db", "salvage", "--db",
				path, "--to", to}, &report, new(bytes.Buffer))
			if err != nil {
				t.Fatalf("salvage: %v", err)
			}

			// serve refuses the file, naming it, and the process lives.
			// It goes last: a panic inside bbolt's own Open leaves the
			// file locked until the process ends, as serve's does at once.
			err = run(context.Background(), []string{"serve", "--db", path,
				"--addr", "127.0.0.1:0", "--log-level", "error"},
				new(bytes.Buffer), new(bytes.Buffer))
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("serve on a damaged file: %v; want an error "+
					"naming %s", err, path)
			}
			t.Log(strings.TrimSpace(report.String()))
			if _, err := os.Stat(to); err != nil {
				return // the file could not be opened at all
			}
			if got := countRecords(t, to); want >= 0 && got != want {
				t.Fatalf("salvaged %d records, want the %d on undamaged "+
					"pages", got, want)
			}
		})
	}
}
