package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// The hand-written reader is held to encoding/json: its seed corpora run
// in every plain go test; go test -fuzz=FuzzScan explores further.

// FuzzScan checks the hand-written reader against encoding/json:
// whatever frame it accepts, it reads exactly as encoding/json does.
func FuzzScan(f *testing.F) {
	for _, seed := range SeedFrames {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Frames are checked for UTF-8 before they are decoded.
		if !utf8.Valid(data) {
			return
		}
		fast, ok := Scan(data)
		if !ok {
			return
		}
		var slow Frame
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("Scan accepted %q, which encoding/json refuses: %v",
				data, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("frame %q: Scan read %+v, encoding/json %+v", data,
				fast, slow)
		}
	})
}

// FuzzScanValue checks the payload reader against json.Valid, both ways:
// what it accepts is valid JSON, and valid JSON it accepts, but null and
// a value nested deeper than maxDepth.
func FuzzScanValue(f *testing.F) {
	for _, seed := range []string{
		`{"a":[1,-0.5e+3,"\u00e9\n\"",true,false,null,{}]}`, `"\ud800"`,
		`01`, `1.`, `[1,]`, `{"a"}`, `"\x"`, `[[[]]]`, ` 1 `, `-`, `1e`,
		`tru`, `null`, `"a` + "\t" + `b"`, `[1 2]`, `{"a":1,}`, `-0`,
		`1E+2`, `"\u12G4"`, `"\/\b\f\r\t\\"`, `"\u00"`, `1.5e`, `-01`,
		`{"a":1 "b":2}`, `{1:2}`, `[true,fals]`, `"\`,
		strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) {
			return
		}
		s := scanner{data: data}
		value, ok := s.value()
		s.space()
		whole := ok && s.pos == len(data)
		trimmed := bytes.Trim(data, " \t\n\r")
		if whole && (!json.Valid(value) || !bytes.Equal(value, trimmed)) {
			t.Fatalf("accepted %q as %q, which is not one JSON value", data,
				value)
		}
		if !whole && json.Valid(data) && nesting(data) <= maxDepth &&
			!bytes.Equal(trimmed, []byte("null")) {
			t.Fatalf("refused %q, which is valid JSON", data)
		}
	})
}

// nesting is how deeply data nests brackets, counting those in strings
// too: an upper bound.
func nesting(data []byte) int {
	deepest, depth := 0, 0
	for _, c := range data {
		switch c {
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
		}
	}
	return deepest
}

func TestScan_TakesOnlyTheCommonShape(t *testing.T) {
	// The fast path must actually be taken for what clients send, or it
	// saves nothing; everything else must be left to encoding/json.
	fast := []string{
		`{"type":"publish","topic":"a/b","payload":{"k":[1,"]"]},"qos":1}`,
		`{"type":"ack","topic":"t","seq":18446744073709551615}`,
		` { "type" : "ack" , "topic" : "a/b" , "message_id" : "m" } `,
		`{"type":"publish","topic":"t","payload":"a \"quoted\" word"}`,
	}
	slow := []string{
		`{"type":"publish","topic":"a\/b","payload":1}`, // an escape
		`{"type":"ack","message_ids":["a"]}`,            // a list
		`{"type":"publish","topic":"t","payload":null}`, // null
		`{"type":"ack","topic":"t","seq":1.0}`,          // a float
		`{"type":"ack","topic":"t","seq":01}`,           // a leading zero
		`{"Type":"ping"}`,                               // another case
		`{"type":"ping","extra":1}`,                     // an unknown key
		`{"type":"ping"} {}`,                            // trailing data
		`{"type":"ack","seq":18446744073709551616}`,     // overflow
		`{"type":"auth","token":"x.y.z","batch":true}`,  // a rare frame
		`{"type":"publish","topic":"t","payload":` + // nested too deep
			strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
	}
	for _, data := range fast {
		if _, ok := Scan([]byte(data)); !ok {
			t.Errorf("Scan gave up on %s", data)
		}
	}
	for _, data := range slow {
		if _, ok := Scan([]byte(data)); ok {
			t.Errorf("Scan accepted %s", data)
		}
	}
	// What Scan leaves, encoding/json still reads.
	deep := slow[len(slow)-1]
	if f, err := Decode([]byte(deep)); err != nil || len(f.Payload) != 200 {
		t.Errorf("a payload nested too deep for Scan: %v", err)
	}
}

// BenchmarkScan and BenchmarkUnmarshal measure what Scan buys on the
// frame a publisher sends once per message.
func BenchmarkScan(b *testing.B) {
	data := []byte(benchFrame)
	for b.Loop() {
		if _, ok := Scan(data); !ok {
			b.Fatal("Scan gave up")
		}
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	data := []byte(benchFrame)
	for b.Loop() {
		var f Frame
		if err := json.Unmarshal(data, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// benchFrame is a publish with a 64-byte payload.
const benchFrame = `{"type":"publish","topic":"bench","qos":1,` +
	`"message_id":"0123456789abcdef","payload":"` +
	"0123456789012345678901234567890123456789012345678901234567890" + `"}`
