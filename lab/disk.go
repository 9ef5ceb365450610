package lab

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/memlog"
)

// # The disk
//
// Disk is the lab's storage engine, a disk as a learner pictures one. A
// commit is first written (into the kernel's page cache: buffered), then
// synced, and only then does Commit return, as the Store contract asks:
// a confirm leaves after the sync. A kill -9 keeps what was written,
// synced or not, since the page cache outlives the process; a power cut
// keeps only what was synced. The broker that used a disk is gone once
// either happens: its commits under way fail, and the next broker starts
// on what the disk kept.

// syncTime is how long a sync takes in the lab: long enough to see a
// batch wait for it.
const syncTime = 40 * time.Millisecond

// contents are a disk's topic logs, heads and durable cursors, kept by
// package memlog, the engine under the broker's tests too.
type contents = memlog.Contents[*popsub.Message]

// newContents returns an empty disk's contents.
func newContents() contents { return memlog.NewContents(placeOf) }

// placeOf tells memlog where m goes.
func placeOf(m *popsub.Message) memlog.Record {
	log, seq := m.Releases()
	return memlog.Record{Topic: m.Topic, Seq: m.Seq, Size: len(m.Payload),
		Releases: log, Released: seq}
}

// Disk is the lab's Store.
type Disk struct {
	// gate holds commits while the broker is paused.
	gate *gate
	// written hears of each write and sync, for the page.
	written func(what string, b *popsub.Batch)

	mu sync.Mutex
	// synced is what a power cut keeps; buffered what a write put in
	// the page cache and no sync has reached yet, in order.
	synced   contents
	buffered []*popsub.Batch
	// gone is set once the process using the disk died.
	gone bool
	// slow is how long each write takes while the disk is failing (the
	// "slow" fault); zero while it is well.
	slow time.Duration
	// lies is set while the disk says it synced what it only wrote (the
	// "lie" fault): a drive whose write cache acknowledges a flush.
	lies bool
}

// errGone is what a dead broker's commit gets.
var errGone = errors.New("the broker using this disk is gone")

// Commit writes the batch, waits for the sync, and applies it.
func (d *Disk) Commit(b *popsub.Batch) error {
	d.gate.wait()
	d.stall()
	d.mu.Lock()
	if d.gone {
		d.mu.Unlock()
		return errGone
	}
	d.buffered = append(d.buffered, b)
	d.mu.Unlock()
	d.written("write", b)
	time.Sleep(syncTime)
	d.gate.wait()
	d.mu.Lock()
	if d.gone {
		d.mu.Unlock()
		return errGone
	}
	if d.lies { // the write stays in the page cache
		d.mu.Unlock()
		d.written("lie", b)
		return nil
	}
	d.synced.Apply(b, keepHeads)
	d.buffered = slices.DeleteFunc(d.buffered,
		func(o *popsub.Batch) bool { return o == b })
	d.mu.Unlock()
	d.written("sync", b)
	return nil
}

// stall waits as long as a write takes on a failing disk.
func (d *Disk) stall() {
	d.mu.Lock()
	slow := d.slow
	d.mu.Unlock()
	time.Sleep(slow)
}

// fail makes each write take slow from now on, and each sync a lie if
// lies; zero and false heal the disk.
func (d *Disk) fail(slow time.Duration, lies bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.slow, d.lies = slow, lies
}

// write puts a batch in the page cache and returns, as sled's insert
// does: flush syncs it. The article's broker stores with it.
func (d *Disk) write(b *popsub.Batch) {
	d.gate.wait()
	d.stall()
	d.mu.Lock()
	if d.gone {
		d.mu.Unlock()
		return
	}
	d.buffered = append(d.buffered, b)
	d.mu.Unlock()
	d.written("write", b)
}

// flush syncs every write in the page cache.
func (d *Disk) flush() {
	d.gate.wait()
	d.mu.Lock()
	pending := slices.Clone(d.buffered)
	d.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	time.Sleep(syncTime)
	d.mu.Lock()
	if d.gone {
		d.mu.Unlock()
		return
	}
	if d.lies {
		d.mu.Unlock()
		d.written("lie", joined(pending))
		return
	}
	for _, b := range pending {
		d.synced.Apply(b, keepHeads)
	}
	d.buffered = slices.DeleteFunc(d.buffered, func(b *popsub.Batch) bool {
		return slices.Contains(pending, b)
	})
	d.mu.Unlock()
	d.written("sync", joined(pending))
}

// joined is batches as one, for the page's line.
func joined(batches []*popsub.Batch) *popsub.Batch {
	all := &popsub.Batch{}
	for _, b := range batches {
		all.Messages = append(all.Messages, b.Messages...)
	}
	return all
}

// view is what reads see: the synced contents and the page cache's.
// It is the synced contents themselves when nothing waits for a sync,
// as is usual: read it, never change it.
func (d *Disk) view() contents {
	if len(d.buffered) == 0 {
		return d.synced
	}
	v := d.synced.Clone()
	for _, b := range d.buffered {
		v.Apply(b, keepHeads)
	}
	return v
}

// Read returns up to limit messages of topic after seq.
func (d *Disk) Read(topic string, after uint64, limit,
	maxBytes int) ([]*popsub.Message, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.view().Read(topic, after, limit, maxBytes), nil
}

// Topics returns each topic's head.
func (d *Disk) Topics() (map[string]uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.view().Heads), nil
}

// Cursor returns a durable cursor.
func (d *Disk) Cursor(key string) (uint64, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	position, ok := d.view().Cursors[key]
	return position, ok, nil
}

// Close does nothing: the lab's disk outlives its brokers.
func (d *Disk) Close() error { return nil }

// after returns the disk the next broker starts on, once the process
// using d dies: with the page cache's writes (a kill) or without (a
// power cut).
func (d *Disk) after(powerCut bool) *Disk {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gone = true
	kept := d.synced.Clone()
	if !powerCut {
		kept = d.view().Clone()
	}
	return &Disk{gate: d.gate, written: d.written, synced: kept,
		slow: d.slow, lies: d.lies}
}

// picture returns each topic's messages as the disk holds them, synced
// or only written, with the topic's head, and the durable cursors.
func (d *Disk) picture() (logs map[string][]diskMessage,
	heads, cursors map[string]uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.view()
	logs = map[string][]diskMessage{}
	synced := map[*popsub.Message]bool{}
	for _, log := range d.synced.Logs {
		for _, m := range log {
			synced[m] = true
		}
	}
	for topic, log := range v.Logs {
		for _, m := range log {
			logs[topic] = append(logs[topic], diskMessage{m, synced[m]})
		}
	}
	return logs, maps.Clone(v.Heads), maps.Clone(v.Cursors)
}

// diskMessage is a message on the disk, and whether it is synced.
type diskMessage struct {
	*popsub.Message
	synced bool
}
