package popsub

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// This file holds the wire format written by hand, for the frames that
// come and go once per message: reading the common shape of an incoming
// frame, and writing a delivery, with the pooled buffers both use.
// encoding/json handles every other case; popsub.go decides when each is
// used.

// # Reading frames
//
// With one subscriber, decoding the publish frame with encoding/json was
// a quarter of the broker's CPU per message: it validates the whole frame
// byte by byte, then decodes it again through reflection. scanFrame reads
// the shape clients actually send, a flat object of known keys with
// plain strings, unsigned integers, booleans and any JSON payload, in one
// pass, checking the payload as it goes. Anything else (an escape in a
// string field, a null, a list, a float, an unknown key) makes it give
// up, and encoding/json decodes the frame instead, and explains what is
// wrong with a bad one. So the fast path never has to be right about an
// error, only about a frame it accepts: fuzz tests check that it reads
// every such frame exactly as encoding/json does, and accepts a payload
// exactly when json.Valid does.

// readBufferPool holds the buffers frames are read into, shared by every
// connection's reader.
var readBufferPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// recycle hands a read buffer back to the pool. One that grew past 64 KiB
// for a large frame is left to the garbage collector instead.
func recycle(buffer *bytes.Buffer) {
	if buffer.Cap() <= 64<<10 {
		readBufferPool.Put(buffer)
	}
}

// scanner reads one frame from data, at pos.
type scanner struct {
	data []byte
	pos  int
}

// scanFrame decodes the common shape of a frame, or reports false. data
// must be valid UTF-8, which connection.read checks.
func scanFrame(data []byte) (frame, bool) {
	var f frame
	s := scanner{data: data}
	if !s.next('{') {
		return f, false
	}
	if !s.next('}') {
		for more := true; more; more = s.next(',') {
			key, ok := s.text()
			if !ok || !s.next(':') || !s.field(&f, string(key)) {
				return f, false
			}
		}
		if !s.next('}') {
			return f, false
		}
	}
	// Nothing but whitespace may follow the object.
	s.space()
	return f, s.pos == len(data)
}

// field reads the value of key into f. A key outside the fast path's
// shape, message_ids for one, reports false.
func (s *scanner) field(f *frame, key string) bool {
	var ok bool
	switch key {
	case "type", "token", "client", "username", "password", "topic",
		"message_id", "durable":
		var value []byte
		if value, ok = s.text(); ok {
			*f.text(key) = string(value)
		}
	case "seq", "after", "last":
		var n uint64
		if n, ok = s.number(); ok {
			*f.number(key) = &n
		}
	case "qos":
		var n uint64
		n, ok = s.number()
		ok = ok && n <= math.MaxInt32
		f.QoS = int(n)
	case "batch":
		f.Batch, ok = s.boolean()
	case "payload":
		var value []byte
		// A copy, as encoding/json makes: data is the reader's buffer.
		if value, ok = s.value(); ok {
			f.Payload = bytes.Clone(value)
		}
	}
	return ok
}

// text returns the field of f that a string key names.
func (f *frame) text(key string) *string {
	switch key {
	case "type":
		return &f.Type
	case "token":
		return &f.Token
	case "client":
		return &f.Client
	case "username":
		return &f.Username
	case "password":
		return &f.Password
	case "topic":
		return &f.Topic
	case "message_id":
		return &f.MessageID
	}
	return &f.Durable
}

// number returns the field of f that an optional number key names.
func (f *frame) number(key string) **uint64 {
	switch key {
	case "seq":
		return &f.Seq
	case "after":
		return &f.After
	}
	return &f.Last
}

