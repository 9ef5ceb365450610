//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package socket

import "syscall"

// wait returns once raw's socket has a byte to read, an end or an error,
// without reading it: it peeks, and while there is nothing the runtime's
// poller parks the goroutine right here, a few calls deep. With no raw
// socket it returns at once.
func wait(raw syscall.RawConn, peek []byte) error {
	if raw == nil {
		return nil
	}
	return raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), peek,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN
	})
}
