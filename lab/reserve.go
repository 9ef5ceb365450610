//go:build !labnoreserve

package lab

// keepHeads is true: the disk keeps the heads the broker reserves, so
// that a seq seen before a crash is never given out again.
const keepHeads = true
