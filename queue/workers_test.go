package queue

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Every function Go is given runs once, however many arrive together.
func TestWorkers_RunEachFunctionOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &Workers{}
		var ran atomic.Int64
		var done sync.WaitGroup
		for range 1000 {
			done.Add(1)
			w.Go(func() { ran.Add(1); done.Done() })
		}
		done.Wait()
		if ran.Load() != 1000 {
			t.Fatalf("ran %d functions, want 1000", ran.Load())
		}
		w.Stop()
	})
}

// A worker that finished waits for the next function, and runs it: one
// goroutine for a writer after a writer.
func TestWorkers_ReuseAParkedWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &Workers{}
		for i := range 10 {
			done := make(chan struct{})
			w.Go(func() { close(done) })
			<-done
			synctest.Wait() // the worker parked
			w.mu.Lock()
			started, idle := w.started, len(w.idle)
			w.mu.Unlock()
			if started != 1 || idle != 1 {
				t.Fatalf("after %d runs: %d goroutines started, %d idle; "+
					"want 1 and 1", i+1, started, idle)
			}
		}
		w.Stop()
	})
}

// A worker waits WorkerIdle at most, and no more than MaxIdleWorkers
// wait: a burst of writers leaves 64 stacks for a second, then none.
func TestWorkers_KeepAtMostMaxIdleForWorkerIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &Workers{}
		release := make(chan struct{})
		for range 3 * MaxIdleWorkers {
			w.Go(func() { <-release })
		}
		close(release)
		synctest.Wait()
		if idle := w.idleCount(); idle != MaxIdleWorkers {
			t.Fatalf("%d workers idle after a burst, want %d", idle,
				MaxIdleWorkers)
		}
		time.Sleep(WorkerIdle - time.Millisecond)
		synctest.Wait()
		if idle := w.idleCount(); idle != MaxIdleWorkers {
			t.Fatalf("%d workers idle before WorkerIdle, want %d", idle,
				MaxIdleWorkers)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if idle := w.idleCount(); idle != 0 {
			t.Fatalf("%d workers idle after WorkerIdle, want 0", idle)
		}
		// The bubble ends only once every goroutine in it has: none is
		// left waiting.
	})
}

// Stop ends the parked workers at once; what Go gets afterwards still
// runs, and no worker parks again.
func TestWorkers_StopEndsTheParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &Workers{}
		done := make(chan struct{})
		w.Go(func() { close(done) })
		<-done
		synctest.Wait()
		start := time.Now()
		w.Stop()
		ran := make(chan struct{})
		w.Go(func() { close(ran) })
		<-ran
		synctest.Wait()
		if idle := w.idleCount(); idle != 0 {
			t.Fatalf("%d workers idle after Stop, want 0", idle)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("Stop's workers ended after %v, want at once", waited)
		}
	})
}

// A worker whose wait ends as Go hands it a function runs it, rather
// than leaving with it: the race between the timer and Go loses nothing.
func TestWorkers_AWorkerLeavingStillRunsWhatItWasHanded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &Workers{}
		for range 100 {
			done := make(chan struct{})
			w.Go(func() { close(done) })
			<-done
			time.Sleep(WorkerIdle) // the timer fires as Go hands it more
			ran := make(chan struct{})
			w.Go(func() { close(ran) })
			<-ran
		}
		w.Stop()
	})
}

// A nil Workers runs each function on a goroutine of its own.
func TestWorkers_NilRunsOnANewGoroutine(t *testing.T) {
	var w *Workers
	ran := make(chan struct{})
	w.Go(func() { close(ran) })
	<-ran
}

// idleCount is how many workers wait now.
func (w *Workers) idleCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.idle)
}

// BenchmarkWorkers_DeepWriter starts a function that goes as deep into
// the stack as a socket write does, once a new goroutine each, once on
// Workers, and reports the time each start and run takes.
func BenchmarkWorkers_DeepWriter(b *testing.B) {
	for _, pooled := range []bool{false, true} {
		name := map[bool]string{false: "a goroutine each", true: "workers"}
		b.Run(name[pooled], func(b *testing.B) {
			var workers *Workers
			if pooled {
				workers = &Workers{}
				defer workers.Stop()
			}
			done := make(chan struct{}, 1)
			write := func() { deep(30); done <- struct{}{} }
			for b.Loop() {
				workers.Go(write)
				<-done
			}
		})
	}
}

// deep recurses n calls down with a frame of some 256 bytes each: at 30,
// 8 KiB of stack, more than a new goroutine starts with, as the writer's
// calls down to a socket write need more.
//
//go:noinline
func deep(n int) byte {
	var frame [256]byte
	frame[n%256] = byte(n)
	if n == 0 {
		return frame[0]
	}
	return deep(n-1) + frame[n%256]
}
