// Package logbuf is the buffer tests give a logger, or a server's
// output, while they read it: a bytes.Buffer behind a lock, since the
// server's goroutines write as the test reads.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for writers and a reader at once. The
// zero value is empty and ready.
type Buffer struct {
	mu     sync.Mutex
	buffer bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.String()
}
