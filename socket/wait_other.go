//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package socket

import "syscall"

// wait returns at once where the socket cannot be peeked at; the read
// that follows waits instead, holding its chunk.
func wait(syscall.RawConn) error { return nil }
