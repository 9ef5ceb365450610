//go:build labnoreserve

package lab

// keepHeads is false in the lab's test-only build (-tags labnoreserve):
// the disk drops the heads the broker reserves, so that a topic's head
// after a crash is its newest stored seq, as it was before PopSub
// reserved seqs, and the checker has a reused seq to find.
const keepHeads = false
