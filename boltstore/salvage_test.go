package boltstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/popsub/popsub"
)

// A healthy file: the check finds every record and cursor and no
// damage, and the copy opens as a store with the same log, head, floor
// (the highest head of a topic forgotten) and reserve, which are no
// cursors. The damaged files, and the command around Salvage, are popsub
// db's tests (cmd/popsub/db_test.go).
func TestSalvage_AHealthyFileIsCopiedWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	store := openStore(t, path)
	reserve := uint64(40)
	batch := &popsub.Batch{Cursors: map[string]uint64{"alice\x00d\x00t": 2},
		Forgets: map[string]uint64{"gone": 9}, Reserve: &reserve}
	for seq := range uint64(3) {
		batch.Messages = append(batch.Messages,
			message(t, seq+1, `"x"`, "alice"))
	}
	if err := store.Commit(batch); err != nil {
		t.Fatal(err)
	}
	store.Close()

	to := filepath.Join(t.TempDir(), "copy.db")
	report, err := Salvage(path, to)
	if err != nil || report.Damaged() {
		t.Fatalf("Salvage: %v, %s", err, report)
	}
	if !strings.Contains(report.String(), "1 topics, 3 records readable, "+
		"0 damaged records, 0 damaged stretches skipped, 1 cursors") {
		t.Fatalf("report: %s", report)
	}
	copied := openStore(t, to)
	defer copied.Close()
	msgs, err := copied.Read("t", 0, 100, 1<<20)
	if err != nil || len(msgs) != 3 || msgs[2].Seq != 3 {
		t.Fatalf("the copy reads %d messages (%v), want seqs 1 to 3",
			len(msgs), err)
	}
	floor, err := copied.Floor()
	keys, err2 := copied.CursorKeys()
	if floor != 40 || len(keys) != 1 || err != nil || err2 != nil {
		t.Fatalf("the copy's Floor = %d, CursorKeys = %q (%v, %v); want 40 "+
			"(the reserve) and one cursor", floor, keys, err, err2)
	}

	// A salvage never writes over a file, and a file that is not there
	// is the caller's mistake, not a finding.
	if _, err := Salvage(path, to); err == nil {
		t.Fatal("Salvage wrote over an existing file")
	}
	if _, err := Salvage(filepath.Join(t.TempDir(), "none.db"), ""); !os.IsNotExist(err) {
		t.Fatalf("a missing file: %v, want not-exist", err)
	}
}
