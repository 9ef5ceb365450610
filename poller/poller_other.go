//go:build !linux

package poller

import "syscall"

// Can says whether Park can park raw here: never, without epoll.
func Can(syscall.RawConn) bool { return false }

// Park never parks where there is no epoll: the reader waits on the
// runtime's poller, holding its goroutine, however long the socket is
// quiet.
func (p *Parking) Park(syscall.RawConn, <-chan struct{}, func()) bool {
	return false
}

// Unpark has nothing to wake where nothing parks.
func (p *Parking) Unpark() {}