// space skips JSON's whitespace.
func (s *scanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// next consumes c, after any whitespace, if it comes next.
func (s *scanner) next(c byte) bool {
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

// text reads a string with no escapes and no control characters, and
// returns its bytes, which are then exactly its value.
func (s *scanner) text() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	start := s.pos
	for ; s.pos < len(s.data); s.pos++ {
		switch c := s.data[s.pos]; {
		case c == '"':
			s.pos++
			return s.data[start : s.pos-1], true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// number reads an unsigned integer in JSON's form: digits, with no
// leading zero, no sign, fraction or exponent, and no overflow.
func (s *scanner) number() (uint64, bool) {
	s.space()
	start := s.pos
	var n uint64
	for ; s.pos < len(s.data); s.pos++ {
		digit := uint64(s.data[s.pos] - '0')
		if s.data[s.pos] < '0' || digit > 9 {
			break
		}
		if n > (math.MaxUint64-digit)/10 {
			return 0, false
		}
		n = n*10 + digit
	}
	digits := s.pos - start
	if digits == 0 || (s.data[start] == '0' && digits > 1) {
		return 0, false
	}
	return n, s.end()
}

// boolean reads true or false.
func (s *scanner) boolean() (bool, bool) {
	s.space()
	if s.word("true") {
		return true, true
	}
	return false, s.word("false")
}

// end reports whether a number or a word ended where a value may end.
func (s *scanner) end() bool {
	if s.pos == len(s.data) {
		return true
	}
	switch s.data[s.pos] {
	case ' ', '\t', '\n', '\r', ',', '}', ']':
		return true
	}
	return false
}

// value reads any JSON value but null, checking it as it goes, and
// returns its bytes. null is left to encoding/json, which gives a
// RawMessage its own meaning for it. Counting brackets to find the end
// and then calling json.Valid was simpler, and read the payload twice.
func (s *scanner) value() ([]byte, bool) {
	s.space()
	start := s.pos
	if s.pos < len(s.data) && s.data[s.pos] == 'n' {
		return nil, false
	}
	ok := s.skip(0)
	return s.data[start:s.pos], ok
}

// maxDepth is the deepest nesting the fast path reads; deeper payloads go
// to encoding/json, whose own limit is ten times this.
const maxDepth = 1000

// skip moves past one JSON value, at nesting depth, and reports whether
// it was valid JSON.
func (s *scanner) skip(depth int) bool {
	s.space()
	if s.pos == len(s.data) || depth > maxDepth {
		return false
	}
	switch s.data[s.pos] {
	case '{':
		return s.skipAll(depth, '}', func() bool {
			return s.skipString() && s.next(':') && s.skip(depth+1)
		})
	case '[':
		return s.skipAll(depth, ']', func() bool { return s.skip(depth + 1) })
	case '"':
		return s.skipString()
	case 't':
		return s.word("true")
	case 'f':
		return s.word("false")
	case 'n':
		return s.word("null")
	}
	return s.skipNumber()
}

// skipAll moves past an object or an array: an opening bracket, its
// members separated by commas, each read by member, and the closing
// bracket.
func (s *scanner) skipAll(depth int, closing byte, member func() bool) bool {
	s.pos++
	if s.next(closing) {
		return true
	}
	for member() {
		if !s.next(',') {
			return s.next(closing)
		}
	}
	return false
}

// skipString moves past a string, checking its escapes; data is valid
// UTF-8 already.
func (s *scanner) skipString() bool {
	if !s.next('"') {
		return false
	}
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		s.pos++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\' && s.pos < len(s.data):
			escape := s.data[s.pos]
			s.pos++
			if escape == 'u' {
				if !s.hex4() {
					return false
				}
			} else if !strings.ContainsRune(`"\\/bfnrt`, rune(escape)) {
				return false
			}
		case c == '\\':
			return false
		}
	}
	return false
}

// hex4 moves past the four hex digits of a \u escape.
func (s *scanner) hex4() bool {
	if len(s.data)-s.pos < 4 {
		return false
	}
	for _, c := range s.data[s.pos : s.pos+4] {
		if !strings.ContainsRune("0123456789abcdefABCDEF", rune(c)) {
			return false
		}
	}
	s.pos += 4
	return true
}

// skipNumber moves past a number in JSON's grammar: an optional minus,
// an integer part with no leading zero, then an optional fraction and
// exponent.
func (s *scanner) skipNumber() bool {
	s.accept("-")
	if !s.accept("0") && s.digits() == 0 {
		return false
	}
	if s.accept(".") && s.digits() == 0 {
		return false
	}
	if s.accept("eE") {
		s.accept("+-")
		if s.digits() == 0 {
			return false
		}
	}
	return s.end()
}

// accept moves past the next byte if it is one of set.
func (s *scanner) accept(set string) bool {
	if s.pos < len(s.data) && strings.IndexByte(set, s.data[s.pos]) >= 0 {
		s.pos++
		return true
	}
	return false
}

// digits moves past decimal digits and returns how many there were.
func (s *scanner) digits() int {
	start := s.pos
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		s.pos++
	}
	return s.pos - start
}

// word moves past a literal such as true.
func (s *scanner) word(literal string) bool {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(literal)) {
		return false
	}
	s.pos += len(literal)
	return s.end()
}

