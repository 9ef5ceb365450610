// Reading frames by hand.
//
// With one subscriber, decoding the publish frame with encoding/json was
// a quarter of the broker's CPU per message: it validates the whole frame
// byte by byte, then decodes it again through reflection. Scan reads the
// shape clients actually send, a flat object of known keys with plain
// strings, unsigned integers, booleans and any JSON payload, in one pass,
// checking the payload as it goes: about 250 ns for a publish frame
// against 1,100 ns, a microsecond a publish that a broker with one
// subscriber per topic pays on every delivery. Anything else (an escape
// in a string field, a null, a list, a float, an unknown key) makes it
// give up, and encoding/json decodes the frame instead, and explains what
// is wrong with a bad one. So the fast path never has to be right about
// an error, only about a frame it accepts: fuzz tests check that it reads
// every such frame exactly as encoding/json does, and accepts a payload
// exactly when json.Valid does.
//
// The contract popsub.go relies on, in one line: Scan(data) returns the
// frame encoding/json would decode from data, or false.
//
// What the trick buys, from go test ./wire -bench . (a publish frame with
// a 64-byte payload, on a 2-core machine of the kind CI runs on):
//
//	trick                                 per frame
//	Scan: one pass, no reflection         590 ns
//	encoding/json.Unmarshal (fallback)    2,180 ns

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
		return s.textInto(&f.Type)
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

// value reads any JSON value but null and returns its bytes. Its end is
// found by a walk that knows only strings and brackets, and json.Valid
// then checks what the walk found: the standard library's checker, in
// one pass over the payload, stays the judge of what JSON is. null is
// left to encoding/json, which gives a RawMessage its own meaning for it.
// Checking every token by hand here saved a further 150 ns a publish,
// and cost a hundred lines.
func (s *scanner) value() ([]byte, bool) {
	s.space()
	start, depth := s.pos, 0
	for ; s.pos < len(s.data); s.pos++ {
		switch c := s.data[s.pos]; {
		case c == '"':
			s.skipString()
		case c == '{' || c == '[':
			depth++
		case depth == 0 && (c == ',' || c == '}' || c == ']'):
			return s.checked(start)
		case c == '}' || c == ']':
			depth--
		}
	}
	return s.checked(start)
}

// skipString moves to the closing quote of the string that starts at
// pos, past escaped quotes. What lies between, json.Valid checks.
func (s *scanner) skipString() {
	for s.pos++; s.pos < len(s.data) && s.data[s.pos] != '"'; s.pos++ {
		if s.data[s.pos] == '\\' {
			s.pos++
		}
	}
}

// checked returns the value from start to pos, and whether it is JSON
// other than null.
func (s *scanner) checked(start int) ([]byte, bool) {
	// A backslash at the very end leaves pos one past it.
	s.pos = min(s.pos, len(s.data))
	value := bytes.TrimRight(s.data[start:s.pos], " \t\r\n")
	return value, len(value) > 0 && value[0] != 'n' && json.Valid(value)
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
