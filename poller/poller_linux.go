package poller

import (
	"sync"
	"syscall"
)

// Can says whether Park can park raw here: any socket with a
// descriptor, on Linux.
func Can(raw syscall.RawConn) bool { return raw != nil }

// epoll is the one epoll instance, opened by the first Park.
var epoll struct {
	start sync.Once
	fd    int
	ok    bool // under table.mu: false until opened, or if it failed
}

// Park hands the socket raw to the poller, which runs wake once it is
// readable, failed or hung up, or on Unpark. It reports false where it
// cannot: no epoll, raw's descriptor closed, or the channel closed
// closed, which it checks under the table's lock, so that a close either
// is seen here or, through Unpark, sees the park.
func (p *Parking) Park(raw syscall.RawConn, closed <-chan struct{},
	wake func()) bool {
	epoll.start.Do(open)
	fd := -1
	if raw.Control(func(s uintptr) { fd = int(s) }) != nil {
		return false
	}
	table.mu.Lock()
	defer table.mu.Unlock()
	select {
	case <-closed:
		return false
	default:
		if !epoll.ok {
			return false
		}
	}
	// A socket parked before is still in the epoll set, disarmed: re-arm
	// it. Should the set say otherwise, believe the set.
	op := syscall.EPOLL_CTL_MOD
	if !p.registered || p.fd != fd {
		op = syscall.EPOLL_CTL_ADD
	}
	event := syscall.EpollEvent{Fd: int32(fd),
		Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT}
	err := syscall.EpollCtl(epoll.fd, op, fd, &event)
	switch {
	case err == syscall.ENOENT:
		err = syscall.EpollCtl(epoll.fd, syscall.EPOLL_CTL_ADD, fd, &event)
	case err == syscall.EEXIST:
		err = syscall.EpollCtl(epoll.fd, syscall.EPOLL_CTL_MOD, fd, &event)
	}
	if err != nil {
		return false
	}
	p.fd, p.registered, p.wake = fd, true, wake
	table.parked[fd] = p
	return true
}

// Unpark runs a parked socket's wake now, and takes its descriptor out
// of the epoll set, before the descriptor closes: the table must never
// hold a descriptor the kernel may give to another socket. A socket not
// parked is left alone: its reader may have closed the descriptor
// already, and the kernel may have given the number to another socket,
// whose registration a removal here would take.
func (p *Parking) Unpark() {
	table.mu.Lock()
	defer table.mu.Unlock()
	if p.registered && table.parked[p.fd] == p {
		syscall.EpollCtl(epoll.fd, syscall.EPOLL_CTL_DEL, p.fd, nil)
		p.registered = false
		unparkFD(p.fd)
	}
}

// open opens the epoll instance and starts its one goroutine, which
// waits in the kernel, on a thread of its own, for parked sockets.
func open() {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return
	}
	table.mu.Lock()
	epoll.fd, epoll.ok, table.parked = fd, true, map[int]*Parking{}
	table.mu.Unlock()
	go func() {
		events := make([]syscall.EpollEvent, 256)
		for {
			n, err := syscall.EpollWait(fd, events, -1)
			if err == syscall.EINTR {
				continue // a signal came
			}
			table.mu.Lock()
			for _, e := range events[:max(n, 0)] {
				unparkFD(int(e.Fd))
			}
			if err != nil { // never seen; if it were, wake every socket
				epoll.ok = false
				for fd := range table.parked {
					unparkFD(fd)
				}
			}
			table.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
}
