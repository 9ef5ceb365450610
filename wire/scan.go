// Reading frames by hand.
//
// With one subscriber, decoding the publish frame with encoding/json was
// a quarter of the broker's CPU per message: it validates the whole frame
// byte by byte, then decodes it again through reflection. Scan reads the
// shape clients actually send, a flat object of known keys with plain
// strings, unsigned integers, booleans and any JSON payload, in one pass,
// checking the payload as it goes: a quarter of encoding/json's time for
// a publish frame, a microsecond a publish that a broker with one
// subscriber per topic pays on every delivery. Anything else (an escape
// in a string field, a null, a list, a float, an unknown key) makes it
// give up, and encoding/json decodes the frame instead, and explains what
// is wrong with a bad one. So the fast path never has to be right about
// an error, only about a frame it accepts: fuzz tests check that it reads
// every such frame exactly as encoding/json does, and accepts a payload
// exactly when json.Valid does (but for null, and one nested deeper than
// maxDepth, which it leaves to encoding/json).
//
// The contract popsub.go relies on, in one line: Scan(data) returns the
// frame encoding/json would decode from data, or false.
//
// What each trick buys, from go test ./wire -bench . (a publish frame with
// a 64-byte payload, on a 2-core machine of the kind CI runs on; each
// line's figures measured in one session):
//
//	trick                                 per frame
//	Scan: one pass, no reflection         590 ns, against 2,180 ns
//	                                      for encoding/json.Unmarshal
//	the payload checked by hand in the    246-262 ns, against 433-472 ns
//	same pass, not by json.Valid after    finding its end, then json.Valid

package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// scanner reads one frame from data, at pos. Every method that reads a
// token moves pos past it and reports whether it was what was wanted;
// none of them allocates but for the strings it returns.
type scanner struct {
	data []byte // the frame, valid UTF-8; the reader's buffer
	pos  int    // the next byte to read
}

// Scan decodes the common shape of a frame, or reports false: then
// encoding/json must decode it, and explain what is wrong with a bad one.
// data must be valid UTF-8, which the broker checks as it reads.
func Scan(data []byte) (Frame, bool) {
	// A frame is one object: keys and values separated by commas. An
	// empty object is a frame too, with no type, which the broker
	// refuses as it would any other.
	var f Frame
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

// field reads the value of key into f. Only the keys of publish and ack
// frames, the ones that come once per message, are read here; any other
// (auth's token, subscribe's after) reports false, and its rare frame
// goes to encoding/json.
func (s *scanner) field(f *Frame, key string) bool {
	// The keys are matched exactly, as they are sent: encoding/json also
	// takes "Type" for "type", and so such a frame goes to it.
	switch key {
	case "type":
		value, ok := s.text()
		f.Type = frameType(value)
		return ok
	case "topic":
		return s.textInto(&f.Topic)
	case "message_id":
		return s.textInto(&f.MessageID)
	case "seq":
		return s.numberInto(&f.Seq)
	case "qos":
		n, ok := s.number()
		f.QoS = int(n)
		return ok && n <= math.MaxInt32
	case "payload":
		// A copy, as encoding/json makes: data is the reader's buffer.
		value, ok := s.value()
		f.Payload = bytes.Clone(value)
		return ok
	}
	return false
}

// textInto reads a string into field.
func (s *scanner) textInto(field *string) bool {
	value, ok := s.text()
	*field = string(value)
	return ok
}

// frameType returns a frame's type as a string, with no allocation for
// the types a client sends once per message.
func frameType(value []byte) string {
	switch string(value) {
	case "publish":
		return "publish"
	case "ack":
		return "ack"
	}
	return string(value)
}

// numberInto reads an unsigned integer into field, which it allocates:
// a field that is absent stays nil.
func (s *scanner) numberInto(field **uint64) bool {
	n, ok := s.number()
	*field = &n
	return ok
}

// space skips JSON's whitespace.
func (s *scanner) space() {
	for s.pos < len(s.data) && blank[s.data[s.pos]] {
		s.pos++
	}
}

// blank marks JSON's whitespace, for a lookup as fast as a switch.
var blank = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

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
	// A string with an escape would have to be unescaped, and a control
	// character is an error to report: both are encoding/json's.
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
// leading zero, and no sign, fraction or exponent (end refuses what
// follows them); strconv refuses an overflow.
func (s *scanner) number() (uint64, bool) {
	// Digits first; whether they make a number JSON accepts is decided
	// after, from what they are and what follows them.
	s.space()
	start := s.pos
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		s.pos++
	}
	digits := s.data[start:s.pos]
	if len(digits) == 0 || digits[0] == '0' && len(digits) > 1 || !s.end() {
		return 0, false
	}
	n, err := strconv.ParseUint(string(digits), 10, 64)
	return n, err == nil
}

// end reports whether a number ended where a value may end: at the end
// of the data, at whitespace, or at the punctuation after a value.
// Without it, "12a" would read as 12.
func (s *scanner) end() bool {
	return s.pos == len(s.data) || blank[s.data[s.pos]] ||
		strings.IndexByte(",}]", s.data[s.pos]) >= 0
}

