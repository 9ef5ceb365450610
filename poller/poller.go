// Package poller holds quiet sockets with no goroutine each: a socket
// parked here is watched by one epoll instance that every socket shares,
// and its reader is started again, on a goroutine of its own, when the
// socket turns readable or closes.
//
// # The contract
//
// Can says whether a socket can be parked here at all (it has a
// descriptor, and the system has epoll). Parking.Park hands a socket's
// descriptor to the poller; it reports false where it cannot (a socket
// closed or closing), and the caller reads on as before. Once parked, the socket's
// wake runs exactly once: when the socket is readable, when it fails or
// its peer hangs up, or when Parking.Unpark is called, which a close must
// call before the descriptor closes. Package socket parks a WebSocket
// whose client has been quiet for a second.
//
// # Why not the runtime's poller
//
// The Go runtime already watches every socket with epoll, but what it
// wakes is a goroutine, so one must be waiting, and a waiting goroutine
// keeps its stack: 4 KiB at the least, a third of an idle connection's
// memory in popsub serve. Here what waits is a table entry.
//
// # What it costs, and what it buys
//
// A park is one system call (epoll_ctl), a wake-up one more and a new
// goroutine: a few microseconds, paid once per quiet spell, since a
// socket parks only after it has been quiet for a while. The
// registration is one-shot: it fires once and sleeps until the next
// Park re-arms it, so a socket is never woken twice for one park.
// Measured with popsub bench --idle 10000 (docs/performance.md),
// alternating runs against the commit before:
//
//	trick                               buys
//	a quiet socket parked here, with    15.9–16.3 → 10.0–10.7 KiB of the
//	no goroutine                        server's memory per connection;
//	                                    10,016 → 16 goroutines
//	a ping timer for each connection    12.6–12.7 → 10.0–10.7 KiB at the
//	(popsub.go), so that pongs do       most over a round of pings; a
//	not wake every reader at once       reader woken by a pong alone
//	                                    parking again at once, alone:
//	                                    12.7 → 12.6 KiB
package poller

import "sync"

// Parking is one socket's place in the poller; its zero value is
// unparked. Park and Unpark may be called from any goroutine.
type Parking struct {
	fd         int
	registered bool // the descriptor is in the epoll set, armed or not
	wake       func()
}

// table is the parked sockets, by descriptor, and the poller's state.
var table struct {
	mu     sync.Mutex
	parked map[int]*Parking
}

// Parked reports whether p waits in the poller.
func (p *Parking) Parked() bool {
	table.mu.Lock()
	defer table.mu.Unlock()
	return p.registered && table.parked[p.fd] == p
}

// unparkFD, under table.mu, starts the wake of the socket parked on fd,
// if any, once: the poller's wake-ups and Unpark may race for one.
func unparkFD(fd int) {
	if p := table.parked[fd]; p != nil {
		delete(table.parked, fd)
		go p.wake()
	}
}