// # Writing deliveries
//
// A delivery is encoded once per message, by hand, and the same bytes go
// to every subscriber (Broker.fanOut): encoding/json would cost several
// times as much, once per subscriber.

// appendDelivery appends the message frame for m at attempt. It is
// written by hand because it runs once per publish and once per retry,
// and encoding/json costs several times as much. Field order and names
// are the original's, with seq and attempt added at the end.
func appendDelivery(buf []byte, m *Message, attempt int) []byte {
	// Topic and id are escaped; the payload is copied as it is, because
	// it was validated and compacted when it was published. Room for all
	// of it is made at once, so the frame is one allocation.
	buf = slices.Grow(buf, 128+len(m.Topic)+len(m.ID)+len(m.Payload))
	buf = append(buf, `{"type":"message","topic":`...)
	buf = appendString(buf, m.Topic)
	buf = append(buf, `,"payload":`...)
	buf = append(buf, m.Payload...)
	buf = append(buf, `,"timestamp":`...)
	buf = strconv.AppendInt(buf, m.Timestamp, 10)
	buf = append(buf, `,"message_id":`...)
	buf = appendString(buf, m.ID)
	buf = append(buf, `,"qos":`...)
	buf = strconv.AppendInt(buf, int64(m.QoS), 10)
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendUint(buf, m.Seq, 10)
	buf = append(buf, `,"attempt":`...)
	buf = strconv.AppendInt(buf, int64(attempt), 10)
	return append(buf, '}')
}

// appendPublished appends the published frame that confirms m, a QoS 1
// publish, at seq: by hand, like a delivery, because every QoS 1 publish
// gets one. The fields are in the order encoding/json would give them.
func appendPublished(buf []byte, m *Message, seq uint64,
	duplicate bool) []byte {
	buf = slices.Grow(buf, 64+len(m.Topic)+len(m.ID))
	buf = append(buf, `{"type":"published","topic":`...)
	buf = appendString(buf, m.Topic)
	buf = append(buf, `,"message_id":`...)
	buf = appendString(buf, m.ID)
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendUint(buf, seq, 10)
	if duplicate {
		buf = append(buf, `,"duplicate":true`...)
	}
	return append(buf, '}')
}

// appendString appends s as a JSON string. s is valid UTF-8: every frame
// is checked on arrival, so only quotes, backslashes and control
// characters need escaping.
func appendString(buf []byte, s string) []byte {
	// Bytes of 0x80 and above are parts of valid UTF-8 sequences and go
	// through unchanged; JSON allows them as they are.
	const hexDigits = "0123456789abcdef"
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20:
			buf = append(buf, '\\', 'u', '0', '0', hexDigits[c>>4],
				hexDigits[c&0xf])
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}

// writeBuffers are a writer's batch of frames and the buffer it joins
// them in. They are pooled, shared by every connection's writer: a writer
// exits whenever its outbox empties, and growing new ones for each run
// cost more CPU than the run's writes did.
type writeBuffers struct {
	batch  [][]byte
	joined []byte
}

// writeBufferPool holds the writeBuffers of writers that have exited.
var writeBufferPool = sync.Pool{New: func() any { return new(writeBuffers) }}

// release returns the buffers to the pool, holding no frame.
func (w *writeBuffers) release() {
	clear(w.batch[:cap(w.batch)])
	writeBufferPool.Put(w)
}