// value reads any JSON value but null and returns its bytes, checking
// it as it goes. Finding its end first and then calling json.Valid, the
// standard library's checker, was 5 % of the broker's CPU with one
// subscriber, and half of Scan's time (see the table above). null is
// left to encoding/json, which gives a RawMessage its own meaning for
// it, and so is a value nested deeper than maxDepth, so that no payload
// can make the checker recurse without bound.
func (s *scanner) value() ([]byte, bool) {
	s.space()
	start := s.pos
	if s.pos < len(s.data) && s.data[s.pos] == 'n' {
		return nil, false
	}
	ok := s.valid(0)
	return s.data[start:s.pos], ok
}

// maxDepth is how deeply value nests objects and arrays before it gives
// a payload to encoding/json.
const maxDepth = 64

// valid reads one JSON value and reports whether it is one, as
// json.Valid would: objects and arrays through the values they hold,
// strings through their escapes, numbers through JSON's grammar.
func (s *scanner) valid(depth int) bool {
	s.space()
	if s.pos >= len(s.data) || depth > maxDepth {
		return false
	}
	switch c := s.data[s.pos]; c {
	case '{', '[':
		s.pos++
		end := byte(c + 2) // '}' follows '{' by two, as ']' does '['
		if s.next(end) {
			return true
		}
		for {
			if c == '{' && (!s.validString() || !s.next(':')) ||
				!s.valid(depth+1) {
				return false
			}
			if s.next(end) {
				return true
			}
			if !s.next(',') {
				return false
			}
		}
	case '"':
		return s.validString()
	case 't', 'f', 'n':
		word := words[c]
		end := s.pos + len(word)
		if end > len(s.data) || string(s.data[s.pos:end]) != word {
			return false
		}
		s.pos = end
		return true
	}
	return s.validNumber()
}

// words are the literals, by their first byte.
var words = [256]string{'t': "true", 'f': "false", 'n': "null"}

// validString reads a string, with its escapes, and reports whether it
// is one. The data is valid UTF-8, so only control characters and
// escapes need a look.
func (s *scanner) validString() bool {
	if !s.next('"') {
		return false
	}
	for ; s.pos < len(s.data); s.pos++ {
		switch c := s.data[s.pos]; {
		case c == '"':
			s.pos++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if !s.validEscape() {
				return false
			}
		}
	}
	return false
}

// validEscape reads the escape after the backslash at pos, leaving pos
// on its last byte.
func (s *scanner) validEscape() bool {
	s.pos++
	if s.pos >= len(s.data) {
		return false
	}
	if s.data[s.pos] != 'u' {
		return strings.IndexByte(`"\\/bfnrt`, s.data[s.pos]) >= 0
	}
	if s.pos+4 >= len(s.data) {
		return false
	}
	for _, c := range s.data[s.pos+1 : s.pos+5] {
		if !isHex(c) {
			return false
		}
	}
	s.pos += 4
	return true
}

// isHex reports whether c is a hexadecimal digit.
func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// validNumber reads a number in JSON's grammar: an optional minus, 0 or
// digits not starting with 0, then an optional fraction and exponent.
func (s *scanner) validNumber() bool {
	s.skip('-')
	if !s.skip('0') && !s.digits() {
		return false
	}
	if s.skip('.') && !s.digits() {
		return false
	}
	if s.skip('e') || s.skip('E') {
		_ = s.skip('+') || s.skip('-')
		if !s.digits() {
			return false
		}
	}
	return true
}

// skip consumes c if it comes next, with no whitespace before it.
func (s *scanner) skip(c byte) bool {
	if s.pos < len(s.data) && s.data[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

// digits consumes one or more decimal digits.
func (s *scanner) digits() bool {
	start := s.pos
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		s.pos++
	}
	return s.pos > start
}

// Explain says what is wrong with a frame that did not decode, in the
// protocol's words rather than Go's: "field seq must be a whole number,
// 0 or more, not string".
func Explain(err error) string {
	var typeErr *json.UnmarshalTypeError
	switch {
	case !errors.As(err, &typeErr):
		return err.Error()
	case typeErr.Field == "":
		return "a frame must be a JSON object"
	}
	return fmt.Sprintf("field %s must be %s, not %s", typeErr.Field,
		kinds[typeErr.Type.String()], typeErr.Value)
}

// kinds names the frame's field types for Explain.
var kinds = map[string]string{"uint64": "a whole number, 0 or more",
	"int": "a whole number", "int64": "a whole number", "string": "a string", "bool": "true or false",
	"[]string": "a list of strings"}

// Decode decodes one frame, the common shape by hand (Scan) and anything
// else with encoding/json, or returns what is wrong with it in the
// protocol's words (Explain). Unknown fields are ignored, as the original
// PopSub did: a newer client may send fields an older broker does not
// know yet. data must be valid UTF-8, and is not kept.
func Decode(data []byte) (Frame, error) {
	if f, ok := Scan(data); ok {
		return f, nil
	}
	f, err := unmarshal(data)
	if err != nil {
		return f, errors.New(Explain(err))
	}
	return f, nil
}

// unmarshal decodes a frame with encoding/json. It is a function of its
// own so that only this path pays for the frame escaping to the heap.
func unmarshal(data []byte) (Frame, error) {
	var f Frame
	err := json.Unmarshal(data, &f)
	return f, err
}
