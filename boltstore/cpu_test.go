//go:build unix

package boltstore

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCommitSmallAtCap commits what a topic at its cap commits at
// 1,000 messages a second: six messages and a trim of the six oldest, on
// a log of 10,000, with the syncs on, as serve runs. user-µs/op and
// sys-µs/op are the process's CPU a commit, its own and the kernel's
// (the writes and the two syncs).
func BenchmarkCommitSmallAtCap(b *testing.B) {
	store, err := Open(filepath.Join(b.TempDir(), "log.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	seq := uint64(0)
	for range 10 {
		if err := store.Commit(benchBatch(&seq, 1000)); err != nil {
			b.Fatal(err)
		}
	}
	user, sys := cpuTime()
	for b.Loop() {
		next := benchBatch(&seq, 6)
		next.Trims["t"] = seq - 10000
		if err := store.Commit(next); err != nil {
			b.Fatal(err)
		}
	}
	userAfter, sysAfter := cpuTime()
	b.ReportMetric(float64((userAfter-user).Microseconds())/float64(b.N),
		"user-µs/op")
	b.ReportMetric(float64((sysAfter-sys).Microseconds())/float64(b.N),
		"sys-µs/op")
}

// cpuTime is the CPU the process has used, in user and in system time.
func cpuTime() (user, sys time.Duration) {
	var usage syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &usage)
	return time.Duration(usage.Utime.Nano()), time.Duration(usage.Stime.Nano())
}
