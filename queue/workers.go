package queue

import (
	"sync"
	"time"
)

// Workers runs a broker's writers on goroutines it keeps for a while,
// rather than on a new goroutine each. A connection's writer runs only
// while its outbox has frames, so at 1,000 messages a second to ten
// subscribers each delivery starts one. On a new goroutine its stack
// grows at the first socket write (the calls down to the system call
// need more than a new goroutine's stack), is copied, and is freed: at
// that rate, 9 % of the broker's CPU in a profile. A worker that has
// finished parks with the stack it grew, and the next writer to start
// runs on it.
//
// A parked worker waits at most WorkerIdle, and at most MaxIdleWorkers
// wait at once, so a broker that goes quiet keeps none, and one a burst
// reached ten thousand writers with keeps 64 stacks, not ten thousand.
// A pool per broker, not one per process: a test's broker in a
// testing/synctest bubble must run only its own goroutines, and
// Shutdown ends them.
type Workers struct {
	mu sync.Mutex // guards the fields below
	// idle holds each parked worker's channel, latest parked last: the
	// latest, whose stack is warm, runs the next writer.
	idle []chan func()
	// stopped is set by Stop: workers no longer park.
	stopped bool
	// started counts the goroutines Go started, for tests.
	started int
}

const (
	// WorkerIdle is how long a worker with nothing to run waits.
	WorkerIdle = time.Second
	// MaxIdleWorkers is how many wait at once: the writers of a busy
	// broker on a few cores, with room to spare.
	MaxIdleWorkers = 64
)

// Go runs f on a parked worker, or on a new goroutine if none waits. A
// nil w runs f on a new goroutine.
func (w *Workers) Go(f func()) {
	if w == nil {
		go f()
		return
	}
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		next := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		next <- f // its buffer holds it: the worker takes it when it runs
		return
	}
	w.started++
	w.mu.Unlock()
	go w.work(f)
}

// work runs f, and then whatever Go hands it, until it has waited
// WorkerIdle for nothing, MaxIdleWorkers others wait already, or Stop
// ends it.
func (w *Workers) work(f func()) {
	next := make(chan func(), 1)
	idle := time.NewTimer(WorkerIdle)
	defer idle.Stop()
	for f != nil {
		f()
		if !w.park(next) {
			return
		}
		idle.Reset(WorkerIdle)
		select {
		case f = <-next:
		case <-idle.C:
			f = w.leave(next)
		}
	}
}

// park puts a worker among the idle, and reports whether it did.
func (w *Workers) park(next chan func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || len(w.idle) >= MaxIdleWorkers {
		return false
	}
	w.idle = append(w.idle, next)
	return true
}

// leave takes a worker that waited long enough off the idle list, and
// returns nil; or, if Go took it meanwhile, what Go handed it.
func (w *Workers) leave(next chan func()) func() {
	w.mu.Lock()
	for i, c := range w.idle {
		if c == next {
			w.idle = append(w.idle[:i], w.idle[i+1:]...)
			w.mu.Unlock()
			return nil
		}
	}
	w.mu.Unlock()
	return <-next
}

// Stop ends the parked workers; those running end when they finish.
// Go still runs what it is given, each on a goroutine of its own.
func (w *Workers) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for _, next := range w.idle {
		close(next)
	}
	w.idle = nil
}
